"""The operator's reference kernel a confirmation run times beside the candidate: chosen once, shipped in its package.

A confirmation run measures the candidate against the operator's reference kernel in the same
run (:mod:`kz_daemon.queue.confirm`). The reference is chosen from the kernel repo at HEAD when
the job's package is first built, by the leaderboard's own rule
(``kz_daemon.board.ranking.reference_of``: tag ``reference``, else a name in
``REFERENCE_NAMES``, else the first measured kernel of the operator; never a kernel whose
harness awaits review, whose tag and records no maintainer vouched for), and kept as
``pending/<uuid>/confirm-reference.json``: its kernel_id, its source commit (the
``commit_sha`` of its current record), the HEAD its files were read at, the kernels its
``benchmark.py`` names with ``bench.kernel`` and its recorded value of each case's primary
metric (``metrics_current``: the record of the source that is shipped).

**Unrecorded reference.** On a fresh zoo no kernel is measured: the seeded examples hold only
their placeholders. The same rule is then applied to the kernels at HEAD, measured or not (the
seeded ``numpy_ref`` of its operator), with no recorded values, and the reference's commit is
the HEAD its files were read at. Without a record the confirmation's ratio has nothing to be
compared with, so a first record's *first* run carries the reference too
(:func:`in_first_run`): both runs time it beside the candidate and their two measured ratios
are compared, host noise cancelling in each. On the CPU lane every first run that may be
confirmed carries it, recorded or not (``confirmation.cpu_reference_in_first_run``): a ratio
implied across two jobs compares the host's load at two times. An honest, unchanged CPU softmax on a loaded
2-core host measured 21.3 us, then 29.3 us, its intervals apart: compared raw it was refused.
Only an operator with no kernel at HEAD at all (a new kernel of a new operator) has no
reference; the file then says why (``unavailable``).

The runner package carries the reference's source area (every file of its folder outside
``.kernel_package/``) under ``<kernel_id>/.kernel_package/reference/`` with ``reference.json``
(``kz_runner.contract.layout.REFERENCE_DIR``, ``REFERENCE_FILE``); the harness
(``kz_runner.bench``) times it with the candidate's benchmark and reports the ratio.
"""
from __future__ import annotations

import ast
import json
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

from kz_daemon.board.ranking import HARNESS, REVIEWED, UNREVIEWED, reference_of
from kz_daemon.core import scorecard
from kz_daemon.storage.gitstore import GitStore
from kz_daemon.storage.pending import PendingStore
from kz_events.durable import atomic_write_json
from kz_runner.contract.layout import BENCH_RESULT, BENCHMARK, DESC, KP, REFERENCE_DIR, REFERENCE_FILE, is_seed_sha
from kz_runner.contract.yamlio import load_yaml

__all__ = ["CHOICE_FILE", "choose", "in_first_run", "load", "decide", "package_entries", "declared_kernels", "recorded_values"]

CHOICE_FILE = "confirm-reference.json"  # in pending/<uuid>/, beside the package


def _measured(record: Any) -> bool:
    return isinstance(record, dict) and not is_seed_sha(str(record.get("commit_sha", ""))) and \
        isinstance(record.get("value"), (int, float)) and not isinstance(record.get("value"), bool)


def declared_kernels(source: bytes | None) -> list[list[str]]:
    """The ``[module, function]`` pairs a ``benchmark.py`` names with ``bench.kernel("m", "f")``, in order."""
    if not source:
        return []
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    found: list[list[str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or len(node.args) != 2:
            continue
        func = node.func
        if not ((isinstance(func, ast.Attribute) and func.attr == "kernel") or
                (isinstance(func, ast.Name) and func.id == "kernel")):
            continue
        pair = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        if len(pair) == 2 and pair not in found:
            found.append(pair)
    return found


def recorded_values(card: dict | None, metas: list[dict]) -> dict[str, float]:
    """test_case_id -> the scorecard's non-seed ``metrics_current`` value of the case's primary metric."""
    primaries = {m.get("test_case_id"): m.get("primary_metric") for m in metas or []}
    out: dict[str, float] = {}
    for case in (card or {}).get("cases") or []:
        cid = case.get("test_case_id")
        record = (case.get("metrics_current") or {}).get(primaries.get(cid) or "")
        if cid in primaries and isinstance(record, dict) and _measured(record) and float(record["value"]) > 0:
            out[cid] = float(record["value"])
    return out


def _entries(git: GitStore, operator: str, head: str, unreviewed: Collection[str] = ()) -> list[dict]:
    """Index-like entries (kernel_id, tags, cases with a ``best``) of every kernel of ``operator`` at ``head``.

    A kernel of ``unreviewed`` (its harness awaits a maintainer) is marked so, as on the board:
    it is never the reference.
    """
    depth = len(operator.split("/")) + 1
    entries = []
    for path in git.list_files(operator, head):
        parts = path.split("/")
        if len(parts) != depth + 2 or parts[-2:] != [KP, DESC]:
            continue
        kid = "/".join(parts[:depth])
        try:
            desc = load_yaml(git.read_file(path, head) or b"") or {}
        except Exception:  # an unreadable desc.yaml names no tags
            desc = {}
        card = scorecard.load(git.read_file(f"{kid}/{KP}/{BENCH_RESULT}", head)) or {}
        cases = []
        for case in card.get("cases") or []:
            best = next((r for r in (case.get("metrics_best") or {}).values() if _measured(r)), None)
            cases.append({"test_case_id": case.get("test_case_id"), "best": best})
        tags = desc.get("tags") if isinstance(desc, dict) else None
        entries.append({"kernel_id": kid, "tags": tags if isinstance(tags, list) else [], "cases": cases,
                        HARNESS: UNREVIEWED if kid in unreviewed else REVIEWED})
    return entries


def choose(git: GitStore, kernel_id: str, metas: list[dict], unreviewed: Collection[str] = ()) -> dict[str, Any]:
    """The reference for a confirmation run of ``kernel_id``, read at HEAD (call with the git lock held).

    A measured reference carries its recorded value of each case (``values``). Without one (no
    kernel of the operator is measured yet, or the reference's record lacks these cases) the
    reference is chosen by the same rule among the kernels at HEAD, measured or not, with empty
    ``values``: the first run of a first record then carries it too (:func:`in_first_run`), so
    both runs measure a ratio and the two ratios are compared.
    """
    operator = "/".join(kernel_id.split("/")[:4])
    head = git.head()
    if head is None:
        return {"operator": operator, "unavailable": "the kernel repo has no commit"}
    entries = _entries(git, operator, head, unreviewed)
    ref, by_default = reference_of(entries)
    values: dict[str, float] = {}
    commit = head
    if ref is not None:
        card = scorecard.load(git.read_file(f"{ref}/{KP}/{BENCH_RESULT}", head))
        values = recorded_values(card, metas)
        primaries = {m.get("test_case_id"): m.get("primary_metric") for m in metas or []}
        commit = next((str(c["metrics_current"][primaries[c["test_case_id"]]]["commit_sha"])
                       for c in (card or {}).get("cases") or [] if c.get("test_case_id") in values), head)
    if not values:
        ref, by_default = reference_of(entries, measured_only=False)
    if ref is None:
        return {"operator": operator, "unavailable": f"operator {operator} has no kernel at HEAD to time beside it"}
    return {"operator": operator, "kernel_id": ref, "by_default": by_default, "commit": commit, "head": head,
            "kernels": declared_kernels(git.read_file(f"{ref}/{KP}/{BENCHMARK}", head)), "values": values}


def in_first_run(doc: dict[str, Any] | None, every_run: bool) -> bool:
    """Whether a first run that may be confirmed carries the chosen reference too.

    ``every_run``: the lane times it in every such run (the CPU lane by default,
    ``confirmation.cpu_reference_in_first_run``): a shared host's speed changes between jobs
    by more than any agreement, so a ratio implied from the first run's figure and the
    reference's recorded one (two different jobs) compares the host's load, not the kernel;
    timed in both runs, the two measured ratios cancel it. Otherwise (a GPU lane, whose
    noise is a hundred times smaller) only an unrecorded reference, which implies no ratio.
    """
    return doc is not None and "unavailable" not in doc and (every_run or not doc.get("values"))


def load(pending: PendingStore, sub_uuid: str) -> dict[str, Any] | None:
    """The reference chosen for ``sub_uuid``'s confirmation run, or None when none was chosen yet."""
    try:
        doc = json.loads((pending.folder(sub_uuid) / CHOICE_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def decide(pending: PendingStore, git: GitStore, sub_uuid: str, kernel_id: str,
           metas: list[dict], unreviewed: Callable[[], Collection[str]] = tuple) -> dict[str, Any]:
    """The reference of ``sub_uuid``'s confirmation run: the stored choice, else a new one, stored.

    Chosen once: a second claim of the same confirmation run (a lease that expired) ships the
    same reference, so the run that is reported always measured the stored one.
    ``unreviewed()``: the kernels whose harness awaits review at HEAD (asked only when a new
    choice is made). Call with the git lock held.
    """
    doc = load(pending, sub_uuid)
    if doc is None:
        doc = choose(git, kernel_id, metas, unreviewed())
        atomic_write_json(Path(pending.folder(sub_uuid)) / CHOICE_FILE, doc)
    return doc


def package_entries(git: GitStore, kernel_id: str, doc: dict[str, Any]) -> dict[str, bytes]:
    """{path in the runner tarball: bytes}: the reference's source area and ``reference.json``.

    Every file of the reference's folder at the chosen HEAD outside its ``.kernel_package/`` goes
    to ``<kernel_id>/.kernel_package/reference/<path>``. Call with the git lock held.
    """
    base = f"{kernel_id}/{KP}/{REFERENCE_DIR}"
    note: dict[str, Any] = {k: doc[k] for k in ("kernel_id", "commit", "kernels", "unavailable") if k in doc}
    note["status"] = "unavailable" if "unavailable" in doc else "available"
    out = {f"{base}/{REFERENCE_FILE}": (json.dumps(note, sort_keys=True, indent=1) + "\n").encode()}
    if "unavailable" in doc:
        return out
    ref = doc["kernel_id"]
    for path in git.list_files(ref, doc["head"]):
        rel = path[len(ref) + 1:]
        if rel.split("/", 1)[0] == KP:
            continue
        data = git.read_file(path, doc["head"])
        if data is not None:
            out[f"{base}/{rel}"] = data
    return out
