"""Headless Chromium (Debian's /usr/bin/chromium) driven by Playwright's Python package.

Playwright never downloads a browser here: it launches the system Chromium through
``executable_path`` with the flags this machine needs as root. When Chromium is
absent the tests skip with a visible reason locally, and fail in CI (``CI`` set),
where .ci/run installs it.
"""
from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

CHROMIUM_CANDIDATES = ("/usr/bin/chromium", "/usr/bin/chromium-browser", "/usr/bin/google-chrome")
FLAGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]


def chromium_path() -> str | None:
    """The Chromium binary, or None."""
    env = os.environ.get("KZ_CHROMIUM")
    if env and os.path.exists(env):
        return env
    for candidate in CHROMIUM_CANDIDATES:
        if os.path.exists(candidate):
            return candidate
    return shutil.which("chromium")


def require_chromium() -> str:
    """The Chromium path; skip (locally) or fail (in CI) when it is missing."""
    path = chromium_path()
    if path is None:
        message = "headless Chromium not found (apt-get install chromium); .ci/run installs it"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    try:
        import playwright  # noqa: F401
    except ImportError:
        pytest.fail("the playwright package is missing: pip install -e '.[test]'")
    return path


@contextmanager
def browser(javascript: bool = True) -> Iterator[object]:
    """A Playwright browser context on the system Chromium (fresh profile, JS on or off)."""
    from playwright.sync_api import sync_playwright

    path = require_chromium()
    profile = tempfile.mkdtemp(prefix="kz-chromium-")
    try:
        with sync_playwright() as p:
            context = p.chromium.launch_persistent_context(
                profile, executable_path=path, headless=True, args=FLAGS,
                java_script_enabled=javascript)
            try:
                yield context
            finally:
                context.close()
    finally:
        shutil.rmtree(profile, ignore_errors=True)
