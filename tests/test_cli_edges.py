"""The submitter's command-line edges of ``kz submit``: kernel_id messages, the idempotency key,
what a failed submission prints, and ``--json`` keeping stdout one document.

A small stdlib HTTP server on 127.0.0.1 plays the zoo where the test must choose the
server's answers (a 503 on the first upload, status documents carrying ``log_tails``
and ``queue_warning``); ``kz submit`` itself runs for real, through the ``kz`` dispatcher.
"""
from __future__ import annotations

import json
import shutil
import threading
import uuid as uuidlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kz_daemon.cli import main
from kz_runner.contract.checks import HINTS as RESULT_HINTS
from tests.helpers.http_server import CPU_AXPY, EXAMPLES, package_tarball

SUB_UUID = "5b0a7c1e-0000-4000-8000-000000000001"


class FakeZoo(ThreadingHTTPServer):
    """Answers the upload (503 for the first ``fail_uploads``) and the status polls from ``statuses``."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.uploads: list[dict[str, str]] = []
        self.fail_uploads = 0
        self.statuses: list[dict] = [{"uuid": SUB_UUID, "status": "accepted", "cases": [], "reasons": []}]
        self.polls = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: FakeZoo

    def log_message(self, *args) -> None:  # keep the test output clean
        pass

    def _json(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.server.uploads.append({k.lower(): v for k, v in self.headers.items()})
        if len(self.server.uploads) <= self.server.fail_uploads:
            self._json(503, {"error": {"code": "UNAVAILABLE", "message": "try again"}})
            return
        self._json(202, {"uuid": SUB_UUID, "status": "queued", "kernel_id": CPU_AXPY})

    def do_GET(self) -> None:
        docs = self.server.statuses
        doc = docs[min(self.server.polls, len(docs) - 1)]
        self.server.polls += 1
        self._json(200, doc)


@pytest.fixture()
def fake():
    server = FakeZoo()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture()
def tarball(tmp_path) -> Path:
    path = tmp_path / "package.tar.gz"
    path.write_bytes(package_tarball(CPU_AXPY))
    return path


def _submit(capsys, *args: str) -> tuple[int, str, str]:
    code = main(["submit", *args, "--submitter", "alice"])
    out = capsys.readouterr()
    return code, out.out, out.err


# --- the idempotency key ------------------------------------------------------------------

def test_upload_carries_one_uuid4_key_reused_on_its_retry(fake, tarball, capsys):
    fake.fail_uploads = 1
    code, _out, err = _submit(capsys, str(tarball), "--server", fake.url)
    assert code == 0, err
    keys = [u.get("idempotency-key") for u in fake.uploads]
    assert len(keys) == 2 and keys[0] == keys[1]
    assert uuidlib.UUID(keys[0]).version == 4
    assert _submit(capsys, str(tarball), "--server", fake.url)[0] == 0
    assert fake.uploads[-1]["idempotency-key"] != keys[0]  # a new invocation, a new key


def test_idempotency_key_can_be_given(fake, tarball, capsys):
    code, _out, err = _submit(capsys, str(tarball), "--server", fake.url, "--idempotency-key", "ci-run-42")
    assert code == 0, err
    assert [u["idempotency-key"] for u in fake.uploads] == ["ci-run-42"]
    code, _out, err = _submit(capsys, str(tarball), "--server", fake.url, "--idempotency-key", "ключ")
    assert code == 2 and "idempotency key" in err and len(fake.uploads) == 1  # not printable ASCII
    code, _out, err = _submit(capsys, str(tarball), "--server", fake.url, "--idempotency-key", "two words")
    assert code == 0, err  # the server takes a space (1-128 of space to ~): so does kz submit
    assert [u["idempotency-key"] for u in fake.uploads] == ["ci-run-42", "two words"]
    code, _out, err = _submit(capsys, str(tarball), "--server", fake.url, "--idempotency-key", "k" * 129)
    assert code == 2 and "1-128" in err and len(fake.uploads) == 2  # the server's limit, said locally


# --- what a failure prints ------------------------------------------------------------------

REJECTED = {
    "uuid": SUB_UUID, "status": "rejected", "terminal": True, "kernel_id": CPU_AXPY,
    "cases": [{"test_case_id": "n4k", "correctness": "failed", "accept": False,
               "primary_metric": "latency_us", "value": 3.5}],
    "reasons": [{"stage": "result", "code": "BUILD_FAILED", "message": "build_test_env.py exited 1",
                 "hint": "run kz dry-run to see the build fail locally"},
                {"stage": "result", "code": "PACKAGE_REJECTED", "message": "overall.accept is false"},
                {"stage": "result", "code": "RESULT_KERNEL_ID", "message": "kernel_id is 'x'"}],
    "log_tails": {"build": "Traceback (most recent call last):\nImportError: no module named cupy\n",
                  "benchmark": ""},
}
WAITING = {"uuid": SUB_UUID, "status": "queued", "terminal": False, "reasons": [], "cases": [],
           "queue_warning": {"code": "NO_RUNNER_FOR_ARCH", "message": "no runner for arch cpu has been seen"}}


def test_a_rejection_prints_reasons_with_hints_and_the_log_tails(fake, tarball, capsys):
    fake.statuses = [WAITING, WAITING, WAITING, REJECTED]
    code, out, err = _submit(capsys, str(tarball), "--server", fake.url)
    assert code == 1
    lines = out.splitlines()
    at = lines.index("reason: BUILD_FAILED: build_test_env.py exited 1")
    assert lines[at + 1] == "  hint: run kz dry-run to see the build fail locally"
    assert lines[at + 2] == "reason: PACKAGE_REJECTED: overall.accept is false"
    assert not lines[at + 3].startswith("  hint:")  # no hint sent, none known for the code
    at = lines.index("reason: RESULT_KERNEL_ID: kernel_id is 'x'")  # no hint sent: the contract's advice
    assert lines[at + 1] == f"  hint: {RESULT_HINTS['RESULT_KERNEL_ID']}"
    at = lines.index("--- build log (last lines) ---")
    assert lines[at + 1:at + 3] == ["Traceback (most recent call last):", "ImportError: no module named cupy"]
    assert "benchmark log" not in out  # an empty tail is not shown


def test_a_queue_warning_is_printed_once_to_stderr(fake, tarball, capsys):
    fake.statuses = [WAITING, WAITING, WAITING, REJECTED]
    code, out, err = _submit(capsys, str(tarball), "--server", fake.url)
    assert code == 1 and fake.polls == 4
    line = "warning: NO_RUNNER_FOR_ARCH: no runner for arch cpu has been seen"
    assert err.count(line) == 1 and line not in out
    fake.polls = 0
    code, out, err = _submit(capsys, str(tarball), "--server", fake.url, "--json")
    assert err.count(line) == 1  # with --json too, on stderr
    assert json.loads(out)["log_tails"]["build"].startswith("Traceback")


@pytest.mark.parametrize("case", ["verdict", "local", "network", "usage"])
def test_json_keeps_stdout_one_document_whatever_happens(fake, tarball, tmp_path, capsys, case):
    fake.statuses = [WAITING, REJECTED]
    server = fake.url
    path = str(tarball)
    extra: list[str] = []
    if case == "local":
        extra = ["--kernel-id", "cpu/Elementwise/Axpy/fp32/other"]
    elif case == "network":
        server = "http://127.0.0.1:9"
    elif case == "usage":
        path = str(tmp_path / "missing")
    code, out, err = _submit(capsys, path, "--server", server, "--json", "--timeout", "5", *extra)
    doc = json.loads(out)  # exactly one document, nothing else
    expected = {"verdict": (1, "rejected"), "local": (1, "rejected"), "network": (2, "error"),
                "usage": (2, "error")}[case]
    assert (code, doc["status"]) == expected, err


# --- kernel_id messages -------------------------------------------------------------------

def _package_dir(tmp_path: Path, with_bench_result: bool) -> Path:
    dest = tmp_path / "somewhere" / "my_kernel"
    shutil.copytree(EXAMPLES / CPU_AXPY, dest, ignore=shutil.ignore_patterns("__pycache__"))
    if not with_bench_result:
        (dest / ".kernel_package" / "bench_result.yaml").unlink()
    return dest


def test_a_directory_whose_kernel_id_cannot_be_told_says_pass_kernel_id_and_what_was_tried(tmp_path, capsys):
    pkg = _package_dir(tmp_path, with_bench_result=False)
    code, out, err = _submit(capsys, str(pkg), "--server", "http://127.0.0.1:9")
    assert code == 1
    assert "pass --kernel-id" in err and "nothing was uploaded" in err
    assert "bench_result.yaml does not exist" in err
    assert "no kernel repo root (.kernel_zoo_root or .git)" in err
    code, out, _err = _submit(capsys, str(pkg), "--server", "http://127.0.0.1:9", "--json")
    doc = json.loads(out)
    assert code == 1 and doc["problems"][0]["code"] == "KERNEL_ID_UNKNOWN" and "tried" in doc["message"]


def test_a_kernel_id_differing_from_the_tarballs_top_folder_names_both(tarball, capsys):
    other = "cpu/Elementwise/Axpy/fp32/other_name"
    code, _out, err = _submit(capsys, str(tarball), "--server", "http://127.0.0.1:9", "--kernel-id", other)
    assert code == 1
    assert (f"--kernel-id {other} differs from the tarball's top folder {CPU_AXPY}: "
            f"pass --kernel-id {CPU_AXPY} (or leave it out), or repack the tarball under {other}/") in err


@pytest.mark.parametrize("bad", ["cpu/Elementwise/Axpy/fp32/has space", "cpu//Axpy", "/cpu/x/y/z/w"])
def test_an_invalid_kernel_id_is_worded_as_kz_validate_words_it(tmp_path, tarball, capsys, bad):
    pkg = _package_dir(tmp_path, with_bench_result=True)
    assert main(["validate", str(pkg), "--kernel-id", bad]) == 1
    validate_lines = {ln for ln in capsys.readouterr().out.splitlines() if "KERNEL_ID_INVALID" in ln}
    assert validate_lines
    for path in (pkg, tarball):
        code, _out, err = _submit(capsys, str(path), "--server", "http://127.0.0.1:9", "--kernel-id", bad)
        assert code == 1
        submit_lines = {ln.strip() for ln in err.splitlines() if "KERNEL_ID_INVALID" in ln}
        assert submit_lines == validate_lines


def test_a_copied_package_whose_bench_result_names_the_original_is_not_sent_to_the_original(tmp_path, capsys):
    # kz validate calls the copy invalid; kz pack and kz submit used to trust bench_result.yaml's
    # kernel_id and sent the copy to the original's kernel, where it could replace its record
    pkg = _package_dir(tmp_path, with_bench_result=True)
    assert main(["validate", str(pkg)]) == 1
    assert "BENCH_KERNEL_ID_MISMATCH" in capsys.readouterr().out
    code, _out, err = _submit(capsys, str(pkg), "--server", "http://127.0.0.1:9")
    assert code == 1 and "nothing was uploaded" in err
    assert f"names '{CPU_AXPY}', but the folder's path {pkg.resolve()} does not end with it" in err
    assert main(["pack", str(pkg), "-o", str(tmp_path / "p.tar.gz")]) == 2
    assert "BENCH_KERNEL_ID_MISMATCH" in capsys.readouterr().err and not (tmp_path / "p.tar.gz").exists()
    # the same copy under a path that ends with the kernel_id it names packs as that kernel
    right = tmp_path / "elsewhere" / CPU_AXPY
    shutil.copytree(pkg, right)
    assert main(["pack", str(right), "-o", str(tmp_path / "p.tar.gz")]) == 0
    assert f"kernel_id {CPU_AXPY}" in capsys.readouterr().out
