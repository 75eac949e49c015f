"""Turning service-layer values into API documents, and the kernel catalogue behind /api/kernels.

The index document (``zoo.index()``) is read through the few accessors here, so a
change of its shape is fixed in one place. :class:`Catalog` keeps the sorted kernel
list and the encoded first pages per index version and review marks (an entry whose
harness awaits a maintainer's review carries ``"harness": "unreviewed"``, which the board
reads), so the hot path of ``GET /api/kernels`` is a dictionary lookup.
"""
from __future__ import annotations

import dataclasses
import json
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from kz_daemon.board import outcome, ranking
from kz_daemon.config.ports import Service
from kz_daemon.core import hints
from kz_daemon.guards.harness_review import HarnessDigests, review_of
from kz_daemon.intake import review
from kz_daemon.queue import reruns
from kz_daemon.storage import run_logs as logs
from kz_events.status import TERMINAL, Status
from kz_runner.contract.kernel_id import CATEGORY_FIELDS

#: what the catalogue's harness reader keeps: at most this many parsed git trees and as many
#: (commit, kernel) digests. Each accept adds some 14 new trees on the paths the marks read (its
#: source and scorecard commits), and a status read of an older record reads that record's
#: commit, so the cache needs one head's reads and the records being looked at, not every
#: commit of the daemon's life: the reader's default (8,192 of each) grew the one-lifetime soak's
#: daemon by ~20 KB per accept for its first ~600 accepts (traced; docs/scaling.md, "Memory").
HARNESS_CACHE = 1024


def plain(value: Any) -> Any:
    """A JSON-able copy of a service value (dataclass, object with to_json, mapping, list)."""
    if hasattr(value, "to_json") and callable(value.to_json):
        return plain(value.to_json())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def index_kernels(doc: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The kernel entries of an index document, whatever container holds them."""
    if not doc:
        return []
    kernels = doc.get("kernels", [])
    if isinstance(kernels, Mapping):
        out = []
        for kernel_id, entry in kernels.items():
            entry = dict(entry)
            entry.setdefault("kernel_id", kernel_id)
            out.append(entry)
        return out
    return [dict(k) for k in kernels if isinstance(k, Mapping)]


def category(entry: Mapping[str, Any]) -> dict[str, str]:
    """``{arch, op_class, sub_class, quant}`` of an entry (from ``category`` or the path)."""
    cat = entry.get("category")
    out: dict[str, str] = {}
    if isinstance(cat, Mapping):
        out = {k: str(cat.get(k, "")) for k in CATEGORY_FIELDS}
    else:
        parts = str(entry.get("kernel_id", "")).split("/")
        out = {k: (parts[i] if i < len(parts) else "") for i, k in enumerate(CATEGORY_FIELDS)}
    return out


def is_valid(entry: Mapping[str, Any]) -> bool:
    """Whether the index marks the package valid (missing flag = valid)."""
    valid = entry.get("valid")
    return True if valid is None else bool(valid)


def status_of(entry: Mapping[str, Any]) -> str:
    """The package status (normal/frozen/deprecated)."""
    return str(entry.get("status") or "normal")


def cases(entry: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-case summaries of an index entry (test_case_id, primary_metric, best, current...)."""
    raw = entry.get("cases") or []
    if isinstance(raw, dict):
        return [dict(v, test_case_id=v.get("test_case_id", k)) for k, v in raw.items()]
    return [c for c in raw if isinstance(c, dict)]  # read-only views of the index (hot path: no copies)


def metric_value(record: Any) -> float | None:
    """The numeric value of a best/current metric record (a number or ``{value: ...}``)."""
    if isinstance(record, dict):
        record = record.get("value")
    if isinstance(record, (int, float)) and not isinstance(record, bool):
        return float(record)
    return None


def case_metric(case: Mapping[str, Any], which: str) -> dict[str, Any]:
    """``best`` or ``current`` primary-metric record of a case as ``{value, submitter, commit_sha}``."""
    for key in (which, f"{which}_primary", f"metrics_{which}"):
        record = case.get(key)
        if record is None:
            continue
        if isinstance(record, dict) and "value" not in record:
            primary = case.get("primary_metric")
            record = record.get(primary) if primary else None
        if isinstance(record, dict):
            return record
        if metric_value(record) is not None:
            return {"value": record}
    return {}


def matches(entry: Mapping[str, Any], filters: Mapping[str, str], text: str) -> bool:
    """Whether an entry passes the category/status filters and the case-insensitive text query."""
    cat = category(entry)
    for key in CATEGORY_FIELDS:
        want = filters.get(key)
        if want and cat.get(key, "") != want:
            return False
    want_status = filters.get("status")
    if want_status:
        if want_status == "invalid":
            if is_valid(entry):
                return False
        elif want_status == "valid":
            if not is_valid(entry):
                return False
        elif status_of(entry) != want_status:
            return False
    if text:
        hay = " ".join(
            str(entry.get(k) or "") for k in ("kernel_id", "name", "summary")
        ) + " " + " ".join(str(t) for t in entry.get("tags") or [])
        if text.lower() not in hay.lower():
            return False
    return True


class Catalog:
    """The kernels of the current index, sorted by kernel_id, marked by their harness review, with encoded
    pages cached per version."""

    def __init__(self, max_cached_pages: int = 256) -> None:
        self._lock = threading.Lock()
        self._doc_id: int | None = None
        self._doc: Any = None
        self._unreviewed: frozenset[str] = frozenset()
        self._kernels: list[dict[str, Any]] = []
        self._by_id: dict[str, dict[str, Any]] = {}
        self._pages: OrderedDict[tuple, bytes] = OrderedDict()
        self._memo: OrderedDict[tuple, Any] = OrderedDict()
        self._max = max_cached_pages
        self._digests: HarnessDigests | None = None

    def digests(self, history: Any) -> HarnessDigests | None:
        """The harness hashes of the repo ``history`` reads (one reader per catalogue; None without a repo)."""
        if history is None:
            return None
        found = self._digests
        if found is None or found.repo_path != history.repo_path:
            found = self._digests = HarnessDigests(history.repo_path, cache_size=HARNESS_CACHE)
        return found

    def refresh(self, doc: Mapping[str, Any] | None, unreviewed: frozenset[str] | None = None) -> None:
        """Adopt ``doc`` (and the kernels whose harness is ``unreviewed``; None keeps the marks held) if either
        differs from what is held."""
        marks = self._unreviewed if unreviewed is None else unreviewed
        if doc is self._doc and self._doc_id == id(doc) and marks == self._unreviewed:
            return
        kernels = sorted(index_kernels(doc), key=lambda e: str(e.get("kernel_id", "")))
        for entry in kernels:  # copies of the index's entries: the mark never reaches index.json
            if entry.get("kernel_id") in marks:
                entry[ranking.HARNESS] = ranking.UNREVIEWED
        with self._lock:
            self._doc, self._doc_id, self._unreviewed = doc, id(doc), marks
            self._kernels = kernels
            self._by_id = {str(k.get("kernel_id")): k for k in kernels}
            self._pages.clear()
            self._memo.clear()

    def memo(self, key: tuple, compute: Callable[[], Any]) -> Any:
        """``compute()`` once per index version and ``key`` (a small LRU shared by the pages)."""
        with self._lock:
            if key in self._memo:
                self._memo.move_to_end(key)
                return self._memo[key]
        value = compute()
        with self._lock:
            self._memo[key] = value
            while len(self._memo) > 64:
                self._memo.popitem(last=False)
        return value

    def kernels(self) -> list[dict[str, Any]]:
        """All entries, sorted by kernel_id."""
        return self._kernels

    def get(self, kernel_id: str) -> dict[str, Any] | None:
        """One entry by kernel_id."""
        return self._by_id.get(kernel_id)

    def facets(self) -> dict[str, list[str]]:
        """The distinct values of each category field (for the leaderboard's filter menus)."""
        out: dict[str, set[str]] = {k: set() for k in CATEGORY_FIELDS}
        for entry in self._kernels:
            for key, value in category(entry).items():
                if value:
                    out[key].add(value)
        return {k: sorted(v) for k, v in out.items()}

    def select(self, filters: Mapping[str, str], text: str) -> list[dict[str, Any]]:
        """Entries passing the filters, in kernel_id order."""
        if not text and not any(filters.values()):
            return self._kernels
        return [e for e in self._kernels if matches(e, filters, text)]

    def page_bytes(self, filters: Mapping[str, str], text: str, page: int, per_page: int) -> bytes:
        """The encoded ``GET /api/kernels`` document for one page (cached per index version)."""
        key = (tuple(sorted(filters.items())), text, page, per_page)
        with self._lock:
            hit = self._pages.get(key)
            if hit is not None:
                self._pages.move_to_end(key)
                return hit
        selected = self.select(filters, text)
        start = (page - 1) * per_page
        body = {
            "kernels": selected[start:start + per_page],
            "total": len(selected),
            "page": page,
            "per_page": per_page,
            "pages": (len(selected) + per_page - 1) // per_page,
        }
        encoded = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str).encode()
        with self._lock:
            self._pages[key] = encoded
            while len(self._pages) > self._max:
                self._pages.popitem(last=False)
        return encoded


def submission_doc(view: Any, status_url: str | None = None, zoo: Service | None = None,
                   digests: HarnessDigests | None = None) -> dict[str, Any]:
    """The status document of a submission view (uuid, status, reasons, cases, commit_sha...).

    ``digests`` reads harness hashes for an accepted record's review (the catalogue's, cached);
    without it one is made for the call.
    """
    doc = plain(view)
    if not isinstance(doc, dict):
        doc = {"value": doc}
    doc.setdefault("reasons", [])
    doc.setdefault("commit_sha", None)
    if not isinstance(doc.get("cases"), list):  # the view's case summaries (never the stored run)
        doc["cases"] = []
    doc["terminal"] = doc.get("status") in TERMINAL
    result = doc.get("result")
    if isinstance(result, dict) and "outcome" in result:  # what the accept changed (accept.completed v2)
        doc["outcome"] = result.pop("outcome")
    if status_url:
        doc["status_url"] = status_url
    doc["reasons"] = [hints.with_hint(r) for r in doc["reasons"]]
    sub_uuid = str(doc.get("uuid") or "")
    if zoo is not None and sub_uuid:
        add_run_logs(doc, zoo, sub_uuid)
        add_queue_warning(doc, zoo)
        add_hold(doc, zoo, sub_uuid)
        add_reruns(doc, zoo, sub_uuid)
        add_harness_review(doc, zoo, digests)
    return doc


def add_harness_review(doc: dict[str, Any], zoo: Service, digests: HarnessDigests | None = None) -> None:
    """``harness`` of an accepted record: ``reviewed``, or ``unreviewed`` while no maintainer approved the harness
    it was measured under (a submission brought it); then its ``outcome`` names no best and no rank after."""
    commit, kernel_id = doc.get("commit_sha"), doc.get("kernel_id")
    if doc.get("status") != Status.ACCEPTED or not commit or not kernel_id:
        return
    mark = review_of(zoo.store, digests or HarnessDigests(zoo.config.paths.repo), str(kernel_id), str(commit))
    doc[ranking.HARNESS] = mark
    if mark == ranking.UNREVIEWED and isinstance(doc.get("outcome"), dict):
        doc["outcome"] = outcome.under_review(doc["outcome"])


def add_run_logs(doc: dict[str, Any], zoo: Service, sub_uuid: str) -> None:
    """``logs_url`` once a run was reported, and ``log_tails`` when the run sent any (a file read)."""
    if not isinstance(doc.get("result"), dict):
        return
    doc["logs_url"] = f"/api/submissions/{sub_uuid}/logs"
    tails = logs.load_tails(zoo.pending.run_folder(sub_uuid))
    if tails:
        doc["log_tails"] = tails


def add_reruns(doc: dict[str, Any], zoo: Service, sub_uuid: str) -> None:
    """``reruns``: an accepted (or revoked) record's reruns, oldest first, each beside the record's figures."""
    if doc.get("status") not in (Status.ACCEPTED, Status.REVOKED):
        return
    with zoo.store.lock:
        found = reruns.of_record(zoo.store.state, sub_uuid)
    if found:
        doc["reruns"] = found


def add_hold(doc: dict[str, Any], zoo: Service, sub_uuid: str) -> None:
    """``held``: the rules that hold a held submission and their evidence (a file read), so a submitter sees why."""
    if doc.get("status") != Status.HELD:
        return
    evidence = [f for f in review.evidence_of(zoo, sub_uuid) if isinstance(f, dict)]
    doc["held"] = {"rules": sorted({str(f.get("rule")) for f in evidence if f.get("rule")}), "evidence": evidence}


def add_queue_warning(doc: dict[str, Any], zoo: Service) -> None:
    """``queue_warning`` for a queued job no live runner serves (a job waiting in silence otherwise)."""
    if doc.get("status") == Status.QUEUED:
        warning = zoo.queue_warning(doc.get("arch"))
        if warning:
            doc["queue_warning"] = warning


def changed(before: Mapping[str, Any], after: Mapping[str, Any], keys: Iterable[str] = ()) -> bool:
    """Whether two status documents differ (ignoring volatile keys)."""
    skip = set(keys)
    a = {k: v for k, v in before.items() if k not in skip}
    b = {k: v for k, v in after.items() if k not in skip}
    return a != b
