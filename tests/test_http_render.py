"""The page building blocks: safe markdown, templates, chart geometry, Prometheus text, the token bucket."""
from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from kz_daemon.api.metrics import HttpCounters, render_metrics
from kz_daemon.api.rate_limits import TokenBucket
from kz_daemon.api.views import Catalog, case_metric, matches
from kz_daemon.config.tokens import TokenStore
from kz_daemon.core.errors import ZooError
from kz_daemon.http.app import create_app
from kz_daemon.storage.pending import LOGS_FILE, PendingStore
from kz_daemon.web import charts as web_charts
from kz_daemon.web.pages import log_blocks
from kz_daemon.web.render import TEMPLATES, fmt_speedup, markdown

SVG = "{http://www.w3.org/2000/svg}"


@pytest.mark.parametrize("hostile", [
    "<script>alert(1)</script>",
    '<img src=x onerror="alert(1)">',
    "[click](javascript:alert(1))",
    "[x](JaVaScRiPt:alert(1))",
    '<a href="http://evil">x</a>',
    "```\n</code></pre><script>x()</script>\n```",
    "`<b>`",
    "**<i onclick=x>**",
    "[a](data:text/html;base64,PHNjcmlwdD4=)",
    "[v](vbscript:msgbox(1))",
    "```js\" onmouseover=\"x\nbody\n```",
])
def test_markdown_never_passes_raw_html(hostile):
    out = str(markdown(hostile))
    assert "<script" not in out.lower()
    assert "<img" not in out.lower()
    hrefs = re.findall(r'<a\s[^>]*href="([^"]*)"', out)
    assert not [h for h in hrefs if not h.startswith(("https://", "http://", "/", "./", "#"))], out
    assert '<a href="http://evil"' not in out
    allowed = {"p", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "pre", "code", "a", "strong", "em",
               "blockquote", "hr", "br", "table", "thead", "tbody", "tr", "th", "td"}
    for tag, attrs in re.findall(r"</?([A-Za-z0-9]+)([^>]*)>", out):
        assert tag in allowed, out
        assert set(re.findall(r"([a-z-]+)=", attrs)) <= {"href", "rel", "class", "start"}, out


def test_markdown_formats_the_guide_sections():
    text = ("## 数学定义\nO = softmax(QK^T / sqrt(d)) V, see [paper](https://arxiv.org/abs/1706.03762).\n\n"
            "- **Q** is `[B, H, S, D]`\n- *fp16* inputs\n\n1. first\n2. second\n\n"
            "```python\nx = a < b\n```\n\n| n | ms |\n|---|---|\n| 4k | 1.5 |\n")
    out = str(markdown(text))
    assert "<h3>数学定义</h3>" in out  # the page owns h1, so headings move one level down
    assert '<a href="https://arxiv.org/abs/1706.03762" rel="nofollow noopener">paper</a>' in out
    assert "<li><strong>Q</strong> is <code>[B, H, S, D]</code></li>" in out
    assert "<em>fp16</em>" in out
    assert re.search(r"<ol>\s*<li>first</li>\s*<li>second</li>\s*</ol>", out)
    assert '<pre><code class="language-python">x = a &lt; b\n</code></pre>' in out
    assert "<td>4k</td>" in out
    assert markdown(None) == "" and markdown(42) == ""


def test_templates_autoescape_every_value():
    template = TEMPLATES.env.from_string("{{ v }}|{{ v | markdown }}")
    out = template.render(v="<b onclick=x>hi</b>")
    assert out.startswith("&lt;b onclick=x&gt;hi&lt;/b&gt;|")
    assert "<b" not in out


def test_speedup_format():
    assert fmt_speedup(4.0) == "4×" and fmt_speedup(2.7333) == "2.73×" and fmt_speedup(250.4) == "250×"
    assert fmt_speedup(None) == ""


def _chart_svg(chart) -> ET.Element:
    macro = TEMPLATES.env.from_string('{% import "macros.html" as m %}{{ m.chart(c) }}')
    html = macro.render(c=chart)
    svg = html[html.index("<svg"): html.index("</svg>") + 6]
    return ET.fromstring(svg)


def test_chart_is_well_formed_escapes_labels_and_links_points():
    chart = web_charts.line_chart({"small: <lat>": [(1, 1.5, "a<b", "/commits/abc"), (2, 1.2, "c", "")],
                                   "large": [(1.5, 9.0, "d", "")]}, title="n<4k>", unit="us")
    root = _chart_svg(chart)
    assert len(root.findall(f".//{SVG}polyline")) == 2
    assert len(root.findall(f".//{SVG}circle")) == 3
    assert [a.get("href") for a in root.findall(f".//{SVG}a")] == ["/commits/abc"]
    assert "n<4k> (us)" in "".join(root.itertext())
    assert root.get("data-scale") == "linear"
    assert web_charts.line_chart({}) is None


def test_chart_uses_a_log_axis_beyond_a_decade():
    wide = web_charts.line_chart({"c": [(1, 500.0, "", ""), (2, 40.0, "", "")]})
    narrow = web_charts.line_chart({"c": [(1, 50.0, "", ""), (2, 40.0, "", "")]})
    assert wide.log and not narrow.log
    labels = [t.label for t in wide.y_ticks]
    assert labels[0] == "10" and labels[-1] == "1000"
    # on a log axis 40 -> 400 and 50 -> 500 are the same height apart
    a = web_charts.line_chart({"c": [(1, 40.0, "", ""), (2, 400.0, "", ""), (3, 4000.0, "", "")]})
    ys = [m.y for m in a.series[0].marks]
    assert ys[0] - ys[1] == pytest.approx(ys[1] - ys[2])
    low, high, ticks = web_charts.linear_domain(1.2, 9.0)
    assert low <= 1.2 and high >= 9.0 and ticks == sorted(ticks) and len(ticks) >= 3


def test_prometheus_text():
    counters = HttpCounters()
    counters.add("listKernels", 200)
    counters.add("listKernels", 404)
    text = render_metrics({
        "queue_depth": 3,
        "jobs_by_state": {"queued": 3, "running": 1},
        "accepted_total": 5,
        "accept_latency_seconds": {"buckets": {0.1: 2, 1.0: 5}, "sum": 1.5, "count": 5},
        "note": "ignored",
    }, counters)
    assert "# TYPE kz_queue_depth gauge\nkz_queue_depth 3" in text
    assert 'kz_jobs_by_state{state="running"} 1' in text
    assert "# TYPE kz_accepted_total counter" in text
    assert 'kz_accept_latency_seconds_bucket{le="0.1"} 2' in text
    assert 'kz_accept_latency_seconds_bucket{le="+Inf"} 5' in text
    assert "kz_accept_latency_seconds_count 5" in text
    assert 'kz_http_requests_total{route="listKernels",code="4xx"} 1' in text
    assert "note" not in text


def test_token_bucket_refills_with_the_injected_clock():
    now = [0.0]
    bucket = TokenBucket(rate=1.0, burst=2, clock=lambda: now[0])
    assert bucket.take("alice") is None
    assert bucket.take("alice") is None
    wait = bucket.take("alice")
    assert wait == pytest.approx(1.0)
    assert bucket.take("bob") is None  # buckets are per key
    with pytest.raises(ZooError) as info:
        bucket.check("alice")
    assert info.value.code == "RATE_LIMITED" and info.value.http_status == 429
    now[0] = 1.0
    assert bucket.take("alice") is None


def test_catalog_filters_and_pages():
    doc = {"kernels": [
        {"kernel_id": f"cpu/Elementwise/Axpy/fp32/k{i:02d}", "name": f"K{i}",
         "category": {"arch": "cpu", "op_class": "Elementwise", "sub_class": "Axpy", "quant": "fp32"},
         "status": "frozen" if i == 3 else "normal", "summary": "needle" if i == 7 else "x"}
        for i in range(25)
    ] + [{"kernel_id": "sm_90/Attention/MHA/fp16/ref", "valid": False,
          "category": {"arch": "sm_90", "op_class": "Attention", "sub_class": "MHA", "quant": "fp16"}}]}
    cat = Catalog()
    cat.refresh(doc)
    assert len(cat.select({"arch": "cpu"}, "")) == 25
    assert [e["kernel_id"] for e in cat.select({}, "NEEDLE")] == ["cpu/Elementwise/Axpy/fp32/k07"]
    assert len(cat.select({"status": "frozen"}, "")) == 1
    assert [e["kernel_id"] for e in cat.select({"status": "invalid"}, "")] == ["sm_90/Attention/MHA/fp16/ref"]
    page = json.loads(cat.page_bytes({}, "", 3, 10))
    assert page["total"] == 26 and page["pages"] == 3 and len(page["kernels"]) == 6
    assert cat.facets()["arch"] == ["cpu", "sm_90"]
    assert not matches(doc["kernels"][0], {"quant": "fp16"}, "")


def test_case_metric_shapes():
    assert case_metric({"best": {"value": 1.0, "submitter": "a"}}, "best")["value"] == 1.0
    assert case_metric({"primary_metric": "lat", "metrics_best": {"lat": {"value": 2.0}}}, "best")["value"] == 2.0
    assert case_metric({"best": 3.0}, "best") == {"value": 3.0}
    assert case_metric({}, "best") == {}


class _LogsZoo:
    """Stands in for the daemon: one status document with its logs, kept in its run folder."""

    def __init__(self, doc: dict, state_dir: Path) -> None:
        self.doc = doc
        self.pending = PendingStore(state_dir / "pending", state_dir / "runs")
        run = self.pending.run_folder(doc["uuid"])
        run.mkdir(parents=True)
        (run / LOGS_FILE).write_text(doc["logs"])  # the run's logs are kept: not pruned

    def submission(self, uuid: str) -> dict:
        if uuid != self.doc["uuid"]:
            raise ZooError("NOT_FOUND", f"no submission {uuid}")
        return self.doc

    def index(self) -> dict:
        return {"kernels": []}


def test_submission_page_shows_logs_reasons_with_hints_and_history(tmp_path):
    doc = {"uuid": "u-1", "kernel_id": "cpu/Elementwise/Axpy/fp32/k", "submitter_id": "alice",
           "status": "rejected", "attempts": 1, "commit_sha": None,
           "reasons": [{"stage": "result", "code": "BAD_OUTPUT", "message": "two JSON documents", "seq": 7}],
           "history": [[1, "received", "2026-11-30T00:00:00Z"], [2, "queued", "2026-11-30T00:00:01Z"],
                       [7, "rejected", "2026-11-30T00:00:09Z"]],
           "result": {"overall_accept": False, "build_ok": True},
           "cases": [{"test_case_id": "n4k", "correctness": "passed", "accept": False,
                      "primary_metric": "latency_us", "value": 12.5}],
           "logs": "build ok\n<script>window.x=1</script>\n",
           "log_tails": {"benchmark": "x" * 70_000 + "TAIL-END"}}
    app = create_app(_LogsZoo(doc, tmp_path), TokenStore(tmp_path / "auth.yaml"))
    with TestClient(app) as client:
        html = client.get("/submissions/u-1").text
        assert client.get("/submissions/u-2").status_code == 404
    assert '<span id="status" class="status status-rejected">rejected</span>' in html
    assert "&lt;script&gt;window.x=1&lt;/script&gt;" in html and "<script>window" not in html
    assert "<h3>benchmark</h3>" in html and "TAIL-END" in html and "x" * 70_000 not in html
    assert "Only the end of this log is shown." in html
    assert "How to fix:</strong> Print exactly one JSON document" in html
    assert html.count('class="status status-') == 4  # the badge and three history rows
    assert "data-status-url" not in html  # a terminal submission is not followed


def test_log_blocks_accept_text_mappings_and_lists():
    assert log_blocks({}) == []
    assert log_blocks({"logs": "a"}) == [("logs", "a", False)]
    assert log_blocks({"log_tails": [{"name": "build", "text": "b"}, "junk"]}) == [("build", "b", False)]
    assert log_blocks({"logs": {"build": "b", "bench": "c"}}) == [("build", "b", False), ("bench", "c", False)]
