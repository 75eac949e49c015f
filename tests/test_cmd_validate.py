"""``kz validate``: verdict lines, --json, exit codes 0/1/2 for directories and tarballs."""
from __future__ import annotations

import json

from kz_daemon.cli import main
from tests.helpers.contract_fixtures import (
    DEFAULT_ID,
    NEWCOMER,
    make_tarball,
    mark_repo,
    package_members,
    write_package,
)


def test_valid_directory_exits_0(capsys):
    assert main(["validate", str(NEWCOMER)]) == 0
    out = capsys.readouterr().out
    assert out.strip().splitlines()[-1].startswith("VALID: gfx928/Attention/MHA/fp16/reference_impl")


def test_warnings_do_not_fail(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path), status="deprecated")
    assert main(["validate", str(pkg)]) == 0
    out = capsys.readouterr().out
    assert "warning STATUS_DEPRECATED" in out and "VALID" in out


def test_invalid_directory_exits_1_errors_before_warnings(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path), status="frozen")
    (pkg / ".kernel_package" / "benchmark.py").unlink()
    assert main(["validate", str(pkg)]) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("error FILE_MISSING .kernel_package/benchmark.py")
    assert lines[1].startswith("warning STATUS_FROZEN")
    assert lines[-1].startswith("INVALID: " + DEFAULT_ID)


def test_json_output(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path))
    (pkg / "src" / "axpy.py").unlink()
    assert main(["validate", "--json", str(pkg)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["valid"] is False
    assert [p["code"] for p in doc["problems"]] == ["REFERENCE_SOURCE_MISSING"]
    assert doc["problems"][0]["field"] == "reference_sources[0]" and doc["problems"][0]["hint"]


def test_kernel_id_option(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path))
    assert main(["validate", "--kernel-id", "cpu/Elementwise/Axpy/fp32/other", str(pkg)]) == 1
    assert "BENCH_KERNEL_ID_MISMATCH" in capsys.readouterr().out


def test_tarball(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    good = tmp_path / "good.tar.gz"
    good.write_bytes(make_tarball(package_members(pkg, DEFAULT_ID)))
    assert main(["validate", str(good)]) == 0
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(make_tarball(package_members(pkg, DEFAULT_ID, include_bench=True)))
    capsys.readouterr()
    assert main(["validate", "--json", str(bad)]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert [p["code"] for p in doc["problems"]] == ["BENCH_RESULT_IN_TARBALL"]


def test_gzip_without_suffix_is_validated_as_tarball(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    odd = tmp_path / "package.bin"
    odd.write_bytes(make_tarball(package_members(pkg, DEFAULT_ID)))
    assert main(["validate", str(odd)]) == 1
    assert "TARBALL_NAME" in capsys.readouterr().out


def test_usage_errors_exit_2(tmp_path, capsys):
    assert main(["validate", str(tmp_path / "missing")]) == 2
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert main(["validate", str(text)]) == 2
    assert "neither a package directory nor a .tar.gz" in capsys.readouterr().err


def test_static_rules_report_what_the_server_would_reject_or_hold(tmp_path, capsys):
    pkg = write_package(mark_repo(tmp_path / "repo"))
    with open(pkg / "src" / "axpy.py", "a") as handle:
        handle.write("\nimport threading\nimport time\ntime.perf_counter = lambda: 0.0\n")
    lines = (pkg / "src" / "axpy.py").read_text().splitlines()
    hold_line, reject_line = lines.index("import threading") + 1, lines.index("time.perf_counter = lambda: 0.0") + 1
    assert main(["validate", "--json", str(pkg)]) == 1
    found = {p["code"]: p for p in json.loads(capsys.readouterr().out)["problems"]}
    assert found["timing-patch"]["severity"] == "error" and found["timing-patch"]["file"] == "src/axpy.py"
    assert found["timing-patch"]["field"] == str(reject_line) and "falsifies" in found["timing-patch"]["hint"]
    assert found["concurrency"]["severity"] == "warning" and found["concurrency"]["field"] == str(hold_line)
    # the same package as a tarball; a hold rule alone leaves it valid, with the warning shown
    members = package_members(pkg, DEFAULT_ID)
    tarball = tmp_path / "pkg.tar.gz"
    tarball.write_bytes(make_tarball(members))
    assert main(["validate", str(tarball)]) == 1
    assert f"error timing-patch src/axpy.py:{reject_line}" in capsys.readouterr().out
    (pkg / "src" / "axpy.py").write_text("\n".join(lines[:reject_line - 2]) + "\n")
    tarball.write_bytes(make_tarball(package_members(pkg, DEFAULT_ID)))
    assert main(["validate", str(tarball)]) == 0
    out = capsys.readouterr().out
    assert f"warning concurrency src/axpy.py:{hold_line}: import threading" in out and "VALID" in out
