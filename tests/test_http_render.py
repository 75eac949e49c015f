"""The page building blocks: safe markdown, escaping, the SVG chart, Prometheus text, the token bucket."""
from __future__ import annotations

import re
import xml.etree.ElementTree as ET

import pytest

from kz_daemon.errors import ZooError
from kz_daemon.http.limits import TokenBucket
from kz_daemon.http.metrics import HttpCounters, render_metrics
from kz_daemon.http.render import h, markdown, svg_chart
from kz_daemon.http.views import Catalog, case_metric, matches


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
])
def test_markdown_never_passes_raw_html(hostile):
    out = markdown(hostile)
    assert "<script" not in out.lower()
    assert "<img" not in out.lower()
    assert "javascript:" not in out.lower().replace("&", "")
    assert "data:text" not in out
    assert 'href="http://evil"' not in out
    allowed = {"p", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "pre", "code", "a", "strong", "em"}
    for tag, attrs in re.findall(r"</?([A-Za-z0-9]+)([^>]*)>", out):
        assert tag in allowed, out
        assert set(re.findall(r"([a-z-]+)=", attrs)) <= {"href", "rel", "class"}, out


def test_markdown_formats_the_guide_sections():
    text = ("## 数学定义\nO = softmax(QK^T / sqrt(d)) V, see [paper](https://arxiv.org/abs/1706.03762).\n\n"
            "- **Q** is `[B, H, S, D]`\n- *fp16* inputs\n\n1. first\n2. second\n\n"
            "```python\nx = a < b\n```\n")
    out = markdown(text)
    assert "<h3>数学定义</h3>" in out
    assert '<a href="https://arxiv.org/abs/1706.03762" rel="nofollow noopener">paper</a>' in out
    assert "<li><strong>Q</strong> is <code>[B, H, S, D]</code></li>" in out
    assert "<em>fp16</em>" in out
    assert "<ol><li>first</li><li>second</li></ol>" in out
    assert '<pre><code class="lang-python">x = a &lt; b</code></pre>' in out


def test_escape():
    assert h('<"&>') == "&lt;&quot;&amp;&gt;"
    assert h(None) == ""


def test_svg_chart_is_well_formed_and_escapes_labels():
    svg = svg_chart({"small: <lat>": [(1_700_000_000, 1.5, "a<b"), (1_700_000_100, 1.2, "c")],
                     "large: lat": [(1_700_000_050, 9.0, "d")]})
    root = ET.fromstring(svg)
    assert root.tag.endswith("svg")
    assert len(root.findall(".//{http://www.w3.org/2000/svg}polyline")) == 2
    assert len(root.findall(".//{http://www.w3.org/2000/svg}circle")) == 3
    assert "&lt;lat&gt;" in svg
    assert "empty" in svg_chart({})


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
    import json
    page = json.loads(cat.page_bytes({}, "", 3, 10))
    assert page["total"] == 26 and page["pages"] == 3 and len(page["kernels"]) == 6
    assert cat.facets()["arch"] == ["cpu", "sm_90"]
    assert not matches(doc["kernels"][0], {"quant": "fp16"}, "")


def test_case_metric_shapes():
    assert case_metric({"best": {"value": 1.0, "submitter": "a"}}, "best")["value"] == 1.0
    assert case_metric({"primary_metric": "lat", "metrics_best": {"lat": {"value": 2.0}}}, "best")["value"] == 2.0
    assert case_metric({"best": 3.0}, "best") == {"value": 3.0}
    assert case_metric({}, "best") == {}
