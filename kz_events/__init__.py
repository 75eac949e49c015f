"""kz_events: the durable append-only event log, its codec, the pure reducer, snapshots and audit.

Knows nothing of the daemon: imports only the standard library.

Import paths (what the daemon uses)::

    from kz_events.log.store import Store, StorageError, StoreBroken, StoreClosed
    from kz_events.events import JobQueued, JobClaimed, ...   # the catalogue
    from kz_events.reducer import InvalidTransition, SequenceGap, next_claimable
    from kz_events.state import State, Submission, Kernel, Lease, STATUSES, TERMINAL
    from kz_events.log.segments import LogLocked, CorruptLog
    from kz_events.read.audit import verify_log, check_anchors, Finding
"""
