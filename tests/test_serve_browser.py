"""`blockviz serve replay fork-cow` in Debian's chromium: the page draws the TUI with every request
off 127.0.0.1 blocked, a key changes it, and each visitor gets an app process of their own.

The terminal is drawn on a canvas (xterm.js), so its text is not in the DOM; the text the page
receives is: the websocket's frames are the app's screen updates, escape sequences and all."""

from __future__ import annotations

import re
import time

import pytest
from serve_fixtures import group_alive, serve

UI_LIMIT_MS = 60_000  # limits on waits, never measurements
LOCAL = ("http://127.0.0.1", "ws://127.0.0.1", "data:", "blob:")
ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


class Visitor:
    """One browser page on the served app, recording what it asked for and what it was sent."""

    def __init__(self, browser, url: str):
        self.context = browser.new_context(viewport={"width": 1400, "height": 900})
        self.page = self.context.new_page()
        self.page.set_default_timeout(UI_LIMIT_MS)
        self.requested: list[str] = []
        self.blocked: list[str] = []
        self.frames: list[bytes] = []
        self.page.route("**/*", self._route)
        self.page.on("websocket", lambda ws: ws.on("framereceived", self._frame))
        self.page.goto(url)

    def _route(self, route) -> None:
        url = route.request.url
        self.requested.append(url)
        if url.startswith(LOCAL):
            route.continue_()
        else:
            self.blocked.append(url)
            route.abort()

    def _frame(self, payload) -> None:
        self.frames.append(payload if isinstance(payload, bytes) else payload.encode())

    def text_since(self, start: int) -> str:
        """The text of the frames received since frame `start`, escape sequences removed."""
        return ESCAPE.sub(b"", b"".join(self.frames[start:])).decode("utf-8", "replace")

    def wait_for_text(self, pattern: str, start: int = 0) -> None:
        """Wait (letting Playwright deliver frames) until frames since `start` show `pattern`."""
        deadline = time.monotonic() + UI_LIMIT_MS / 1000
        while not re.search(pattern, self.text_since(start)):
            assert time.monotonic() < deadline, f"no {pattern!r} on the page: {self.text_since(start)[-500:]!r}"
            self.page.wait_for_timeout(100)

    def wait_until_quiet(self, quiet_ms: int = 500) -> None:
        """Wait until no frame has arrived for `quiet_ms` (the screen is drawn, not mid-update)."""
        deadline = time.monotonic() + UI_LIMIT_MS / 1000
        while time.monotonic() < deadline:
            seen = len(self.frames)
            self.page.wait_for_timeout(quiet_ms)
            if len(self.frames) == seen:
                return
        raise AssertionError("the page never stopped updating")

    def drawn(self) -> None:
        """Wait until the terminal has drawn the app (its status bar) and has the keyboard, which
        the page gives it by itself (no click first)."""
        self.page.wait_for_selector("body.-first-byte")
        self.wait_for_text(r"event 0/\d+")
        self.page.wait_for_function(
            "() => document.activeElement && document.activeElement.matches('textarea.xterm-helper-textarea')")
        self.wait_until_quiet()


@pytest.fixture
def served(tmp_path):
    with serve("replay", "fork-cow", log_dir=tmp_path) as server:
        yield server
    assert not group_alive(server.process.pid), "a process of the server outlived it"


@pytest.fixture
def visit(chromium_browser):
    visitors: list[Visitor] = []

    def open_page(url: str) -> Visitor:
        visitors.append(Visitor(chromium_browser, url))
        return visitors[-1]

    yield open_page
    for visitor in visitors:
        visitor.context.close()


def test_a_key_changes_the_page_with_nothing_from_outside(served, visit):
    visitor = visit(served.url)
    visitor.drawn()
    before = visitor.page.screenshot()
    start = len(visitor.frames)
    visitor.page.keyboard.press(".")  # one event forward
    visitor.wait_for_text(r"event 1/\d+", start)
    visitor.wait_until_quiet()
    after = visitor.page.screenshot()

    assert before != after
    assert visitor.blocked == [], f"the page asked for {visitor.blocked}"
    assert any("/static/js/textual.js" in url for url in visitor.requested)
    assert f"open {served.url}" in served.log()


def test_each_visitor_has_an_app_process(served, visit):
    first, second = visit(served.url), visit(served.url)
    first.drawn()
    second.drawn()
    assert len(served.app_processes()) == 2
    start, start_first = len(second.frames), len(first.frames)
    first.page.keyboard.press(".")
    first.wait_for_text(r"event 1/\d+", start_first)
    second.wait_until_quiet()
    assert "event 1/" not in second.text_since(start)  # one visitor's key moves only their app


def test_a_visitor_beyond_the_limit_reads_that_they_should_wait(tmp_path, visit):
    with serve("replay", "fork-cow", "--max-visitors", "1", log_dir=tmp_path) as server:
        first = visit(server.url)
        first.drawn()
        second = visit(server.url)
        second.page.wait_for_selector("text=This blockviz server is full (1 visitor at once)")
        assert "tries again every" in second.page.inner_text("body")
        assert len(server.app_processes()) == 1 and second.blocked == []


def test_a_visitor_whose_page_loaded_before_the_server_filled_reads_it_in_the_terminal(tmp_path, visit):
    """The page came while a place was free, but its script (held back by the test) connects only
    once another visitor took the place: the notice stays readable above the Restart bar, and no
    process starts for it."""
    with serve("replay", "fork-cow", "--max-visitors", "1", log_dir=tmp_path) as server:
        late = visit("about:blank")
        held = []
        late.page.route("**/static/js/textual.js", lambda route: held.append(route))
        late.page.goto(server.url + "/", wait_until="commit")
        while not held:  # the page is served (a place was free) and asks for its script
            late.page.wait_for_timeout(100)
        first = visit(server.url)
        first.drawn()
        held[0].continue_()
        late.wait_for_text(re.escape("This blockviz server is full (1 visitor at once)"))
        late.page.wait_for_selector("body.-closed .ended button")
        box = late.page.locator(".ended").bounding_box()
        assert box["y"] > 450  # a bar at the bottom of the 900-pixel page, not a cover over the notice
        assert len(server.app_processes()) == 1
