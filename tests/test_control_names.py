"""A control character in a package member's name is refused (TARBALL_BAD_NAME) everywhere the contract reads names.

A newline in a file name passed validation and intake, was committed, and the commit
page rendered the rest of the name as an added diff line. The one rule lives in
``kz_runner/contract/tarball.py``; ``kz validate`` (directory and tarball), ``kz pack``
and the daemon's intake all go through it.
"""
from __future__ import annotations

import io
import json
import tarfile

import pytest

from kz_daemon.cli import main
from kz_runner.contract.tarball import CONTROL_CHARACTERS, normalize_member_name
from tests.helpers.contract_fixtures import DEFAULT_ID, mark_repo, write_package
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.helpers.live_api import api_error

FORGED = "src/notes\n+added by nobody.py"
CONTROLS = ["\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\x9b", "\u2028", "\u2029"]


@pytest.mark.parametrize("char", CONTROLS, ids=[f"U+{ord(c):04X}" for c in CONTROLS])
def test_every_control_character_is_refused_in_a_member_name(char):
    name, problem = normalize_member_name(f"{DEFAULT_ID}/src/a{char}b.py")
    assert name is None and problem.code == "TARBALL_BAD_NAME"
    assert f"U+{ord(char):04X}" in problem.message
    assert char not in problem.file  # the report names it escaped: it cannot forge a line itself


@pytest.mark.parametrize("ok", ["café.py", "日本語.py", "a b.py", "x~1.py"])
def test_printable_names_still_pass(ok):
    assert normalize_member_name(f"{DEFAULT_ID}/src/{ok}") == (f"{DEFAULT_ID}/src/{ok}", None)


def _forged_tarball(kernel_id: str = CPU_AXPY) -> bytes:
    def add(files: dict[str, bytes]) -> None:
        files[FORGED] = b"print('hi')\n"
    return package_tarball(kernel_id, mutate=add)


def _lines(text: str) -> list[str]:
    return text.strip().split("\n")


def test_kz_validate_refuses_the_tarball_and_the_directory(tmp_path, capsys):
    tarball = tmp_path / "pkg.tar.gz"
    tarball.write_bytes(_forged_tarball())
    assert main(["validate", str(tarball)]) == 1
    out = capsys.readouterr().out
    assert "TARBALL_BAD_NAME" in out and "U+000A" in out
    assert not any(line.startswith("+added") for line in _lines(out))

    pkg = write_package(mark_repo(tmp_path / "repo"))
    (pkg / FORGED).write_text("print('hi')\n")
    assert main(["validate", "--json", str(pkg)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [p["code"] for p in doc["problems"]] == ["TARBALL_BAD_NAME"]
    assert doc["problems"][0]["file"] == "src/notes\\n+added by nobody.py"


def test_kz_pack_writes_nothing_for_such_a_package(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    (pkg / "src" / "tab\there.py").write_text("x = 1\n")
    out = tmp_path / "out.tar.gz"
    assert main(["pack", str(pkg), "-o", str(out)]) == 1
    assert "error TARBALL_BAD_NAME src/tab\\there.py" in capsys.readouterr().err
    assert not out.exists()


@pytest.fixture(scope="module")
def live(tmp_path_factory):
    server = LiveServer.start(tmp_path_factory.mktemp("names"), kernels=[CPU_AXPY])
    yield server
    server.stop()


@pytest.mark.parametrize("name", [FORGED, "src/cr\rlf.py", "src/del\x7f.py", "src/nel\x85.py", "src/ls\u2028.py"],
                         ids=["newline", "carriage-return", "DEL", "C1-NEL", "U+2028"])
def test_an_upload_with_such_a_name_is_refused_over_http_and_nothing_is_committed(live, name):
    head = live.zoo.git.head()
    raw = io.BytesIO()
    base = tarfile.open(fileobj=io.BytesIO(package_tarball(CPU_AXPY)), mode="r:gz")
    with base, tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as out:
        for member in base.getmembers():
            out.addfile(member, base.extractfile(member))
        extra = tarfile.TarInfo(f"{CPU_AXPY}/{name}")
        extra.size = 3
        out.addfile(extra, io.BytesIO(b"x=1"))
    with live.client() as anon:
        resp = live.submit(anon, CPU_AXPY, raw.getvalue(), submitter="mallory")
    error = api_error(resp, 400, "VALIDATION_ERROR")
    codes = {p["code"] for p in error["details"]["problems"]}
    assert codes == {"TARBALL_BAD_NAME"}, error
    assert live.zoo.git.head() == head
    with live.client() as anon:
        status = anon.get(error["details"]["status_url"]).json()
    assert status["status"] == "rejected" and status["reasons"][0]["code"] == "TARBALL_BAD_NAME"
    assert not any(CONTROL_CHARACTERS.search(r["message"]) for r in status["reasons"])
