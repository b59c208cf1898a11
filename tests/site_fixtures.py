"""The site `blockviz site` writes (every shipped trace's page, every lesson's page, the index),
built once per test process and shared by tests/test_webpage_browser.py and tests/test_site_browser.py,
and a browser page that refuses every request but a file URL.

A trace's page in the site is `trace_page(trace)`, what `blockviz export TRACE --html` writes
(test_webpage_browser.py checks the two are the same bytes). Exporting every shipped trace is most
of the site's cost, so the two modules share one build: each test that opens the site carries
SITE_GROUP, the xdist group that runs them on one worker, and `site` (imported into both modules)
builds the folder the first time it is asked for in a process and hands back the same folder after.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from blockviz.cli import main

SITE_GROUP = pytest.mark.xdist_group("site")
_BUILT: dict[str, Path] = {}


def build_site(tmp_path_factory) -> Path:
    """The folder `blockviz site` writes with its defaults (every shipped trace, every lesson),
    written on the first call in this process."""
    if "site" not in _BUILT:
        folder = tmp_path_factory.mktemp("site") / "class"
        assert main(["site", str(folder)]) == 0
        _BUILT["site"] = folder
    return _BUILT["site"]


@pytest.fixture(scope="session")
def site(tmp_path_factory) -> Path:
    """The whole site, built once per process (build_site)."""
    return build_site(tmp_path_factory)


@pytest.fixture
def offline_page(chromium_browser):
    """A page in a fresh 1400x1000 context where every request but a file URL is refused; the page
    records what it refused in `page.refused` and its console errors and uncaught errors in `page.errors`."""
    context = chromium_browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(30_000)
    page.refused = []
    page.errors = []

    def route(request_route):
        if request_route.request.url.startswith("file://"):
            request_route.continue_()
        else:
            page.refused.append(request_route.request.url)
            request_route.abort()

    context.route("**", route)
    page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    try:
        yield page
    finally:
        context.close()
