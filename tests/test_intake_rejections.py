"""The rejection suite: hostile and malformed drops, each with its specific code, nothing in the repo."""
from __future__ import annotations

import io
import json
import os
import tarfile

import pytest

from kz_daemon.ops.runtime import init_state_dir
from kz_daemon.ops.service import Zoo
from kz_daemon.storage.gitstore import GitStore, format_message
from tests.helpers.daemon import AXPY_DIR, AXPY_ID, EXAMPLES, axpy_tarball, drop_and_decide, package_files
from tests.helpers.submissions import every

KID = "cpu/Elementwise/Axpy/fp32/hostile"
FROZEN_ID = "cpu/Elementwise/Axpy/fp32/frozen_pkg"
LIMITS = """\
limits:
  max_compressed_bytes: 262144
  max_members: 64
  max_member_bytes: 1048576
  max_total_bytes: 2097152
  max_ratio: 20
"""


def files(mutate=None, kernel_id=KID):
    """The Axpy example's files with desc.category matching ``kernel_id``."""
    data = axpy_tarball(kernel_id, mutate)
    return data


def _tar(build, gz=True) -> bytes:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz" if gz else "w", format=tarfile.PAX_FORMAT) as tar:
        build(tar)
    return raw.getvalue()


def _add(tar, name, data=b"x", **attrs):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    for k, v in attrs.items():
        setattr(info, k, v)
    tar.addfile(info, io.BytesIO(data) if info.isreg() else None)


def with_member(name, data=b"x", **attrs):
    """The valid package plus one extra member."""
    base = package_files(AXPY_DIR)
    desc = base[".kernel_package/desc.yaml"].decode().replace("numpy_ref", "hostile")

    def build(tar):
        for rel, content in sorted(base.items()):
            _add(tar, f"{KID}/{rel}", desc.encode() if rel.endswith("desc.yaml") else content)
        _add(tar, name, data, **attrs)
    return _tar(build)


def edit(rel, old, new):
    def mutate(f):
        assert old.encode() in f[rel], (rel, old)
        f[rel] = f[rel].replace(old.encode(), new.encode())
    return files(mutate)


def drop_file(rel, content=None):
    def mutate(f):
        if content is None:
            del f[rel]
        else:
            f[rel] = content
    return files(mutate)


METAS_LINE = "KERNEL_ZOO_TEST_CASE_METAS = ["

CASES = [
    ("symlink", lambda: with_member(f"{KID}/src/link", b"", type=tarfile.SYMTYPE, linkname="/etc/passwd"),
     "TARBALL_SYMLINK"),
    ("hardlink", lambda: with_member(f"{KID}/src/hard", b"", type=tarfile.LNKTYPE,
                                     linkname=f"{KID}/src/axpy.py"), "TARBALL_HARDLINK"),
    ("chardev", lambda: with_member(f"{KID}/src/null", b"", type=tarfile.CHRTYPE, devmajor=1, devminor=3),
     "TARBALL_SPECIAL"),
    ("blockdev", lambda: with_member(f"{KID}/src/sda", b"", type=tarfile.BLKTYPE), "TARBALL_SPECIAL"),
    ("fifo", lambda: with_member(f"{KID}/src/fifo", b"", type=tarfile.FIFOTYPE), "TARBALL_SPECIAL"),
    ("absolute", lambda: with_member("/etc/cron.d/evil", b"x"), "TARBALL_ABSOLUTE"),
    ("dotdot", lambda: with_member(f"{KID}/../../evil.py", b"x"), "TARBALL_DOTDOT"),
    ("backslash", lambda: with_member(f"{KID}/src\\evil.py", b"x"), "TARBALL_BAD_NAME"),
    ("empty_segment", lambda: with_member(f"{KID}/src//evil.py", b"x"), "TARBALL_BAD_NAME"),
    ("duplicate", lambda: with_member(f"{KID}/src/axpy.py", b"again"), "TARBALL_DUPLICATE"),
    ("not_gzip", lambda: b"this is not a tarball at all\n" * 10, "TARBALL_CORRUPT"),
    ("truncated", lambda: files()[:200], "TARBALL_CORRUPT"),
    ("plain_tar", lambda: _tar(lambda t: _add(t, f"{KID}/x", b"x"), gz=False), "TARBALL_CORRUPT"),
    ("empty_tar", lambda: _tar(lambda t: None), "TARBALL_EMPTY"),
    ("too_many_members", lambda: with_member_many(80), "TARBALL_TOO_MANY_MEMBERS"),
    ("member_too_large", lambda: with_member(f"{KID}/src/big.bin", os.urandom(1100 * 1024)),
     "TARBALL_COMPRESSED_TOO_LARGE"),
    ("member_too_large_compressible", lambda: with_member(f"{KID}/src/big.txt", b"abc" * 400_000),
     "TARBALL_MEMBER_TOO_LARGE"),
    ("total_too_large", lambda: with_members_sizes([750_000, 750_000, 750_000]), "TARBALL_TOO_LARGE"),
    ("gzip_bomb", lambda: with_members_sizes([1_000_000, 1_000_000], zeros=True), "TARBALL_RATIO"),
    ("compressed_too_large", lambda: with_member(f"{KID}/src/rand.bin", os.urandom(300 * 1024)),
     "TARBALL_COMPRESSED_TOO_LARGE"),
    ("bench_result_inside", lambda: with_member(f"{KID}/.kernel_package/bench_result.yaml", b"cases: []\n"),
     "BENCH_RESULT_IN_TARBALL"),
    ("no_top_dir", lambda: _tar(lambda t: [_add(t, rel, c) for rel, c in package_files(AXPY_DIR).items()]),
     "TARBALL_TOP_DIR"),
    ("stray_member", lambda: with_member("README.md", b"outside"), "TARBALL_TOP_DIR"),
    ("second_package", lambda: with_member(f"{KID}/src/inner/.kernel_package/desc.yaml", b"x: 1\n"),
     "NESTED_PACKAGE"),
    ("missing_desc", lambda: drop_file(".kernel_package/desc.yaml"), "FILE_MISSING"),
    ("missing_benchmark", lambda: drop_file(".kernel_package/benchmark.py"), "FILE_MISSING"),
    ("missing_build_env", lambda: drop_file(".kernel_package/build_test_env.py"), "FILE_MISSING"),
    ("desc_bad_yaml", lambda: drop_file(".kernel_package/desc.yaml", b"name: [unclosed\n  : :\n"),
     "YAML_INVALID"),
    ("desc_retired_field", lambda: edit(".kernel_package/desc.yaml", "status: normal",
                                        "status: normal\nacceptance:\n  regression_tolerance: 0.05"),
     "DESC_SCHEMA"),
    ("desc_bad_status", lambda: edit(".kernel_package/desc.yaml", "status: normal", "status: retired"),
     "DESC_SCHEMA"),
    ("benchmark_syntax", lambda: edit(".kernel_package/benchmark.py", "def main(", "def main(((("),
     "PYTHON_SYNTAX"),
    ("metas_missing", lambda: edit(".kernel_package/benchmark.py", METAS_LINE, "OTHER_NAME = ["),
     "METAS_MISSING"),
    ("metas_computed", lambda: edit(".kernel_package/benchmark.py", METAS_LINE,
                                    "KERNEL_ZOO_TEST_CASE_METAS = list(range(3)) + ["), "METAS_NOT_LITERAL"),
    ("metas_primary", lambda: edit(".kernel_package/benchmark.py", '"primary_metric": "latency_us"',
                                   '"primary_metric": "nope"'), "METAS_PRIMARY_METRIC"),
    ("metas_duplicate_id", lambda: edit(".kernel_package/benchmark.py", '"test_case_id": "n64k"',
                                        '"test_case_id": "n4k"'), "METAS_DUPLICATE_ID"),
    ("no_build_env_function", lambda: edit(".kernel_package/build_test_env.py", "def build_env(",
                                           "def make_env("), "BUILD_ENV_MISSING"),
    ("reference_source_missing", lambda: drop_file("src/axpy.py"), "REFERENCE_SOURCE_MISSING"),
    ("bad_kernel_id", lambda: axpy_tarball("cpu/Elementwise/Axpy/fp32/has space"), "KERNEL_ID_INVALID"),
    ("frozen_in_submission", lambda: edit(".kernel_package/desc.yaml", "status: normal", "status: frozen"),
     "PACKAGE_FROZEN"),
    ("frozen_at_head", lambda: axpy_tarball(FROZEN_ID), "PACKAGE_FROZEN"),
    # six segments: no kernel_id can lie inside another package's folder any more
    ("nested_in_existing", lambda: axpy_tarball(AXPY_ID + "/inner"), "TARBALL_TOP_DIR"),
    ("git_dir_upper", lambda: with_member(f"{KID}/src/.GIT/hooks/post-commit", b"#!/bin/sh\n", mode=0o755),
     "GIT_PATH_REFUSED"),
    ("git_dir_mixed", lambda: with_member(f"{KID}/.Git/config", b"[core]\n"), "GIT_PATH_REFUSED"),
    ("git_dir_trailing_space", lambda: with_member(f"{KID}/src/.git /config", b"x"), "GIT_PATH_REFUSED"),
    ("git_dir_trailing_dot", lambda: with_member(f"{KID}/src/.git./config", b"x"), "GIT_PATH_REFUSED"),
    ("git_dir_ntfs_short_name", lambda: with_member(f"{KID}/GIT~1/config", b"x"), "GIT_PATH_REFUSED"),
    ("git_dir_hfs_ignorable", lambda: with_member(f"{KID}/.g\u200cit/config", b"x"), "GIT_PATH_REFUSED"),
    ("gitmodules_symlink", lambda: with_member(f"{KID}/src/.gitmodules", b"", type=tarfile.SYMTYPE,
                                               linkname="../x"), "GIT_PATH_REFUSED"),
    ("component_over_255_bytes", lambda: with_member(f"{KID}/src/{'a' * 256}.py", b"x"), "TARBALL_BAD_NAME"),
    ("kernel_id_segment_over_100_bytes", lambda: axpy_tarball("cpu/Elementwise/Axpy/fp32/" + "k" * 101),
     "KERNEL_ID_INVALID"),
    ("kernel_id_git_segment", lambda: axpy_tarball("cpu/Elementwise/Axpy/fp32/.git."), "GIT_PATH_REFUSED"),
]


def with_member_many(n):
    base = package_files(AXPY_DIR)

    def build(tar):
        for rel, content in sorted(base.items()):
            _add(tar, f"{KID}/{rel}", content)
        for i in range(n):
            _add(tar, f"{KID}/src/f{i}.txt", b"x")
    return _tar(build)


def with_members_sizes(sizes, zeros=False):
    """The package plus filler members: zeros (a bomb) or text that compresses ~12x (under the ratio cap)."""
    import numpy as np

    base = package_files(AXPY_DIR)
    rng = np.random.default_rng(7)

    def filler(size):
        if zeros:
            return bytes(size)
        return np.where(rng.random(size) < 0.1, ord("b"), ord("a")).astype(np.uint8).tobytes()

    def build(tar):
        for rel, content in sorted(base.items()):
            _add(tar, f"{KID}/{rel}", content)
        for i, size in enumerate(sizes):
            _add(tar, f"{KID}/src/blob{i}.txt", filler(size))
    return _tar(build)


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    state = tmp_path_factory.mktemp("rej") / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text(LIMITS)
    config = init_state_dir(state, seed_from=EXAMPLES)
    git = GitStore.open(config.paths.repo)
    frozen = {f"{FROZEN_ID}/{rel}": data for rel, data in package_files(AXPY_DIR).items()}
    desc_key = f"{FROZEN_ID}/.kernel_package/desc.yaml"
    frozen[desc_key] = frozen[desc_key].replace(b"status: normal", b"status: frozen")
    frozen[f"{FROZEN_ID}/.kernel_package/bench_result.yaml"] = (
        AXPY_DIR / ".kernel_package/bench_result.yaml").read_bytes().replace(AXPY_ID.encode(), FROZEN_ID.encode())
    git.commit_changes(frozen, format_message("operator: a frozen package", {}), "op <op@x>", git.head())
    git.close()
    z = Zoo(config)
    z.start()
    yield z
    z.stop()


_decide = drop_and_decide


@pytest.mark.parametrize("case,build,code", CASES, ids=[c[0] for c in CASES])
def test_hostile_drop_is_rejected_with_its_code(zoo, case, build, code):
    head = zoo.git.head()
    view = _decide(zoo, f"{case}.tar.gz", build())
    assert view.status == "rejected"
    assert view.reasons[0]["code"] == code, view.reasons
    assert view.reasons[0]["stage"] == "intake"
    reason = json.loads((zoo.config.spool_rejected / view.uuid / "reason.json").read_text())
    assert reason["code"] == code and reason["message"]
    assert (zoo.config.spool_rejected / view.uuid / "package.tar.gz").exists()
    assert not (zoo.config.paths.pending / view.uuid).exists()
    assert zoo.git.head() == head  # nothing written to the repo


def test_suite_is_big_enough():
    assert len(CASES) >= 30


def test_wrong_file_name(zoo):
    view = _decide(zoo, "package.zip", files())
    assert view.reasons[0]["code"] == "TARBALL_NAME"


def test_sidecar_kernel_id_must_match_the_top_dir(zoo):
    view = _decide(zoo, "mismatch.tar.gz", files(), {"kernel_id": "cpu/Elementwise/Axpy/fp32/other"})
    assert view.reasons[0]["code"] == "TARBALL_TOP_DIR"


def test_sidecar_that_is_not_json(zoo):
    spool = zoo.config.paths.spool
    (spool / "inbox" / "badside.meta.json").write_text("{not json")
    view = _decide(zoo, "badside.tar.gz", files())
    assert view.reasons[0]["code"] == "SIDECAR_INVALID"


def test_symlink_dropped_in_the_inbox_is_not_followed(zoo, tmp_path):
    secret = tmp_path / "secret.tar.gz"
    secret.write_bytes(files())
    before = set(every(zoo.store))
    os.symlink(secret, zoo.config.spool_inbox / "link.tar.gz")
    zoo.scan_inbox()  # left alone, logged as spool.skipped (tests/test_spool_settle.py)
    assert set(every(zoo.store)) == before
    assert os.path.islink(zoo.config.spool_inbox / "link.tar.gz")


def test_new_packages_refused_by_policy(tmp_path):
    state = tmp_path / "kz"
    state.mkdir()
    (state / "kz.yaml").write_text("policy:\n  allow_new_packages: false\n")
    z = Zoo(init_state_dir(state, seed_from=EXAMPLES))
    z.start()
    try:
        view = _decide(z, "new.tar.gz", files())
        assert view.reasons[0]["code"] == "NEW_PACKAGE_NOT_ALLOWED"
        view = _decide(z, "known.tar.gz", axpy_tarball())
        assert view.status == "queued"
    finally:
        z.stop()
