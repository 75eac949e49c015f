"""HTML building blocks for the web pages: escaping, a safe markdown subset, an SVG chart.

Everything that comes from a package or a request is escaped before it is placed in
a page. The markdown renderer escapes first and formats afterwards, so no raw HTML
in a description can pass through; links keep only http(s), relative and fragment
targets.
"""
from __future__ import annotations

import html
import re
import string
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

TEMPLATES = Path(__file__).resolve().parent / "templates"


def h(value: Any) -> str:
    """HTML-escape any value (None → empty)."""
    return "" if value is None else html.escape(str(value), quote=True)


@lru_cache(maxsize=None)
def _template(name: str) -> string.Template:
    return string.Template((TEMPLATES / name).read_text(encoding="utf-8"))


def page(title: str, body: str, *, head: str = "", nav: str = "") -> str:
    """A whole page from the base template; ``title`` is escaped, ``body``/``head`` are trusted HTML."""
    return _template("base.html").substitute(title=h(title), body=body, head=head, nav=nav)


# -- markdown ------------------------------------------------------------------------------------

_CODE_SPAN = re.compile(r"`([^`]+)`")
_BOLD = re.compile(r"\*\*(.+?)\*\*")
_ITALIC = re.compile(r"(?<![*\w])\*(?!\s)(.+?)(?<!\s)\*(?![*\w])")
_LINK = re.compile(r"\[([^\]]+)\]\(([^)\s]+)\)")
_SAFE_URL = re.compile(r"^(https?://|/|#|\./|[A-Za-z0-9._~-]+(/|$))", re.IGNORECASE)
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_ULIST = re.compile(r"^\s*[-*+]\s+(.*)$")
_OLIST = re.compile(r"^\s*\d+[.)]\s+(.*)$")


def _inline(text: str) -> str:
    """Escape ``text``, then apply code spans, links, bold and italic to the escaped text."""
    codes: list[str] = []

    def keep_code(match: re.Match[str]) -> str:
        codes.append(f"<code>{h(match.group(1))}</code>")
        return f"\x00{len(codes) - 1}\x00"

    text = _CODE_SPAN.sub(keep_code, text)
    out = h(text)

    def link(match: re.Match[str]) -> str:
        label, url = match.group(1), html.unescape(match.group(2))
        if ":" in url.split("/")[0] and not url.lower().startswith(("http://", "https://")):
            return label
        if not _SAFE_URL.match(url):
            return label
        return f'<a href="{h(url)}" rel="nofollow noopener">{label}</a>'

    out = _LINK.sub(link, out)
    out = _BOLD.sub(r"<strong>\1</strong>", out)
    out = _ITALIC.sub(r"<em>\1</em>", out)
    return re.sub(r"\x00(\d+)\x00", lambda m: codes[int(m.group(1))], out)


def markdown(text: str | None) -> str:
    """Render a safe markdown subset: headings, paragraphs, lists, fenced code, inline code, links,
    bold, italic. Raw HTML is shown as text."""
    lines = (text or "").replace("\r\n", "\n").split("\n")
    out: list[str] = []
    para: list[str] = []
    list_kind: str | None = None
    items: list[str] = []
    i = 0

    def flush_para() -> None:
        if para:
            out.append("<p>" + _inline(" ".join(s.strip() for s in para)) + "</p>")
            para.clear()

    def flush_list() -> None:
        nonlocal list_kind
        if list_kind:
            out.append(f"<{list_kind}>" + "".join(f"<li>{x}</li>" for x in items) + f"</{list_kind}>")
            items.clear()
            list_kind = None

    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            flush_para()
            flush_list()
            lang = line.strip()[3:].strip()
            block = []
            i += 1
            while i < len(lines) and not lines[i].strip().startswith("```"):
                block.append(lines[i])
                i += 1
            cls = f' class="lang-{h(re.sub(r"[^A-Za-z0-9_-]", "", lang))}"' if lang else ""
            out.append(f"<pre><code{cls}>{h(chr(10).join(block))}</code></pre>")
            i += 1
            continue
        heading = _HEADING.match(line)
        ulist, olist = _ULIST.match(line), _OLIST.match(line)
        if heading:
            flush_para()
            flush_list()
            level = min(6, len(heading.group(1)) + 1)  # the page owns <h1>
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif ulist or olist:
            flush_para()
            kind = "ul" if ulist else "ol"
            if list_kind != kind:
                flush_list()
                list_kind = kind
            items.append(_inline((ulist or olist).group(1)))
        elif not line.strip():
            flush_para()
            flush_list()
        else:
            if list_kind and line.startswith(("  ", "\t")) and items:
                items[-1] += " " + _inline(line.strip())
            else:
                flush_list()
                para.append(line)
        i += 1
    flush_para()
    flush_list()
    return "\n".join(out)


# -- tables and small pieces ---------------------------------------------------------------------

def table(headers: Sequence[str], rows: Iterable[Sequence[str]], *, cls: str = "",
          header_html: Sequence[str] | None = None) -> str:
    """A table; ``rows`` cells are trusted HTML (escape them with :func:`h` first)."""
    head_cells = header_html or [h(x) for x in headers]
    thead = "".join(f"<th>{cell}</th>" for cell in head_cells)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f'<table class="{h(cls)}"><thead><tr>{thead}</tr></thead><tbody>{body}</tbody></table>'


def fmt_value(value: Any) -> str:
    """A metric value for display (4 significant digits)."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return str(value)


def short_sha(sha: Any) -> str:
    """The first 10 characters of a commit SHA."""
    return str(sha or "")[:10]


def when(epoch: float | int | None) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SSZ``."""
    if epoch is None:
        return ""
    return datetime.fromtimestamp(float(epoch), tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


# -- the history chart ---------------------------------------------------------------------------

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2")


def svg_chart(series: Mapping[str, Sequence[tuple[float, float, str]]], *, width: int = 640,
              height: int = 240, unit: str = "", x_labels: tuple[str, str] | None = None) -> str:
    """An inline SVG line chart: ``{label: [(x, y value, tooltip), ...]}``; no external assets.

    ``x`` is epoch seconds (labelled as dates) unless ``x_labels`` names the two ends.
    """
    points = [p for pts in series.values() for p in pts]
    if not points:
        return '<p class="empty">No accepted runs yet.</p>'
    pad_l, pad_r, pad_t, pad_b = 64, 12, 12, 36
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    x0, x1 = min(xs), max(xs)
    y0, y1 = min(ys), max(ys)
    if x1 == x0:
        x0, x1 = x0 - 1, x1 + 1
    if y1 == y0:
        y0, y1 = y0 - abs(y0) * 0.1 - 1e-9, y1 + abs(y1) * 0.1 + 1e-9
    plot_w, plot_h = width - pad_l - pad_r, height - pad_t - pad_b

    def sx(x: float) -> float:
        return pad_l + (x - x0) / (x1 - x0) * plot_w

    def sy(y: float) -> float:
        return pad_t + (1 - (y - y0) / (y1 - y0)) * plot_h

    parts = [
        f'<svg class="chart" role="img" xmlns="http://www.w3.org/2000/svg" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">',
        f'<rect x="{pad_l}" y="{pad_t}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#ccc"/>',
        f'<text x="{pad_l - 4}" y="{pad_t + 10}" text-anchor="end" font-size="11">{h(fmt_value(y1))}</text>',
        f'<text x="{pad_l - 4}" y="{pad_t + plot_h}" text-anchor="end" font-size="11">{h(fmt_value(y0))}</text>',
        f'<text x="{pad_l}" y="{height - 20}" font-size="11">{h(x_labels[0] if x_labels else when(x0))}</text>',
        f'<text x="{width - pad_r}" y="{height - 20}" text-anchor="end" font-size="11">'
        f'{h(x_labels[1] if x_labels else when(x1))}</text>',
        f'<text x="4" y="{pad_t + plot_h / 2:.0f}" font-size="11">{h(unit)}</text>',
    ]
    legend_x = pad_l
    for index, (label, pts) in enumerate(series.items()):
        color = PALETTE[index % len(PALETTE)]
        ordered = sorted(pts, key=lambda p: p[0])
        coords = " ".join(f"{sx(x):.1f},{sy(y):.1f}" for x, y, _ in ordered)
        parts.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="{coords}"/>')
        for x, y, tip in ordered:
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="3" fill="{color}">'
                         f"<title>{h(tip)}</title></circle>")
        parts.append(f'<text x="{legend_x}" y="{height - 4}" font-size="11" fill="{color}">{h(label)}</text>')
        legend_x += 14 + 7 * len(str(label))
    parts.append("</svg>")
    return "".join(parts)
