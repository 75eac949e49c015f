"""A submitted file cannot forge lines of the diff on the commit page or the kernel's diff page.

The file holds U+2028, NEL, a form feed and a lone CR, each followed by text that would read
as a diff line of its own ("+++ b/...", "@@ ... @@", "-..."). Through the real zoo (intake,
accept, the two commits) and the real pages, every line the file makes is an added line: the
page splits the diff at "\\n" only, and those characters stay inside their line as visible marks.
"""
from __future__ import annotations

import base64
import html
import re

import pytest

from kz_daemon.web.commits import diff_lines
from tests.helpers.http_server import CPU_AXPY, LiveServer, package_tarball
from tests.test_http_api import result_doc

FORGED = ("notes\u2028+++ b/FORGED-FILE\u2028@@ -1 +1 @@ FORGED-HUNK\x85-FORGED-DEL\x0c+FORGED-FORMFEED"
          "\r@@ -9 +9 @@ FORGED-CR\n")
SPAN = re.compile(r'<span class="d-(\w+)">(.*?)</span>', re.S)


def _with_notes(files: dict) -> None:
    files["notes.txt"] = FORGED.encode()


@pytest.fixture(scope="module")
def zoo(tmp_path_factory):
    live = LiveServer.start(tmp_path_factory.mktemp("forge"), kernels=[CPU_AXPY])
    with live.client() as anon, live.client("runner:r1") as runner:
        resp = live.submit(anon, CPU_AXPY, package_tarball(CPU_AXPY, mutate=_with_notes))
        assert resp.status_code == 202, resp.text
        uuid = resp.json()["uuid"]
        claim = runner.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
        body = {"lease_id": claim["lease_id"], "result": result_doc(CPU_AXPY, 40.0),
                "logs_b64": base64.b64encode(b"ok").decode(), "env": {}, "failure": None}
        view = runner.post(f"/api/submissions/{uuid}/result", json=body).json()
        if view["status"] == "queued":  # the zoo asked for a confirmation run: another runner runs it again
            with live.client("runner:r2") as r2:
                claim = r2.post("/api/runner/claim", json={"arch": "cpu", "wait": 10}).json()
                assert claim["uuid"] == uuid
                view = r2.post(f"/api/submissions/{uuid}/result", json=dict(body, lease_id=claim["lease_id"])).json()
        assert view["status"] == "accepted", view
    live.commit_sha = view["commit_sha"]
    yield live
    live.stop()


def _spans(page: str) -> list[tuple[str, str]]:
    pre = page[page.index('<pre class="diff">'):]
    pre = pre[: pre.index("</pre>")]
    return [(cls, html.unescape(text)) for cls, text in SPAN.findall(pre)]


def _assert_not_forged(spans: list[tuple[str, str]]) -> None:
    mine = [(cls, text) for cls, text in spans if "FORGED" in text]
    # every line the file makes is an added line: none became a file header, a hunk or a deletion
    assert [cls for cls, _ in mine] == ["add"] * len(mine) and all(t.startswith("+") for _, t in mine), mine
    # U+2028, NEL and the form feed stay inside their line, as visible marks
    assert mine[0][1].startswith("+notes<U+2028>+++ b/FORGED-FILE<U+2028>@@ -1 +1 @@ FORGED-HUNK<U+0085>"
                                 "-FORGED-DEL\u240c+FORGED-FORMFEED\u240d"), mine
    # git's diff cuts at the CR (a line end in a blob), so its rest is an added line of its own
    assert mine[1:] == [("add", "+@@ -9 +9 @@ FORGED-CR")], mine
    assert not any(c in text for _, text in spans for c in "\u2028\u2029\x85\x0c\r\x0b")
    assert not any(text.startswith(("+++ b/FORGED", "@@ -1 +1 @@ FORGED", "-FORGED")) for _, text in spans)


def test_the_commit_page_shows_the_file_as_one_line(zoo):
    with zoo.client() as anon:
        page = anon.get(f"/commits/{zoo.commit_sha}")
    assert page.status_code == 200
    _assert_not_forged(_spans(page.text))
    assert "\r" not in page.text and "\u2028" not in page.text


def test_the_kernels_diff_page_shows_the_file_as_one_line(zoo):
    with zoo.client() as anon:
        page = anon.get(f"/kernels/{CPU_AXPY}/diff", params={"to": zoo.commit_sha})  # the source record
    assert page.status_code == 200
    _assert_not_forged(_spans(page.text))


def test_diff_lines_split_at_newline_only():
    lines = diff_lines(b"+a\xe2\x80\xa8@@ x @@\r\n-b\x0c+c\n@@ -1 +1 @@\n+cut")
    assert [(d.cls, d.text) for d in lines] == [("add", "+a<U+2028>@@ x @@\u240d"), ("del", "-b\u240c+c"),
                                                ("hunk", "@@ -1 +1 @@"), ("add", "+cut")]
    assert [d.text for d in diff_lines(b"+a\n+partial", truncated=True)] == ["+a"]
    # the previous splitting would have made five lines of the first document, two of them forged
    assert len("+a\u2028@@ x @@\r\n-b\x0c+c\n".splitlines()) == 4
