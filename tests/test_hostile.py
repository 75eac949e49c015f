"""Hostile input against the whole system: every case over HTTP and over the spool, refused with its code.

A real ``kz daemon`` process (with the small tarball limits of the rejection suite) and a
real ``kz runner``. Each hostile tarball (the rejection suite's corpus, plus the cases
below) goes in three ways: ``POST /api/submissions``, a drop into ``spool/inbox`` through
``spool/tmp`` + rename, and a file written in place in ``spool/inbox`` in pieces. Each is
refused with its stable code and nothing reaches the repo (HEAD never moves while they
go in). Over HTTP the answer is a 4xx naming the contract's code in the error or in its
``details`` (``reasons``/``problems``), and an upload over the size limit is cut off with
``413 PAYLOAD_TOO_LARGE``; a file written in place must be judged whole, never half
written. Afterwards the daemon still answers ``/readyz`` 200, a valid submission goes
through end to end on the real runner, ``kz audit`` is clean, and the runner is alive.
"""
from __future__ import annotations

import io
import json
import os
import tarfile
import time
from pathlib import Path

import httpx
import pytest
from test_intake_rejections import CASES, FROZEN_ID, KID, LIMITS

from kz_daemon.storage.gitstore import GitStore, format_message
from tests.helpers.daemon import AXPY_DIR, AXPY_ID, EXAMPLES, axpy_tarball, package_files, wait_for
from tests.helpers.submissions import logged
from tests.helpers.system import Ack, RunnerProcess, ZooProcess, check_invariants, submit, tiny_tarball
from tests.helpers.workload import wait_terminal_in_log

pytestmark = [pytest.mark.slow]

MIB = 1024 * 1024
_BIG: dict[str, bytes] = {}


def _tar_with(name: str, data: bytes = b"x", **attrs) -> bytes:
    """The valid package as KID plus one member ``name``."""
    base = package_files(AXPY_DIR)
    desc = base[".kernel_package/desc.yaml"].decode().replace("numpy_ref", "hostile")
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for rel, content in sorted(base.items()):
            content = desc.encode() if rel.endswith("desc.yaml") else content
            info = tarfile.TarInfo(f"{KID}/{rel}")
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        info = tarfile.TarInfo(name)
        info.size = len(data)
        for k, v in attrs.items():
            setattr(info, k, v)
        tar.addfile(info, io.BytesIO(data) if info.isreg() else None)
    return raw.getvalue()


def _bomb() -> bytes:
    """A tar bomb: 128 MiB of zeros in one member, about 128 KiB compressed (under the upload limit; built once)."""
    if "bomb" in _BIG:
        return _BIG["bomb"]
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w:gz", compresslevel=9) as tar:
        info = tarfile.TarInfo(f"{KID}/src/bomb.bin")
        info.size = 128 * MIB

        class Zeros:
            """A file of ``info.size`` zero bytes, read in pieces (never held whole)."""

            left = info.size

            def read(self, n: int = -1) -> bytes:
                n = self.left if n < 0 else min(n, self.left)
                self.left -= n
                return bytes(n)
        tar.addfile(info, Zeros())
    _BIG["bomb"] = raw.getvalue()
    return _BIG["bomb"]



def _huge() -> bytes:
    """An upload over 64 MiB (random bytes: a stream no limit can be argued away from)."""
    if "huge" not in _BIG:
        _BIG["huge"] = os.urandom(64 * MIB + 4096)
    return _BIG["huge"]


EXTRA = [
    ("kernel_id_segment_over_255_bytes", lambda: axpy_tarball(f"{KID.rsplit('/', 1)[0]}/{'k' * 256}"),
     ("KERNEL_ID_INVALID", "TARBALL_BAD_NAME")),
    ("kernel_id_trailing_newline", lambda: axpy_tarball(KID + "\n"), ("KERNEL_ID_INVALID", "TARBALL_BAD_NAME")),
    ("kernel_id_with_space", lambda: axpy_tarball(f"{KID} x"), ("KERNEL_ID_INVALID",)),
    ("git_hooks_post_commit", lambda: _tar_with(f"{KID}/src/.GIT/hooks/post-commit", b"#!/bin/sh\n", mode=0o755),
     ("GIT_PATH_REFUSED",)),
    ("gitmodules_symlink_at_top", lambda: _tar_with(f"{KID}/.gitmodules", b"", type=tarfile.SYMTYPE,
                                                    linkname="src/axpy.py"), ("GIT_PATH_REFUSED",)),
    ("traversal_deep", lambda: _tar_with(f"{KID}/src/../../../../etc/passwd", b"root::0:0"), ("TARBALL_DOTDOT",)),
    ("symlink_escape", lambda: _tar_with(f"{KID}/src/up", b"", type=tarfile.SYMTYPE, linkname="../../../../"),
     ("TARBALL_SYMLINK",)),
    ("hardlink_outside", lambda: _tar_with(f"{KID}/src/shadow", b"", type=tarfile.LNKTYPE, linkname="/etc/shadow"),
     ("TARBALL_HARDLINK",)),
    ("char_device", lambda: _tar_with(f"{KID}/src/mem", b"", type=tarfile.CHRTYPE, devmajor=1, devminor=1),
     ("TARBALL_SPECIAL",)),
    ("tar_bomb_128mib_zeros", _bomb, ("TARBALL_RATIO", "TARBALL_MEMBER_TOO_LARGE", "TARBALL_TOO_LARGE",
                                      "TARBALL_COMPRESSED_TOO_LARGE")),
]
#: the over-64 MiB upload: over HTTP the stream is cut at the limit (413); in the spool the file is refused
HUGE = ("upload_over_64_mib", _huge, ("TARBALL_COMPRESSED_TOO_LARGE",))

#: the daemon's upload limit in this suite (LIMITS): over HTTP a bigger upload is cut off while it streams
MAX_COMPRESSED = 262144
assert f"max_compressed_bytes: {MAX_COMPRESSED}" in LIMITS

#: over HTTP the form's kernel_id is read first: a six-segment id is refused as an id before the tarball is
ALSO = {"nested_in_existing": ("KERNEL_ID_INVALID",)}
ALL = [(label, build, (code, *ALSO.get(label, ()))) for label, build, code in CASES] + EXTRA
HTTP_CASES = ALL + [HUGE]
SPOOL_CASES = ALL + [HUGE]
#: the spec's named cases, all present in the corpus above
NAMED = {"git_dir_upper", "gitmodules_symlink", "bad_kernel_id", "gzip_bomb", "dotdot", "symlink", "hardlink",
         "chardev", "blockdev", "fifo", "kernel_id_segment_over_255_bytes", "kernel_id_trailing_newline"}


def _form_kernel_id(data: bytes) -> str:
    """The kernel_id the tarball claims (its desc.yaml's folder), for the form field; KID when none is found."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            for name in tar.getnames():
                if name.endswith("/.kernel_package/desc.yaml"):
                    return name[: -len("/.kernel_package/desc.yaml")]
    except (tarfile.TarError, OSError, EOFError):
        pass
    return KID


def _codes(doc: dict) -> set[str]:
    """Every code an error answer names: its own, its reasons' and its problems'."""
    err = doc.get("error", {})
    details = err.get("details", {}) or {}
    found = {err.get("code")}
    for key in ("reasons", "problems"):
        for item in details.get(key, []) or []:
            if isinstance(item, dict):
                found.add(item.get("code"))
    return found - {None}


def _received(events_dir: Path) -> dict[str, str]:
    """{spool file name: uuid} of every submission.received in the log."""
    out = {}
    for seg in sorted(events_dir.glob("*.jsonl")):
        for line in seg.read_text().splitlines():
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            if ev.get("type") == "submission.received":
                out[ev["payload"].get("filename")] = ev["payload"]["uuid"]
    return out


@pytest.fixture(scope="module")
def system(tmp_path_factory):
    base = tmp_path_factory.mktemp("hostile")
    zoo = ZooProcess(base / "state", lease=30, runners=("r1",), extra_yaml=LIMITS, seed_from=EXAMPLES)
    git = GitStore.open(zoo.config.paths.repo)
    frozen = {f"{FROZEN_ID}/{rel}": data for rel, data in package_files(AXPY_DIR).items()}
    desc_key = f"{FROZEN_ID}/.kernel_package/desc.yaml"
    frozen[desc_key] = frozen[desc_key].replace(b"status: normal", b"status: frozen")
    frozen[f"{FROZEN_ID}/.kernel_package/bench_result.yaml"] = (
        AXPY_DIR / ".kernel_package/bench_result.yaml").read_bytes().replace(AXPY_ID.encode(), FROZEN_ID.encode())
    git.commit_changes(frozen, format_message("operator: a frozen package", {}), "op <op@x>", git.head())
    git.close()
    zoo.start()
    runner = RunnerProcess(zoo, "r1", base / "work-r1")
    yield zoo, runner
    runner.kill()
    zoo.kill()


def _head(zoo: ZooProcess) -> str:
    git = GitStore.open(zoo.config.paths.repo)
    try:
        return git.head()
    finally:
        git.close()


def _log_since(zoo: ZooProcess, base: str) -> list[str]:
    git = GitStore.open(zoo.config.paths.repo)
    try:
        return [c.subject for c in git.log(stop=base)]
    finally:
        git.close()


def test_the_corpus_holds_the_named_cases():
    labels = {label for label, _, _ in ALL}
    assert NAMED <= labels, NAMED - labels
    assert len(ALL) >= 50


def test_hostile_input_is_refused_over_http_and_the_spool(system):
    zoo, runner = system
    head = _head(zoo)
    wrong: list[str] = []
    # -- over HTTP ------------------------------------------------------------------------------------
    with httpx.Client(timeout=120) as client:
        for label, build, codes in HTTP_CASES:
            data = build()
            try:
                resp = submit(zoo.url, _form_kernel_id(data), data, "mallory", client=client)
            except httpx.HTTPError as exc:  # the server may cut an over-limit stream: that is a refusal too
                if len(data) > MAX_COMPRESSED:
                    continue
                wrong.append(f"http {label}: {exc!r}")
                continue
            if len(data) > MAX_COMPRESSED:  # the documented answer to an upload over the limit
                if not (resp.status_code == 413 and resp.json()["error"]["code"] == "PAYLOAD_TOO_LARGE"):
                    wrong.append(f"http {label}: {resp.status_code} {resp.text[:200]} (want 413 PAYLOAD_TOO_LARGE)")
                continue
            found = _codes(resp.json()) if resp.headers.get("content-type", "").startswith("application/json") else set()
            if resp.status_code // 100 != 4 or not (found & set(codes)):
                wrong.append(f"http {label}: {resp.status_code} {sorted(found)} (want one of {codes})")
    if _head(zoo) != head:
        wrong.append(f"a refused HTTP upload moved the branch: {_log_since(zoo, head)}")
        head = _head(zoo)
    # -- over the spool: renamed in, and written in place in pieces -----------------------------------
    inbox, tmp = zoo.config.spool_inbox, zoo.config.spool_tmp
    names: dict[str, tuple[str, tuple[str, ...]]] = {}
    for label, build, codes in SPOOL_CASES:
        data = build()
        renamed = f"h-rename-{label}.tar.gz"
        (tmp / renamed).write_bytes(data)
        os.replace(tmp / renamed, inbox / renamed)
        names[renamed] = (label, codes)
        in_place = f"h-inplace-{label}.tar.gz"
        with open(inbox / in_place, "wb") as out:  # a writer that does not use tmp/: seen half written
            step = max(1, len(data) // 3)
            for at in range(0, len(data), step):
                out.write(data[at: at + step])
                out.flush()
                time.sleep(0.2)
        names[in_place] = (label, codes)
    received = wait_for(lambda: (lambda got: got if set(names) <= set(got) else None)(_received(zoo.config.paths.events)),
                        timeout=240, interval=0.5)

    def all_decided():
        subs = logged(zoo.config.paths.events)
        return subs if all(subs[received[n]].status not in ("received",) for n in names) else None
    subs = wait_for(all_decided, timeout=240, interval=0.5)
    for name, (_label, codes) in sorted(names.items()):
        sub = subs[received[name]]
        got = sub.reasons[0]["code"] if sub.reasons else None
        if sub.status != "rejected" or got not in codes:
            wrong.append(f"spool {name}: {sub.status} {got} (want one of {codes})")
        if (zoo.config.paths.pending / sub.uuid).exists():
            wrong.append(f"spool {name}: left a pending folder")
    if _head(zoo) != head:
        wrong.append(f"a refused spool drop moved the branch: {_log_since(zoo, head)}")
    assert wrong == [], "\n".join(wrong)


def test_the_system_still_works_afterwards(system):
    zoo, runner = system
    assert zoo.ready()
    kernel_id = "cpu/Elementwise/Axpy/fp32/after_hostile"
    resp = submit(zoo.url, kernel_id, tiny_tarball(kernel_id, "ok"))
    assert resp.status_code == 202, resp.text
    ack = Ack(resp.json()["uuid"], kernel_id, time.time())
    assert wait_terminal_in_log(zoo, [ack], 180) == []
    assert ack.status == "accepted", logged(zoo.config.paths.events)[ack.uuid].reasons
    verdict = check_invariants(zoo, [ack])
    assert verdict.problems == [], verdict.problems
    assert runner.alive(), runner.log_tail()
    assert zoo.pid is not None and zoo.ready(), zoo.log_tail()
