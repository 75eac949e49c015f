"""Short ids: the 8-character uuid prefixes ``kz`` prints, resolved against the submissions a command may name.

``kz events tail``, the pages and the CLI's tables show a submission as the first 8
characters of its uuid; a command that takes a uuid takes such a prefix too, when it
names exactly one of the candidates (for ``kz revoke``: the accepted records). A full
uuid is taken as it is, so a command still answers NOT_FOUND or CONFLICT for it as it
did; an unknown prefix is NOT_FOUND and one that starts several candidates is
AMBIGUOUS_ID, with the candidates in the details. Pure functions over the State.
"""
from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from typing import Any

from kz_daemon.core.errors import ZooError

__all__ = ["MIN_PREFIX", "SHOWN", "resolve", "records"]

#: the fewest characters a prefix must have (as git asks of a short SHA)
MIN_PREFIX = 4
#: how many candidates an ambiguous prefix lists
SHOWN = 10
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PREFIX = re.compile(r"^[0-9a-f-]+$")


def records(state: Any) -> Iterator[str]:
    """The uuids of the accepted records the State knows (and those whose revocation is under way).

    Finished submissions may stay in ``state.submissions`` with their status, or be kept
    compactly (``state.accepted``, ``state.revoking``); either way they are found.
    """
    for table in ("accepted", "revoking"):
        yield from getattr(state, table, None) or ()
    for uuid, sub in getattr(state, "submissions", {}).items():
        if getattr(sub, "status", None) in ("accepted", "revoked"):
            yield uuid


def resolve(token: str, candidates: Iterable[str], what: str = "submission") -> str:
    """The one candidate ``token`` names: itself when it is a full uuid, else the candidate it starts.

    ZooError BAD_REQUEST for something that is neither a uuid nor a prefix of at least
    ``MIN_PREFIX`` hex digits, NOT_FOUND when no candidate starts with it, AMBIGUOUS_ID
    (details.candidates) when several do.
    """
    low = token.strip().lower()
    if _UUID.match(low):
        return low
    if len(low.replace("-", "")) < MIN_PREFIX or not _PREFIX.match(low):
        raise ZooError("BAD_REQUEST", f"{token!r} is neither a uuid nor a prefix of one (at least {MIN_PREFIX} "
                       "hex digits, as kz prints them: the first 8)", {"id": token})
    found = sorted({c for c in candidates if c.lower().startswith(low)})
    if not found:
        raise ZooError("NOT_FOUND", f"no {what} starts with {token!r}", {"id": token})
    if len(found) > 1:
        listed = ", ".join(found[:SHOWN]) + (f" and {len(found) - SHOWN} more" if len(found) > SHOWN else "")
        raise ZooError("AMBIGUOUS_ID", f"{token!r} starts {len(found)} {what}s ({listed}); give more of the uuid",
                       {"id": token, "candidates": found[:SHOWN], "count": len(found)})
    return found[0]
