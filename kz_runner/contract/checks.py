"""The server-side hard checks on a reported benchmark result.

The daemon applies them to every result a runner reports; ``kz dry-run`` applies
the same functions locally, so a submitter sees the server's verdict before
submitting. Bad input is an expected outcome: every function returns values
(:class:`CheckVerdict`, :class:`~kz_runner.contract.problems.Problem`) and never raises
for anything a benchmark can print.

Stable codes (agents switch on them; the HTTP layer answers 422 for RESULT_INVALID):

=========================  =============================================================
code                       rule that was violated
=========================  =============================================================
BAD_OUTPUT                 stdout is not exactly one JSON document (empty, not JSON,
                           not UTF-8, or anything but whitespace before/after it), or
                           the document holds a string or key that is not valid
                           Unicode (a lone surrogate such as ``"\\ud800"``): it could
                           not be stored, committed or shown
RESULT_NONFINITE           a NaN or Infinity anywhere in the document (``NaN``,
                           ``Infinity`` literals, or a number that overflows to inf)
RESULT_SCHEMA              the document does not match schemas/benchmark_output.json
RESULT_KERNEL_ID           ``kernel_id`` differs from the submission's kernel_id
RESULT_CASES               the set of ``cases[].test_case_id`` differs from the
                           KERNEL_ZOO_TEST_CASE_METAS set (missing, extra or duplicate ids)
ACCEPT_NOT_ALL_PASSED      ``overall.accept`` is true but a case's correctness is not
                           ``passed``
BUILD_FAILED               ``overall.build_ok`` is false (the result is a reject, with
                           the build's reason)
RESULT_INVALID             a case has ``correctness: failed`` and ``accept: true``
                           (HTTP 422; the submission is rejected as well)
=========================  =============================================================

A result is *accepted* when no check fails and the package itself says
``overall.accept: true``; otherwise :attr:`CheckVerdict.reason` says why not.
"""
from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kz_runner.contract.problems import ERROR, Problem, clip
from kz_runner.contract.schema_check import nonfinite_paths

# code -> what to do about it (the table above says what it means).
HINTS: dict[str, str] = {
    "BAD_OUTPUT": "Print exactly one JSON document on stdout and send every log line to stderr "
                  "(print(..., file=sys.stderr)); kz_runner.bench.Harness guards stdout for you. Every "
                  "string in it must be valid Unicode (no lone surrogates such as \\ud800).",
    "RESULT_NONFINITE": "Report finite numbers only; drop a metric you could not measure and set the case's error.",
    "RESULT_SCHEMA": "Fix the field named in the problem; see schemas/benchmark_output.json.",
    "RESULT_KERNEL_ID": "Print the package's kernel_id (its path in the kernel repo), e.g. from bench_result.yaml.",
    "RESULT_CASES": "Report exactly one case per KERNEL_ZOO_TEST_CASE_METAS entry, even a failed one.",
    "ACCEPT_NOT_ALL_PASSED": "Set overall.accept to the AND of the cases: true only when every case passed.",
    "BUILD_FAILED": "Fix build_test_env.py; the runner's logs carry its stderr.",
    "RESULT_INVALID": "A case whose correctness failed must have accept: false.",
}
CODES = tuple(HINTS)
STDOUT = "stdout"
SNIPPET = 80


def _problem(code: str, message: str, field_: str | None = None) -> Problem:
    return Problem(code=code, message=message, severity=ERROR, file=STDOUT, field=field_, hint=HINTS[code])


def _snippet(text: str) -> str:
    text = text.strip()
    return json.dumps(text if len(text) <= SNIPPET else text[:SNIPPET] + "…", ensure_ascii=False)


@dataclass(frozen=True)
class CheckVerdict:
    """The hard checks' outcome for one result."""

    # no hard check failed and the package's own overall.accept is true
    accepted: bool
    # every failed hard check, in rule order
    problems: tuple[Problem, ...] = ()
    # overall.accept as the package reported it (None when unreadable)
    package_accept: bool | None = None
    # one line: the first problem, the package's accept_reason, or "accepted"
    reason: str = ""
    # the parsed document (None when stdout was not one JSON document)
    document: Any = field(default=None, compare=False, repr=False)

    @property
    def codes(self) -> tuple[str, ...]:
        """The problem codes, in order."""
        return tuple(p.code for p in self.problems)

    @property
    def invalid(self) -> bool:
        """True when a case claims accept with failed correctness (the HTTP layer answers 422)."""
        return "RESULT_INVALID" in self.codes

    @property
    def http_status(self) -> int:
        """422 for RESULT_INVALID, else 200 (a rejection is still a well-formed report)."""
        return 422 if self.invalid else 200

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (without the document)."""
        return {
            "accepted": self.accepted,
            "package_accept": self.package_accept,
            "reason": self.reason,
            "problems": [p.to_json() for p in self.problems],
        }


def parse_output(data: bytes | str) -> tuple[Any, tuple[Problem, ...]]:
    """Parse stdout that must be exactly one JSON document (surrounding whitespace allowed).

    Returns ``(document, ())`` or ``(None, (BAD_OUTPUT problem,))`` naming what was found.
    NaN/Infinity literals parse (to float nan/inf) so :func:`check_result` can name where they are.
    """
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            return None, (_problem("BAD_OUTPUT", f"stdout is not UTF-8 text (byte {exc.start})"),)
    else:
        text = data
    if text.startswith("\ufeff"):
        return None, (_problem("BAD_OUTPUT", "stdout starts with a byte-order mark; print plain JSON"),)
    start = len(text) - len(text.lstrip())
    if start == len(text):
        what = "empty" if not text else "only whitespace"
        return None, (_problem("BAD_OUTPUT", f"stdout is {what}; expected one JSON document"),)
    decoder = json.JSONDecoder(parse_constant=float)
    try:
        doc, end = decoder.raw_decode(text, start)
    except json.JSONDecodeError as exc:
        line = text[start:].splitlines()[0] if text[start:] else ""
        return None, (_problem(
            "BAD_OUTPUT",
            f"stdout does not start with a JSON document ({exc.msg} at line {exc.lineno} column {exc.colno}); "
            f"first line: {_snippet(line)}"),)
    rest = text[end:]
    if rest.strip():
        extra = rest.lstrip()
        lineno = text.count("\n", 0, len(text) - len(extra)) + 1
        kind = "a second JSON document" if _starts_json(extra) else "extra text"
        return None, (_problem(
            "BAD_OUTPUT",
            f"stdout has {kind} after the first JSON document, at line {lineno}: {_snippet(extra.splitlines()[0])}"),)
    return doc, ()


def _starts_json(text: str) -> bool:
    try:
        json.JSONDecoder().raw_decode(text)
    except ValueError:
        return False
    return True



def _shown_key(key: Any) -> str:
    """A dict key as a path segment that is itself valid UTF-8 (a surrogate is written as ``\\udXXX``)."""
    return str(key).encode("utf-8", "backslashreplace").decode("utf-8")


def unencodable_paths(value: Any, path: str = "") -> list[str]:
    """JSON paths of every string (value or key) inside ``value`` that UTF-8 cannot encode.

    Such a string (a lone surrogate, which JSON's ``\\ud800`` escape produces) passes
    ``json.loads`` but breaks every later write: the event log, a commit message, the
    status document. The paths are themselves encodable.
    """
    if not path:
        try:  # the common case in one C pass: nothing to name
            json.dumps(value, ensure_ascii=False).encode("utf-8")
            return []
        except (UnicodeEncodeError, TypeError, ValueError):
            pass
    out: list[str] = []
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            out.append(path or "$")
    elif isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{_shown_key(key)}" if path else _shown_key(key)
            if isinstance(key, str) and unencodable_paths(key, where):
                out.append(where + " (the key)")
            out.extend(unencodable_paths(item, where))
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            out.extend(unencodable_paths(item, f"{path}[{index}]"))
    return out


def _schema_problems(doc: Any) -> list[Problem]:
    from kz_runner.contract.schema_check import json_path, validator

    check = validator("benchmark_output")
    out = []
    errors = sorted(check.iter_errors(doc), key=lambda e: (json_path(e.absolute_path), e.message))
    for error in errors[:20]:
        out.append(_problem("RESULT_SCHEMA", clip(error.message, 300), json_path(error.absolute_path) or None))
    if len(errors) > 20:
        out.append(_problem("RESULT_SCHEMA", f"... and {len(errors) - 20} more schema errors"))
    return out


def check_result(doc: Any, *, kernel_id: str, case_ids: Iterable[str]) -> CheckVerdict:
    """Apply every hard check to a parsed result; ``case_ids`` is the METAS id set."""
    unencodable = unencodable_paths(doc)
    if unencodable:  # checked alone: the other checks' messages would quote the broken strings
        found = _problem("BAD_OUTPUT", clip("the document holds text that is not valid Unicode (a lone surrogate) "
                                            "at " + ", ".join(unencodable[:10])
                                            + (f" and {len(unencodable) - 10} more" if len(unencodable) > 10 else ""),
                                            300), clip(unencodable[0], 120))
        return CheckVerdict(False, (found,), None, f"BAD_OUTPUT: {found.message}", None)
    problems: list[Problem] = []
    bad = list(nonfinite_paths(doc))
    if bad:
        problems.append(_problem("RESULT_NONFINITE", f"NaN/Infinity at {', '.join(bad[:10])}"
                                 + (f" and {len(bad) - 10} more" if len(bad) > 10 else ""), bad[0]))
    # The schema cannot say "finite"; keep its errors about other things only.
    problems.extend(_schema_problems(doc))
    if not isinstance(doc, dict):
        return _verdict(doc, problems, None)

    reported_id = doc.get("kernel_id")
    if reported_id != kernel_id:
        problems.append(_problem("RESULT_KERNEL_ID",
                                 f"the benchmark's document says kernel_id {reported_id!r} but this submission is "
                                 f"{kernel_id!r}: the benchmark must print the kernel_id of the package it measures",
                                 "kernel_id"))

    listed = doc.get("cases")
    cases = [c for c in listed if isinstance(c, dict)] if isinstance(listed, list) else []
    # an id that is not a string (the schema's error above) is counted by its repr: a list or a dict
    # would not hash, and the checks must decide on any document a benchmark prints
    ids = [cid if isinstance(cid := c.get("test_case_id"), str) else repr(cid) for c in cases]
    expected = set(case_ids)
    seen, dupes = set(), []
    for cid in ids:
        if cid in seen and cid not in dupes:
            dupes.append(cid)
        seen.add(cid)
    missing = sorted(expected - seen)
    extra = sorted(str(x) for x in seen - expected)
    if missing or extra or dupes:
        parts = []
        if missing:
            parts.append(f"missing {missing}")
        if extra:
            parts.append(f"not in METAS {extra}")
        if dupes:
            parts.append(f"reported more than once {sorted(map(str, dupes))}")
        problems.append(_problem("RESULT_CASES", "cases differ from KERNEL_ZOO_TEST_CASE_METAS: " + "; ".join(parts),
                                 "cases"))

    overall = doc.get("overall")
    if not isinstance(overall, dict):
        overall = {}
    package_accept = overall.get("accept") if isinstance(overall.get("accept"), bool) else None
    if package_accept:
        not_passed = [f"{c.get('test_case_id')}={c.get('correctness')}" for c in cases
                      if c.get("correctness") != "passed"]
        if not_passed:
            problems.append(_problem("ACCEPT_NOT_ALL_PASSED",
                                     f"overall.accept is true but not every case passed: {', '.join(not_passed)}",
                                     "overall.accept"))
    if overall.get("build_ok") is False:
        reason = overall.get("accept_reason")
        problems.append(_problem("BUILD_FAILED", "the build step failed" + (f": {reason}" if reason else ""),
                                 "overall.build_ok"))
    for i, case in enumerate(cases):
        if case.get("correctness") == "failed" and case.get("accept") is True:
            problems.append(_problem("RESULT_INVALID",
                                     f"case {case.get('test_case_id')!r} has correctness=failed and accept=true",
                                     f"cases[{i}].accept"))
    return _verdict(doc, problems, package_accept)


def _verdict(doc: Any, problems: list[Problem], package_accept: bool | None) -> CheckVerdict:
    if problems:
        reason = f"{problems[0].code}: {problems[0].message}"
        return CheckVerdict(False, tuple(problems), package_accept, reason, doc)
    overall = doc.get("overall", {})
    if not package_accept:
        return CheckVerdict(False, (), package_accept, "rejected by the package: " + str(overall.get("accept_reason") or
                                                                                  "overall.accept is false"), doc)
    return CheckVerdict(True, (), True, str(overall.get("accept_reason") or "accepted"), doc)


def check_output(stdout: bytes | str, *, kernel_id: str, case_ids: Iterable[str]) -> CheckVerdict:
    """:func:`parse_output` then :func:`check_result`: the verdict on a benchmark's raw stdout."""
    doc, problems = parse_output(stdout)
    if problems:
        return CheckVerdict(False, problems, None, f"{problems[0].code}: {problems[0].message}", None)
    return check_result(doc, kernel_id=kernel_id, case_ids=case_ids)
