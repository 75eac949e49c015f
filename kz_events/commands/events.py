"""``kz events tail|show``: read the event log (read-only; works beside a running daemon)."""
from __future__ import annotations

import argparse
import json
import sys

NAME = "events"
HELP = "read the event log: 'tail' the latest events, 'show UUID' a submission's full story"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``kz events``."""
    sub = parser.add_subparsers(dest="events_command", metavar="{tail,show}")
    tail = sub.add_parser("tail", help="print the last events (optionally follow new ones)")
    tail.add_argument("--state-dir", default="./kz-data", metavar="DIR",
                      help="state directory (default ./kz-data); the log is DIR/events")
    tail.add_argument("-n", type=int, default=20, metavar="N", help="how many events (default 20)")
    tail.add_argument("--follow", "-f", action="store_true", help="keep printing new events")
    tail.add_argument("--json", action="store_true", help="print the raw JSON lines")
    show = sub.add_parser("show", help="a submission's full story, from the log")
    show.add_argument("uuid", metavar="UUID", help="submission uuid")
    show.add_argument("--state-dir", default="./kz-data", metavar="DIR",
                      help="state directory (default ./kz-data); the log is DIR/events")
    show.add_argument("--json", action="store_true",
                      help="print {submission, status, events} as one JSON document")


def _emit(event: dict, as_json: bool) -> None:
    from kz_events.codec import canonical_bytes
    from kz_events.story import format_event

    if as_json:
        sys.stdout.write(canonical_bytes(event).decode("utf-8") + "\n")
    else:
        sys.stdout.write(format_event(event) + "\n")


def run(args: argparse.Namespace) -> int:
    """0 ok; 1 for ``show`` of an unknown uuid; 2 when there is no log or no subcommand."""
    from pathlib import Path

    cmd = getattr(args, "events_command", None)
    if cmd is None:
        print("kz events: say 'tail' or 'show UUID'", file=sys.stderr)
        return 2
    events_dir = Path(args.state_dir) / "events"
    if not events_dir.is_dir():
        print(f"kz events: no event log at {events_dir} (use --state-dir)", file=sys.stderr)
        return 2
    from kz_events import story

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
    events = story.submission_events(events_dir, args.uuid)
    if not events:
        print(f"kz events: no events for submission {args.uuid} in {events_dir}", file=sys.stderr)
        return 1
    from kz_events.replay import load_state

    try:
        submission = load_state(events_dir).submissions.get(args.uuid)
    except Exception as exc:  # the story is still worth showing from the raw lines
        print(f"kz events: could not rebuild the state ({exc}); showing raw events",
              file=sys.stderr)
        submission = None
    if args.json:
        doc = {"submission": args.uuid,
               "status": submission.status if submission else None,
               "kernel_id": submission.kernel_id if submission else None,
               "sha_src": submission.sha_src if submission else None,
               "reasons": submission.reasons if submission else None,
               "events": events}
        print(json.dumps(doc, indent=2, ensure_ascii=False))
    else:
        print(story.render_story(args.uuid, events, submission))
    return 0
