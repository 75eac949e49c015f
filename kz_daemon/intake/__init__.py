"""From a spool file to ``queued``, ``held`` or ``rejected``: the spool, idempotency keys, admission, human review."""
