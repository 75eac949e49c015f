"""``kz replay``: rebuild the state from the log alone; ``--verify`` compares it with the snapshot.

Every replay checks each line of the log (order, hash chain, known type, a transition
the reducer accepts). ``--verify`` also compares the newest snapshot with the state
replayed up to its seq, and the history projection (finished submissions) with the
records the log gives up to the projection's seq, and says which it could check: an
empty log is a failure (nothing was verified), a log without a snapshot is verified as
a log (and its projection) only.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

from kz_events import defaults

NAME = "replay"
HELP = "rebuild the state from the event log alone and print a summary (--verify: compare with the snapshot)"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``kz replay``."""
    parser.add_argument("--state-dir", default=defaults.STATE_DIR, metavar="DIR",
                        help=f"state directory (default {defaults.STATE_DIR}); the log is DIR/events")
    parser.add_argument("--verify", action="store_true",
                        help="also replay up to the newest snapshot's seq and compare; exit 1 on divergence "
                             "or when the log has no events (without a snapshot only the log is verified)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")


def _differences(a, b) -> list[str]:
    """Names of the top-level parts (and submission uuids) where two states differ."""
    diffs = []
    for part in ("seq", "queue", "kernels", "index_version", "index_head", "index_kernels",
                 "status_counts", "daemon", "mirrors", "repairs", "idempotency", "accepted", "revoking"):
        if getattr(a, part) != getattr(b, part):
            diffs.append(part)
    for uuid in sorted(set(a.submissions) | set(b.submissions)):
        if a.submissions.get(uuid) != b.submissions.get(uuid):
            diffs.append(f"submissions[{uuid}]")
    return diffs


LOG_CHECKS = "every line in order, on the hash chain, of a known type, accepted by the reducer"


def run(args: argparse.Namespace) -> int:
    """0 ok; 1 when the log is corrupt, or --verify finds a divergence or no events; 2 without a log dir."""
    from pathlib import Path

    events_dir = Path(args.state_dir) / "events"
    if not events_dir.is_dir():
        print(f"kz replay: no event log at {events_dir} (use --state-dir)", file=sys.stderr)
        return 2
    from kz_events.log.replay import replay_into
    from kz_events.log.segments import CorruptLog, EventLog
    from kz_events.state import State

    started = time.perf_counter()
    try:
        log = EventLog.open(events_dir, readonly=True)
        state = State()
        replay_into(log, state)
    except CorruptLog as exc:
        print(f"kz replay: {exc}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    doc = {"events_dir": str(events_dir), "seconds": round(seconds, 3), **state.summary()}
    verdict = 0
    if args.verify:
        from kz_events.log.snapshot import SnapshotError, list_snapshots, read_snapshot, snapshot_dir
        from kz_events.reducer import REDUCER_VERSION

        seqs = list_snapshots(events_dir)
        if state.seq == 0:
            doc["verify"] = {"ok": False, "checked": [], "snapshot": None,
                             "message": f"nothing to verify: the log in {events_dir} has no events"}
            verdict = 1
        elif not seqs:
            doc["verify"] = {"ok": True, "checked": ["log"], "snapshot": None, "seq": state.seq,
                             "message": f"verified the log only ({state.seq} events: {LOG_CHECKS}); "
                                        "no snapshot to compare with"}
        else:
            path = snapshot_dir(events_dir) / f"{seqs[-1]:020d}.snap"
            try:
                header, pos, body = read_snapshot(path)
                if header.get("reducer_version") != REDUCER_VERSION:
                    raise SnapshotError(f"{path.name} was written by reducer version "
                                        f"{header.get('reducer_version')}, this is {REDUCER_VERSION}")
                snap_state = State.from_json(body)
                rebuilt = State()
                replay_into(EventLog.open(events_dir, readonly=True), rebuilt, until=pos.seq)
                diffs = _differences(rebuilt, snap_state)
                if rebuilt.seq != pos.seq:
                    diffs.insert(0, f"the log ends at seq {rebuilt.seq}, the snapshot is at {pos.seq}")
                doc["verify"] = {"ok": not diffs, "checked": ["log", "snapshot"], "snapshot": path.name,
                                 "seq": pos.seq, "differences": diffs[:50],
                                 "message": (f"verified the log ({state.seq} events: {LOG_CHECKS}) and "
                                             f"snapshot {path.name}: the state replayed up to seq {pos.seq} "
                                             "equals it") if not diffs else ""}
                verdict = 1 if diffs else 0
            except (SnapshotError, ValueError, CorruptLog) as exc:
                doc["verify"] = {"ok": False, "checked": ["log", "snapshot"], "snapshot": path.name,
                                 "message": str(exc)}
                verdict = 1
    if args.verify and doc["verify"].get("checked") and (events_dir / "history.sqlite").exists():
        from kz_events.log.history import HistoryError
        from kz_events.log.reading import verify_history

        try:
            at, diffs = verify_history(events_dir)
        except (HistoryError, CorruptLog, OSError) as exc:
            at, diffs = 0, [f"the history projection cannot be read: {exc}"]
        doc["verify"]["checked"].append("history")
        doc["verify"]["history"] = {"ok": not diffs, "seq": at, "differences": diffs}
        if diffs:
            doc["verify"]["ok"] = False
            doc["verify"].setdefault("differences", []).extend(f"history: {d}" for d in diffs)
            verdict = 1
    if args.json:
        print(json.dumps(doc, indent=2))
    else:
        print(f"replayed {doc['seq']} events from {events_dir} in {doc['seconds']} s")
        print(f"  submissions {doc['submissions']}: "
              + ", ".join(f"{k} {v}" for k, v in doc["by_status"].items()))
        print(f"  queue: {doc['pending']} pending, {doc['in_flight']} in flight; "
              f"kernels {doc['kernels']}; index version {doc['index_version']}")
        v = doc.get("verify")
        if v is not None:
            if v.get("ok"):
                print(f"  verify: {v['message']}")
                if "history" in v:
                    print(f"  verify: the history projection equals the log's finished submissions "
                          f"up to seq {v['history']['seq']}")
            elif v.get("differences"):
                print(f"  verify: DIVERGES from {v.get('snapshot')}: " + "; ".join(v["differences"]))
            else:
                print(f"  verify: FAILED: {v.get('message', '')}"
                      + (f" ({v['snapshot']})" if v.get("snapshot") else ""))
    return verdict
