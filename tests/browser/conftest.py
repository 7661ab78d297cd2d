"""Browser tests: a real Chromium (Debian's /usr/bin/chromium) driven by Playwright.

One browser per test module (launching costs ~0.3 s); each test gets a fresh context.
The tests skip only when Chromium or Playwright is truly absent (CI installs both).
Pages are served from loopback by :class:`tests.browser.support.PageServer`, each on its
own port, so a test has as many origins as it needs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"

if not os.access(CHROMIUM, os.X_OK):
    pytest.skip(f"no Chromium at {CHROMIUM} (apt-get install chromium)", allow_module_level=True)
playwright_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module."""
    with playwright_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        print(f"chromium {b.version}")  # Debian updates move it under Playwright
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page in its own context; console errors are collected on ``page.errors``."""
    context = browser.new_context()
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.errors = errors
    try:
        yield pg
    finally:
        context.close()
