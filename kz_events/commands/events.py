"""``kz events tail|show``: read the event log (read-only; works beside a running daemon)."""
from __future__ import annotations

import argparse
import json
import sys

from kz_events import defaults

NAME = "events"
HELP = "read the event log: 'tail' the latest events, 'show UUID' a submission's full story"
#: how many candidates an ambiguous prefix lists before saying "and N more"
SHOWN_CANDIDATES = 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``kz events``."""
    sub = parser.add_subparsers(dest="events_command", metavar="{tail,show}")
    tail = sub.add_parser("tail", help="print the last events (optionally follow new ones)")
    tail.add_argument("--state-dir", default=defaults.STATE_DIR, metavar="DIR",
                      help=f"state directory (default {defaults.STATE_DIR}); the log is DIR/events")
    tail.add_argument("-n", type=int, default=20, metavar="N", help="how many events (default 20)")
    tail.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    tail.add_argument("--json", action="store_true", help="print the raw JSON lines")
    show = sub.add_parser("show", help="a submission's full story, from the log")
    show.add_argument("uuid", metavar="UUID",
                      help="submission uuid, a unique prefix of it (tail prints 8 characters), "
                           "or the seq number of one of its events")
    show.add_argument("--state-dir", default=defaults.STATE_DIR, metavar="DIR",
                      help=f"state directory (default {defaults.STATE_DIR}); the log is DIR/events")
    show.add_argument("--json", action="store_true",
                      help="print {submission, status, events} as one JSON document")


def _emit(event: dict, as_json: bool) -> None:
    from kz_events.codec import canonical_bytes
    from kz_events.read.story import format_event

    if as_json:
        sys.stdout.write(canonical_bytes(event).decode("utf-8") + "\n")
    else:
        sys.stdout.write(format_event(event) + "\n")


def matching_submissions(events_dir, token: str, known) -> dict[str, str]:
    """The submissions ``token`` may name, each with why: a uuid prefix, or the seq of one of its events.

    ``known`` holds every submission uuid of the log that starts with ``token`` (or more).
    A full uuid matches itself only.
    """
    from kz_events.read import story

    if token in known:
        return {token: "uuid"}
    low = token.lower()
    found = {uuid: "uuid prefix" for uuid in known if uuid.lower().startswith(low)}
    if token.isdigit() and int(token) > 0:
        seq = int(token)
        event = next(iter(story.iter_events(events_dir, after_seq=seq - 1)), None)
        subject = (event or {}).get("subject") or {}
        if event is not None and event.get("seq") == seq and subject.get("submission"):
            found.setdefault(subject["submission"], f"subject of event seq {seq}")
    return found


def _known_uuids(events_dir, view, token: str) -> set[str]:
    """The submission uuids ``token`` may be a prefix of: from the state and the history
    projection, else from the raw lines."""
    from kz_events.read import story

    if view is not None:
        return set(view.uuids(token.lower()))
    return {e["subject"]["submission"] for e in story.iter_events(events_dir, contains=b'"submission"')
            if (e.get("subject") or {}).get("submission")}


def run(args: argparse.Namespace) -> int:
    """0 ok; 1 for ``show`` of an unknown submission; 2 when there is no log, no subcommand,
    or an ambiguous prefix (the candidates are listed)."""
    from pathlib import Path

    cmd = getattr(args, "events_command", None)
    if cmd is None:
        print("kz events: say 'tail' or 'show UUID'", file=sys.stderr)
        return 2
    events_dir = Path(args.state_dir) / "events"
    if not events_dir.is_dir():
        print(f"kz events: no event log at {events_dir} (use --state-dir)", file=sys.stderr)
        return 2
    from kz_events.read import story

    if cmd == "tail":
        last = 0
        for event in story.tail_events(events_dir, max(0, args.n)):
            _emit(event, args.json)
            last = event["seq"]
        sys.stdout.flush()
        if args.follow:
            if last == 0:
                tail = story.tail_events(events_dir, 1)
                last = tail[-1]["seq"] if tail else 0
            try:
                for event in story.follow_events(events_dir, last):
                    _emit(event, args.json)
                    sys.stdout.flush()
            except KeyboardInterrupt:
                pass  # Ctrl-C ends --follow; everything shown was complete
        return 0
    from kz_events.log.reading import open_view

    try:
        view = open_view(events_dir)
    except Exception as exc:  # the story is still worth showing from the raw lines
        print(f"kz events: could not rebuild the state ({exc}); showing raw events",
              file=sys.stderr)
        view = None
    try:
        return _show(args, events_dir, view)
    finally:
        if view is not None:
            view.close()


def _show(args: argparse.Namespace, events_dir, view) -> int:
    """``kz events show``'s answer, read through ``view`` (None: from the raw lines only)."""
    from kz_events.read import story

    found = matching_submissions(events_dir, args.uuid, _known_uuids(events_dir, view, args.uuid))
    if not found:
        print(f"kz events: no submission matches {args.uuid!r} (not a uuid, a uuid prefix, or the "
              f"seq of a submission's event) in {events_dir}", file=sys.stderr)
        return 1
    if len(found) > 1:
        print(f"kz events: {args.uuid!r} is ambiguous; it matches {len(found)} submissions:",
              file=sys.stderr)
        for uuid, why in sorted(found.items())[:SHOWN_CANDIDATES]:
            print(f"  {uuid}  ({why})", file=sys.stderr)
        if len(found) > SHOWN_CANDIDATES:
            print(f"  ... and {len(found) - SHOWN_CANDIDATES} more; give more characters",
                  file=sys.stderr)
        return 2
    (uuid,) = found
    events = story.submission_events(events_dir, uuid)
    if not events:
        print(f"kz events: no events for submission {uuid} in {events_dir}", file=sys.stderr)
        return 1
    submission = view.submission(uuid) if view is not None else None
    if args.json:
        doc = {"submission": uuid,
               "status": submission.status if submission else None,
               "kernel_id": submission.kernel_id if submission else None,
               "sha_src": submission.sha_src if submission else None,
               "reasons": submission.reasons if submission else None,
               "events": events}
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print(story.render_story(uuid, events, submission))
    return 0
