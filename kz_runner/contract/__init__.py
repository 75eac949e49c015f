"""The kernel package contract: kernel ids, schemas, validation, packing, hard checks, index.

Shared by the submitter tooling (``kz validate``/``pack``/``dry-run``/``index``), the
daemon (intake and result checks) and the runner (safe unpacking). Depends on pyyaml,
jsonschema and the standard library only.
"""
