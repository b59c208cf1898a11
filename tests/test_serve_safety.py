"""`blockviz serve` on a shared network, at the HTTP and websocket level (aiohttp's client against a
real `blockviz serve replay fork-cow`): a page of another origin cannot open a session, a Host the
server does not answer to is refused (DNS rebinding), visitors beyond --max-visitors are told to
wait and start no process, a huge terminal size is clamped, and the page still works."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import aiohttp
import pytest
from serve_fixtures import serve

from blockviz.web import HEIGHT_RANGE, WIDTH_RANGE, BlockvizServer, clamp_size, host_name, normal_origin

WAIT_LIMIT_S = 60  # limits on waits, never measurements


def _run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, WAIT_LIMIT_S * 2))


def _wait_for(condition, what: str):
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not (value := condition()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)
    return value


def _environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode(errors="replace").split("=", 1) for item in raw if b"=" in item)


async def _first_bytes(ws: aiohttp.ClientWebSocketResponse) -> bytes:
    """The first binary frame the server sends (the app's screen, or the server's notice)."""
    while True:
        message = await ws.receive(timeout=WAIT_LIMIT_S)
        if message.type == aiohttp.WSMsgType.BINARY:
            return message.data
        assert message.type == aiohttp.WSMsgType.TEXT, message


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve("replay", "fork-cow", "--max-visitors", "1", "--allow-host", "speaker.lan",
               log_dir=tmp_path_factory.mktemp("serve")) as server:
        yield server


def test_the_page_and_a_session_from_it_still_work_with_the_size_clamped(served):
    async def visit():
        async with aiohttp.ClientSession() as session:
            async with session.get(served.url + "/") as page:
                assert page.status == 200 and "data-session-websocket-url" in await page.text()
            async with session.ws_connect(served.url + "/ws?width=100000&height=100000", origin=served.url) as ws:
                assert await _first_bytes(ws)  # the app draws
                pid = _wait_for(served.app_processes, "the visitor's app process")[0]
                environ = _environ(pid)
                assert (environ["COLUMNS"], environ["ROWS"]) == (str(WIDTH_RANGE[1]), str(HEIGHT_RANGE[1]))

    _run(visit())
    _wait_for(lambda: not served.app_processes(), "the app to stop when its visitor left")


def test_a_page_of_another_origin_cannot_open_a_session(served):
    async def visit():
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(served.url + "/ws", origin="http://evil.example")
            assert refused.value.status == 403

    _run(visit())
    assert served.app_processes() == []


def test_visitors_beyond_the_limit_are_told_to_wait_and_start_nothing(served):
    async def visit():
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(served.url + "/ws", origin=served.url) as first:
                await _first_bytes(first)
                async with session.ws_connect(served.url + "/ws", origin=served.url) as second:
                    notice = (await _first_bytes(second)).decode()
                    assert "This blockviz server is full (1 visitor at once)" in notice and "Wait" in notice
                    closed = await second.receive(timeout=WAIT_LIMIT_S)
                    assert closed.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
                    assert second.close_code == 1013
                async with session.get(served.url + "/") as page:
                    assert page.status == 503 and page.headers["Retry-After"]
                    assert "is full" in await page.text()
                assert len(served.app_processes()) == 1
            _wait_for(lambda: not served.app_processes(), "the first visitor's app to stop")
            # the place is free again once the server has let the session go (a moment after its process ended)
            deadline = time.monotonic() + WAIT_LIMIT_S
            while True:
                async with session.get(served.url + "/") as page:
                    if page.status == 200 or time.monotonic() > deadline:
                        assert page.status == 200
                        break
                await asyncio.sleep(0.1)

    _run(visit())


@pytest.mark.parametrize(("host", "status"), [
    ("evil.example", 403), ("rebound.attacker.test:{port}", 403),
    ("localhost:{port}", 200), ("127.0.0.1:{port}", 200), ("speaker.lan:{port}", 200),
])
def test_the_host_header_is_checked(served, host, status):
    port = served.url.rsplit(":", 1)[1]

    async def visit():
        async with aiohttp.ClientSession() as session:
            async with session.get(served.url + "/", headers={"Host": host.format(port=port)}) as page:
                assert page.status == status
                if status == 403:
                    assert "--allow-host" in await page.text()

    _run(visit())


def test_a_foreign_host_cannot_reach_the_websocket_either(served):
    async def visit():
        async with aiohttp.ClientSession() as session:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(served.url + "/ws", origin="http://rebound.attacker.test",
                                         headers={"Host": "rebound.attacker.test"})
            assert refused.value.status == 403

    _run(visit())
    assert served.app_processes() == []


def test_resizes_are_clamped_too():
    from blockviz.web import _ClampedSize

    class AppService:
        sizes: list[tuple[int, int]] = []

        async def set_terminal_size(self, width, height):
            self.sizes.append((width, height))

    service = _ClampedSize(AppService())
    asyncio.run(service.set_terminal_size(100_000, 100_000))
    asyncio.run(service.set_terminal_size(0, -5))
    asyncio.run(service.set_terminal_size(132, 43))
    assert AppService.sizes == [(WIDTH_RANGE[1], HEIGHT_RANGE[1]), (WIDTH_RANGE[0], HEIGHT_RANGE[0]), (132, 43)]
    assert clamp_size(80, 24) == (80, 24)


def _server(host: str, **options) -> BlockvizServer:
    return BlockvizServer("exec true", title="t", host=host, port=8000, on_ready=print, **options)


@pytest.mark.parametrize(("served_on", "host", "answers"), [
    ("127.0.0.1", "127.0.0.1:8000", True), ("127.0.0.1", "localhost:8000", True), ("127.0.0.1", "[::1]:8000", True),
    ("127.0.0.1", "192.168.1.20:8000", False), ("127.0.0.1", "evil.example:8000", False),
    ("0.0.0.0", "192.168.1.20:8000", True), ("0.0.0.0", "localhost", True), ("0.0.0.0", "evil.example", False),
    ("192.168.1.20", "192.168.1.20:8000", True), ("192.168.1.20", "10.0.0.1:8000", False),
    ("::", "[fe80::1]:8000", True), ("::1", "[::1]:8000", True),
])
def test_which_hosts_a_server_answers_to(served_on, host, answers):
    assert _server(served_on).answers_to(host) is answers
    assert _server(served_on, allow_hosts=["Evil.Example."]).answers_to("evil.example:8000")


def test_origins_and_hosts_are_compared_in_their_normal_form():
    assert host_name("[::1]:8000") == "::1" and host_name("Speaker.LAN.:80") == "speaker.lan"
    assert normal_origin("HTTP://Speaker.lan:80/") == "http://speaker.lan"
    assert normal_origin("https://course.example.org:443") == "https://course.example.org"


def test_max_visitors_must_be_positive(tmp_path):
    from test_serve import _one_line_exit_2, _serve

    _one_line_exit_2(_serve("replay", "fork-cow", "--max-visitors", "0"), "--max-visitors must be at least 1")
