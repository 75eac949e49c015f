"""Rendering for the web pages: the Jinja2 templates, their display filters, safe markdown.

Templates live in ``templates/`` and are always autoescaped, so a value from a package
or a request is text unless a template marks it otherwise; the only values marked
safe are the sanitised markdown below and the SVG the chart macro builds from numbers.
Descriptions are rendered by markdown-it-py with raw HTML disabled and the result is
passed through nh3, which keeps a short list of tags and only http(s) or relative links.
"""
from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2
import nh3
from markdown_it import MarkdownIt
from markupsafe import Markup
from starlette.templating import Jinja2Templates

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"

#: Defence in depth on top of escaping: only our own script and stylesheets run on the pages.
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
                               "connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

#: What a rendered description may contain; anything else is dropped by nh3.
ALLOWED_TAGS = frozenset({"p", "h2", "h3", "h4", "h5", "h6", "ul", "ol", "li", "pre", "code", "a",
                          "strong", "em", "blockquote", "hr", "br", "table", "thead", "tbody", "tr",
                          "th", "td"})
ALLOWED_ATTRIBUTES = {"a": {"href"}, "code": {"class"}, "ol": {"start"}}
LINK_REL = "nofollow noopener"

_MARKDOWN = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False}).enable("table")


def markdown(text: Any) -> Markup:
    """A markdown description as sanitised HTML (headings shifted one level down: the page owns h1)."""
    if not isinstance(text, str) or not text.strip():
        return Markup("")
    tokens = _MARKDOWN.parse(text)
    for token in tokens:
        if token.type in ("heading_open", "heading_close"):
            token.tag = f"h{min(6, int(token.tag[1:]) + 1)}"
    raw = _MARKDOWN.renderer.render(tokens, _MARKDOWN.options, {})
    clean = nh3.clean(raw, tags=set(ALLOWED_TAGS), attributes={k: set(v) for k, v in ALLOWED_ATTRIBUTES.items()},
                      url_schemes={"http", "https"}, link_rel=LINK_REL)
    return Markup(clean)


def fmt_value(value: Any) -> str:
    """A metric value for display (4 significant digits); empty for a missing value."""
    if isinstance(value, bool) or value is None:
        return ""
    if isinstance(value, (int, float)):
        return f"{value:.4g}"
    return str(value)


def fmt_speedup(value: Any) -> str:
    """A speed-up factor as ``1.23×``; empty when unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    return f"{value:.3g}×" if value < 100 else f"{value:.0f}×"


def fmt_pct(value: Any, signed: bool = True) -> str:
    """A percentage as ``-76.2 %`` (signed) or ``12.5 %``; empty when unknown."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return ""
    text = f"{value:+.1f}" if signed else (f"{value:.1f}" if value >= 0.1 or value == 0 else f"{value:.2g}")
    return text.replace("-", "−") + " %"


def fmt_params(params: Any) -> str:
    """A case's params as ``rows=64, cols=128``; empty for none."""
    if not isinstance(params, dict):
        return ""
    return ", ".join(f"{k}={v}" for k, v in params.items())


def short_sha(sha: Any) -> str:
    """The first 10 characters of a commit SHA."""
    return str(sha or "")[:10]


def when(epoch: Any) -> str:
    """Epoch seconds as ``YYYY-MM-DD HH:MM:SSZ``; empty for a missing value."""
    if isinstance(epoch, bool) or not isinstance(epoch, (int, float)):
        return ""
    return datetime.fromtimestamp(float(epoch), tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def make_templates() -> Jinja2Templates:
    """The page templates, with autoescaping on for every template (not only ``*.html``)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES_DIR)), autoescape=True,
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(markdown=markdown, value=fmt_value, speedup=fmt_speedup, sha=short_sha, when=when,
                       pct=fmt_pct, params=fmt_params)
    return Jinja2Templates(env=env)


#: One environment for the process: templates are parsed once and cached by Jinja.
TEMPLATES = make_templates()
