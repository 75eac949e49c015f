"""One kernel_id rule and git's path rules: every hole is refused with its code."""
from __future__ import annotations

import io
import tarfile

import pytest
from jsonschema import Draft202012Validator

import kz_schemas
from kz_daemon.cli import main
from kz_runner.contract.kernel_id import (
    KERNEL_ID_PATTERN,
    MAX_KERNEL_ID_BYTES,
    MAX_SEGMENT_BYTES,
    SEGMENTS,
    check_kernel_id,
    kernel_id_errors,
    kernel_id_problems,
)
from kz_runner.contract.pack import build_tarball
from kz_runner.contract.tarball import scan_tarball
from kz_runner.contract.validate import validate_package_dir, validate_tarball
from tests.helpers.contract_fixtures import DEFAULT_ID, mark_repo, write_package

BASE = "cpu/Elementwise/Axpy/fp32"


@pytest.mark.parametrize("kernel_id", [
    f"{BASE}/" + "k" * 256,                                # a segment no file system takes
    f"{BASE}/" + "k" * (MAX_SEGMENT_BYTES + 1),            # one byte over the segment limit
    "/".join(["k" * 60] * 5),                              # every segment fine, the whole too long
    "/".join(["a"] * (SEGMENTS + 1)),                      # too deep
    "/".join(["a"] * (SEGMENTS - 1)),                      # too shallow: no <name>
    "wrong",                                               # one name: no operator at all
    f"{BASE}/impl\n",                                      # `$` would match before this newline
    f"{BASE}/impl\r",
    f"{BASE}/.GIT",
    f"{BASE}/.Git",
    f"{BASE}/.git.",
    f"{BASE}/git~1",
    f"{BASE}/has space",
])
def test_bad_kernel_ids_are_refused_with_one_problem(kernel_id):
    assert kernel_id_errors(kernel_id)
    problems = check_kernel_id(kernel_id)
    assert [p.code for p in problems] == ["KERNEL_ID_INVALID"]


def test_limits_are_inclusive():
    assert kernel_id_errors(f"{BASE}/" + "k" * MAX_SEGMENT_BYTES) == []
    long_ok = "/".join(["k" * 51] + ["k" * 50] * 4)
    assert len(long_ok) == MAX_KERNEL_ID_BYTES and kernel_id_errors(long_ok) == []
    assert kernel_id_errors("/".join(["a"] * SEGMENTS)) == []
    assert kernel_id_errors(f"{BASE}/.github") == [] and kernel_id_errors(f"{BASE}/git") == []


def tarball(extra: dict[str, tuple[str, bytes]], tmp_path) -> bytes:
    """A valid package's archive plus members ``{name: (kind, data)}`` (kind: file or symlink)."""
    pkg = write_package(mark_repo(tmp_path / "repo"))
    data, _ = build_tarball(pkg, DEFAULT_ID)
    raw = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as src, \
            tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as out:
        for info in src.getmembers():
            out.addfile(info, src.extractfile(info) if info.isreg() else None)
        for name, (kind, payload) in extra.items():
            info = tarfile.TarInfo(name)
            if kind == "symlink":
                info.type, info.linkname = tarfile.SYMTYPE, payload.decode()
                out.addfile(info)
            else:
                info.size = len(payload)
                out.addfile(info, io.BytesIO(payload))
    return raw.getvalue()


@pytest.mark.parametrize("member,kind,code", [
    ("src/.GIT/hooks/post-commit", "file", "GIT_PATH_REFUSED"),
    (".Git/config", "file", "GIT_PATH_REFUSED"),
    ("src/.git/config", "file", "GIT_PATH_REFUSED"),
    ("src/.git /config", "file", "GIT_PATH_REFUSED"),
    ("src/.git./config", "file", "GIT_PATH_REFUSED"),
    ("src/.git. . /config", "file", "GIT_PATH_REFUSED"),
    ("src/.git::$INDEX_ALLOCATION/config", "file", "GIT_PATH_REFUSED"),
    ("src/GIT~1/config", "file", "GIT_PATH_REFUSED"),
    ("src/.g\u200cit/config", "file", "GIT_PATH_REFUSED"),
    ("src/.\ufeffGIT/config", "file", "GIT_PATH_REFUSED"),
    ("src/.gitmodules", "symlink", "GIT_PATH_REFUSED"),
    ("src/.GitModules.", "symlink", "GIT_PATH_REFUSED"),
    ("src/gitmod~1", "symlink", "GIT_PATH_REFUSED"),
    ("src/" + "a" * 256, "file", "TARBALL_BAD_NAME"),
    ("src/" + "/".join(["d" * 200] * 6), "file", "TARBALL_BAD_NAME"),
])
def test_member_paths_git_refuses_are_refused(tmp_path, member, kind, code):
    data = tarball({f"{DEFAULT_ID}/{member}": (kind, b"../x" if kind == "symlink" else b"x\n")}, tmp_path)
    scan = scan_tarball(io.BytesIO(data))
    assert [p.code for p in scan.problems] == [code], scan.problems
    report = validate_tarball(io.BytesIO(data), "p.tar.gz", kernel_id=DEFAULT_ID)
    assert not report.valid and report.problems[0].code == code


def test_harmless_dot_names_are_kept(tmp_path):
    data = tarball({f"{DEFAULT_ID}/src/.github/ci.yml": ("file", b"x\n"),
                    f"{DEFAULT_ID}/src/.gitignore": ("file", b"*.o\n"),
                    f"{DEFAULT_ID}/src/.gitmodules": ("file", b"\n")}, tmp_path)
    report = validate_tarball(io.BytesIO(data), "p.tar.gz", kernel_id=DEFAULT_ID)
    assert report.valid, [p.render() for p in report.problems]


def test_validate_reports_one_clear_problem_for_a_bad_kernel_id(tmp_path, capsys):
    repo = mark_repo(tmp_path / "repo")
    pkg = write_package(repo, f"{BASE}/impl").rename(repo / BASE / "has space")  # a folder renamed by hand
    report = validate_package_dir(pkg)
    assert [p.code for p in report.errors] == ["KERNEL_ID_INVALID"], [p.render() for p in report.problems]
    good = write_package(repo)
    assert main(["validate", "--kernel-id", f"{BASE}/has space", str(good)]) == 1
    out = capsys.readouterr().out
    assert out.count("error ") == 1 and "KERNEL_ID_INVALID" in out


SCHEMA_SAMPLES = [
    f"{BASE}/impl", f"{BASE}/.github", f"{BASE}/git", f"{BASE}/...", f"{BASE}/" + "k" * MAX_SEGMENT_BYTES,
    "/".join(["k" * 51] + ["k" * 50] * 4), "/".join(["a"] * SEGMENTS), "/".join(["a"] * (SEGMENTS - 1)), "wrong",
    f"{BASE}/" + "k" * (MAX_SEGMENT_BYTES + 1), "/".join(["k" * 60] * 5), "/".join(["a"] * (SEGMENTS + 1)),
    f"{BASE}/impl\n", f"{BASE}/impl\r", f"{BASE}/.GIT", f"{BASE}/.git..", f"{BASE}/.git/x", f"{BASE}/..",
    f"{BASE}/./x", "..", ".", f"/{BASE}", f"{BASE}/", f"{BASE}//x", f"{BASE}/has space", "",
]


@pytest.mark.parametrize("name", ["bench_result", "benchmark_output"])
def test_schema_kernel_id_pattern_is_the_one_rule(name):
    """The schemas' kernel_id is KERNEL_ID_PATTERN and, as jsonschema applies it, agrees with the rule."""
    schema = kz_schemas.load(name)["properties"]["kernel_id"]
    assert schema["pattern"] == KERNEL_ID_PATTERN and schema["maxLength"] == MAX_KERNEL_ID_BYTES
    validator = Draft202012Validator(schema)
    for kernel_id in SCHEMA_SAMPLES:
        assert validator.is_valid(kernel_id) == (kernel_id_errors(kernel_id) == []), repr(kernel_id)
    assert not validator.is_valid(f"{BASE}/impl\n")  # Python's `$` alone would let this through


def test_kernel_id_problems_code_git_refused_segments_apart_from_the_rest():
    assert kernel_id_problems("cpu/Elementwise/Axpy/fp32/ok") == []
    codes = [p.code for p in kernel_id_problems("cpu/.GIT/x y/.git./ok")]
    assert codes == ["KERNEL_ID_INVALID", "GIT_PATH_REFUSED", "GIT_PATH_REFUSED"]
    invalid, *git = kernel_id_problems("cpu/.GIT/x y/.git./ok")
    assert "x y" in invalid.message and ".GIT" not in invalid.message and "5" not in invalid.message
    assert [p.message.split(":")[0] for p in git] == ["git refuses segment 2", "git refuses segment 4"]
    assert all(p.field == "kernel_id" for p in [invalid, *git])
    # the plain sentences are the same reasons, in the same order
    assert [r.split(":")[0] for r in kernel_id_errors("cpu/.GIT/x y")] == [
        "kernel_id has 3 segments; it must have exactly 5", "segment 2",
        "segment 'x y' has characters outside [A-Za-z0-9._-]"]


def test_a_kernel_id_has_exactly_five_segments():
    """<arch>/<op_class>/<sub_class>/<quant>/<name>: fewer names no implementation, more is not the shape."""
    for depth in (1, 2, 3, 4, 6, 7):
        kernel_id = "/".join(["cpu", "Elementwise", "Axpy", "fp32", "impl", "x", "y"][:depth])
        [found] = check_kernel_id(kernel_id)
        assert found.code == "KERNEL_ID_INVALID"
        assert f"has {depth} segment" in found.message and "<arch>/<op_class>/<sub_class>/<quant>/<name>" in found.message
    assert check_kernel_id("cpu/Elementwise/Axpy/fp32/impl") == []


def test_a_tarball_whose_top_directory_is_one_name_is_refused(tmp_path):
    """``wrong/.kernel_package/...``: TARBALL_TOP_DIR says the top directories must spell the kernel_id."""
    pkg = write_package(mark_repo(tmp_path / "repo"))
    data, _ = build_tarball(pkg, "wrong")
    report = validate_tarball(io.BytesIO(data), "wrong.tar.gz")
    assert [p.code for p in report.errors] == ["TARBALL_TOP_DIR"], [p.render() for p in report.problems]
    assert "'wrong/'" in report.errors[0].message and "<arch>/<op_class>/<sub_class>/<quant>/<name>" in \
        report.errors[0].message
    deep, _ = build_tarball(pkg, f"{DEFAULT_ID}/extra")
    assert [p.code for p in validate_tarball(io.BytesIO(deep), "deep.tar.gz").errors] == ["TARBALL_TOP_DIR"]
