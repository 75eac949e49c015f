"""The MCP tools end to end, driven by the official SDK's own clients against a real daemon on CPU.

Over stdio the client spawns ``kz mcp --url http://127.0.0.1:PORT`` (the tools talk to the
daemon's HTTP API); over streamable HTTP it talks to the daemon's own ``/mcp/``. Each
walks the agent's loop: list the kernels, read the current best's files and contract,
validate, submit the CPU example and follow it to ``accepted`` (the test plays the runner
by hand, as the HTTP API tests do), then read the logs and the ranking.
"""
from __future__ import annotations

import base64
import json
import os
import shutil
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from tests.helpers.http_server import CPU_AXPY, EXAMPLES, package_tarball
from tests.helpers.live_api import live_server, result_doc

ROOT = Path(__file__).resolve().parents[1]
OPERATOR = "cpu/Elementwise/Axpy/fp32"
live = live_server("mcp")


def _structured(result) -> dict:
    assert not result.is_error, result.content
    return result.structured_content


def _play_runner(live, uuid: str, latency: float) -> None:
    """Claim the job as runner r1 and report a passing result (what a CPU runner would send)."""
    with live.client("runner:r1") as runner:
        claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
        assert claim["uuid"] == uuid
        body = {"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY, latency),
                "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None,
                "log_tails": {"build": "built\n", "benchmark": "timed 3 cases\n"}}
        assert runner.post(f"/api/submissions/{uuid}/result", json=body).status_code == 200


async def _follow(session: ClientSession, uuid: str) -> dict:
    """get_submission with wait_s until the submission is terminal."""
    for _ in range(20):
        doc = _structured(await session.call_tool("get_submission", {"uuid": uuid, "wait_s": 5}))
        if doc["terminal"]:
            return doc
    raise AssertionError(f"{uuid} never finished: {doc}")


async def _read_the_board(session: ClientSession) -> str:
    """The read side of the loop; returns the current best's commit."""
    await session.initialize()
    names = {t.name for t in (await session.list_tools()).tools}
    assert {"list_operators", "list_kernels", "get_kernel_contract", "get_current_best", "read_kernel_file",
            "validate_package", "submit_package", "get_submission", "get_submission_logs", "get_ranking"} <= names
    kernels = _structured(await session.call_tool("list_kernels", {"op_class": "Elementwise"}))
    assert [k["kernel_id"] for k in kernels["kernels"]] == [CPU_AXPY]
    operators = _structured(await session.call_tool("list_operators", {}))["operators"]
    assert OPERATOR in [o["operator"] for o in operators]
    contract = _structured(await session.call_tool("get_kernel_contract", {"kernel_id": CPU_AXPY}))
    assert contract["desc"]["category"]["arch"] == "cpu"
    assert [m["test_case_id"] for m in contract["metas"]] == ["n4k", "n64k", "n1m"]
    best = _structured(await session.call_tool("get_current_best", {"kernel_id": CPU_AXPY}))
    files = {f["path"]: f for f in best["files"]}
    # the example's source as the kernel's newest record holds it (a test before this one may have tuned it)
    assert files["src/axpy.py"]["text"].startswith((EXAMPLES / CPU_AXPY / "src" / "axpy.py").read_text())
    assert best["bench_result"]["kernel_id"] == CPU_AXPY and len(best["commit"]) == 40
    missing = await session.call_tool("read_kernel_file", {"kernel_id": CPU_AXPY, "path": "src/nope.py"})
    assert missing.is_error and "NOT_FOUND" in missing.content[0].text
    return best["commit"]


async def _after_accept(session: ClientSession, uuid: str, submitter: str, before: str) -> None:
    """Logs, ranking and the new best after an accept."""
    logs = _structured(await session.call_tool("get_submission_logs", {"uuid": uuid}))
    assert logs["benchmark"] == "timed 3 cases\n" and logs["failure"] is None
    ranking = _structured(await session.call_tool("get_ranking", {"operator": CPU_AXPY}))
    assert ranking["operator"] == OPERATOR
    n4k = next(c for c in ranking["cases"] if c["test_case_id"] == "n4k")
    assert n4k["standings"][0]["kernel_id"] == CPU_AXPY and n4k["standings"][0]["submitter"] == submitter
    best = _structured(await session.call_tool("get_current_best", {"kernel_id": CPU_AXPY}))
    assert best["commit"] != before and best["record"]["step"] == "scorecard"
    assert best["cases"][0]["best_by"] == submitter


def test_stdio_server_walks_the_loop_against_the_http_api(live, tmp_path):
    package = tmp_path / "repo" / CPU_AXPY  # the example, edited as an agent would, in a kernel repo of its own
    shutil.copytree(EXAMPLES / CPU_AXPY, package, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "repo" / ".kernel_zoo_root").touch()
    (package / "src" / "axpy.py").write_text((package / "src" / "axpy.py").read_text() + "\n# tuned\n")
    broken = tmp_path / "broken"
    shutil.copytree(package, broken)
    (broken / ".kernel_package" / "desc.yaml").unlink()
    env = {k: v for k, v in os.environ.items() if not k.startswith("KZ_")}
    env["PYTHONPATH"] = str(ROOT)
    params = StdioServerParameters(command=sys.executable, cwd=str(ROOT), env=env,
                                   args=["-m", "kz_daemon", "mcp", "--url", live.url, "--submitter", "mallory"])

    async def main() -> None:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            before = await _read_the_board(session)
            report = _structured(await session.call_tool("validate_package", {"path": str(package)}))
            assert report["valid"] is True and report["facts"]["kernel_id"] == CPU_AXPY
            bad = _structured(await session.call_tool("validate_package", {"path": str(broken)}))
            assert bad["valid"] is False and "FILE_MISSING" in [p["code"] for p in bad["problems"]]
            created = _structured(await session.call_tool("submit_package", {"path": str(package)}))
            assert created["status"] == "queued" and created["submitter_id"] == "mallory"
            await anyio.to_thread.run_sync(_play_runner, live, created["uuid"], 3.0)
            done = await _follow(session, created["uuid"])
            assert done["status"] == "accepted" and len(done["commit_sha"]) == 40
            await _after_accept(session, created["uuid"], "mallory", before)
            refused = await session.call_tool("submit_package", {"path": str(broken)})
            assert refused.is_error and "VALIDATION_ERROR" in refused.content[0].text

    anyio.run(main)


def test_streamable_http_endpoint_walks_the_loop_on_the_service_layer(live):
    tuned = package_tarball(CPU_AXPY, mutate=lambda files: files.update(
        {"src/axpy.py": files["src/axpy.py"] + b"\n# tuned over http\n"}))
    wrong = package_tarball("wrong", CPU_AXPY)

    async def main() -> None:
        async with httpx2.AsyncClient(headers={"X-Submitter-Id": "oscar"}, timeout=60) as http, \
                streamable_http_client(live.url + "/mcp/", http_client=http) as streams, \
                ClientSession(streams[0], streams[1]) as session:
            before = await _read_the_board(session)
            tools = {t.name: t for t in (await session.list_tools()).tools}
            assert "path" not in tools["validate_package"].input_schema["properties"]  # no server paths over HTTP
            encoded = base64.b64encode(tuned).decode()
            report = _structured(await session.call_tool("validate_package", {"tarball_base64": encoded}))
            assert report["valid"] is True
            bad = _structured(await session.call_tool("validate_package",
                                                      {"tarball_base64": base64.b64encode(wrong).decode()}))
            assert [p["code"] for p in bad["problems"]] == ["TARBALL_TOP_DIR"]
            created = _structured(await session.call_tool("submit_package", {"tarball_base64": encoded}))
            assert created["status"] == "queued" and created["submitter_id"] == "oscar"
            assert created["kernel_id"] == CPU_AXPY
            await anyio.to_thread.run_sync(_play_runner, live, created["uuid"], 2.0)
            done = await _follow(session, created["uuid"])
            assert done["status"] == "accepted"
            await _after_accept(session, created["uuid"], "oscar", before)
            limited = await session.call_tool("submit_package", {"tarball_base64": "not base64!"})
            assert limited.is_error and "BAD_REQUEST" in limited.content[0].text

    anyio.run(main)
    with live.client() as anon:  # the endpoint's answers are JSON-RPC, and an unknown method is refused
        resp = anon.post("/mcp/", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                         headers={"Accept": "application/json, text/event-stream"})
        assert resp.status_code == 200, resp.text
        assert "submit_package" in json.dumps(resp.json())


@pytest.mark.parametrize("args", [["--url", "ftp://nowhere"]])
def test_kz_mcp_refuses_a_bad_url(args, capsys):
    from kz_daemon.cli import main

    assert main(["mcp", *args]) == 2
    assert "kz mcp:" in capsys.readouterr().err
