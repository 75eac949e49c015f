"""kz_events: the durable append-only event log, its codec, the pure reducer, snapshots and audit.

Knows nothing of the daemon: imports only the standard library.
"""
