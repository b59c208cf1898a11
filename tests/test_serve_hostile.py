"""`blockviz serve` against hostile visitors (issue 40), on 127.0.0.1, each attack bounded in count
and time: half-open connections do not stop the server, a flooding or malformed visitor's session
ends with one log line and its app process ends within seconds and stays under the memory bound
docs/serve.md states, SIGTERM leaves no process behind, and a client without Host gets a page whose
websocket has the port. The server runs as a real subprocess (tests/serve_fixtures.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import resource
import selectors
import signal
import socket
import time
import urllib.request
from pathlib import Path

import aiohttp
import pytest
from jupyter_fixtures import free_port
from serve_fixtures import group_alive, serve
from test_serve_safety import _first_bytes, _run, _wait_for

from blockviz import web_listener
from blockviz.web import (APP_QUIT_S, INPUT_BURST, MAX_MESSAGE_BYTES, BlockvizServer, RateLimit, SessionEnded,
                          count_input_events, parse_message)

HALF_OPEN = 2_000  # connections that send part of a header and wait
SERVER_OPEN_FILES = 1_024  # the usual limit, which HALF_OPEN connections would exhaust
APP_MEMORY_BOUND_KIB = 256 * 1024  # docs/serve.md: a visitor's app under any input
END_LIMIT_S = 4 * APP_QUIT_S + 5  # quit, SIGTERM, SIGKILL, and room for a slow machine
CONNECT_LIMIT_S = 30  # for HALF_OPEN connects (a SYN the full accept queue drops is sent again after 1 s)


def _rss_kib(pid: int) -> int | None:
    """The resident memory of a live process, from /proc."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def _watch_until_gone(pid: int, limit_s: float) -> int:
    """Wait for `pid` to end (failing after limit_s); the most resident memory seen meanwhile."""
    peak, deadline = 0, time.monotonic() + limit_s
    while (rss := _rss_kib(pid)) is not None:
        peak = max(peak, rss)
        assert time.monotonic() < deadline, f"the app process {pid} still runs ({rss} KiB)"
        time.sleep(0.05)
    return peak


def _new_lines(served, before: str) -> list[str]:
    return served.log()[len(before):].strip().splitlines()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with serve("replay", "fork-cow", "--max-visitors", "2", log_dir=tmp_path_factory.mktemp("serve")) as server:
        yield server


async def _visit(served, *messages: str) -> tuple[int | None, int]:
    """Open a session, send `messages` (until the server closes it), wait for the close; the close
    code and the app's process id."""
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(served.url + "/ws", origin=served.url, max_msg_size=0) as ws:
            await _first_bytes(ws)
            pid = _wait_for(served.app_processes, "the visitor's app process")[0]
            for message in messages:
                if ws.closed:
                    break
                with contextlib.suppress(ConnectionError):
                    await ws.send_str(message)
            while not ws.closed:
                await ws.receive(timeout=END_LIMIT_S)
            return ws.close_code, pid


@pytest.mark.parametrize(("messages", "codes", "logged"), [
    # 1009 (message too big), or 1006 when the rest of the message, unread, resets the connection
    # before the client reads the close
    ([json.dumps(["stdin", "x" * 3_900_000])], (1009, 1006), "exceeds limit"),
    ([json.dumps(["stdin", "x"])] * 20_000, (1008,), "messages a second"),
    ([json.dumps(["stdin", "sb" * (INPUT_BURST // 4)])] * 3, (1008,), "keys a second"),
], ids=["one 3.9 MB message", "20,000 keys", "pasted keys"])
def test_a_flooding_visitor_is_ended_with_its_app_under_the_memory_bound(served, messages, codes, logged):
    before = served.log()
    close_code, pid = _run(_visit(served, *messages))
    assert close_code in codes
    assert _watch_until_gone(pid, END_LIMIT_S) < APP_MEMORY_BOUND_KIB
    lines = _new_lines(served, before)
    assert len(lines) == 1 and logged in lines[0] and "session ended" in lines[0], lines


# under the 16 KiB cap, in letters no key of the app is bound to: typed out (the plain paste), a "q"
# would quit the app and an "f" open the log's filter, which the paste's other keys race
UNBOUND = "cdehijklmotuwxy"
PASTE = "".join(UNBOUND[i % len(UNBOUND)] if i % 80 else "\n" for i in range(16_000))


@pytest.mark.parametrize("paste", [PASTE, "\x1b[200~" + PASTE + "\x1b[201~"], ids=["plain", "bracketed"])
def test_a_paste_up_to_the_message_cap_keeps_the_session(served, paste):
    """A 16,000-character paste (one message under MAX_MESSAGE_BYTES) is admitted: the session and
    its app outlive it, and the server logs nothing."""
    message = json.dumps(["stdin", paste])
    assert len(message.encode()) <= MAX_MESSAGE_BYTES and count_input_events(paste) <= INPUT_BURST
    before = served.log()

    async def paste_and_stay() -> tuple[bool, int]:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(served.url + "/ws", origin=served.url) as ws:
                await _first_bytes(ws)
                pid = _wait_for(served.app_processes, "the visitor's app process")[0]
                await ws.send_str(message)
                deadline = time.monotonic() + 3
                while not ws.closed and time.monotonic() < deadline:
                    with contextlib.suppress(asyncio.TimeoutError):
                        await ws.receive(timeout=0.5)
                return ws.closed, pid

    closed, pid = _run(paste_and_stay())
    assert not closed
    _watch_until_gone(pid, END_LIMIT_S)  # the tab closed: the app ends as usual
    assert "session ended" not in served.log()[len(before):]


@pytest.mark.parametrize("message", ["{not json", json.dumps(["stdin", 12]), json.dumps(["resize", {}]),
                                     json.dumps({"stdin": "x"}), json.dumps(["resize", {"width": "80", "height": 24}])],
                         ids=["not JSON", "stdin 12", "resize {}", "not a list", "width text"])
def test_a_malformed_message_ends_that_session_with_one_log_line(served, message):
    before = served.log()
    close_code, pid = _run(_visit(served, message))
    assert close_code == 1008
    _watch_until_gone(pid, END_LIMIT_S)
    lines = _new_lines(served, before)
    assert len(lines) == 1 and "session ended" in lines[0], lines
    assert "Traceback" not in served.log()


def test_an_app_that_does_not_answer_ends_within_seconds_of_its_tab_closing(served):
    """The app stopped (SIGSTOP: as busy as an app gets, it reads no quit) when its visitor leaves:
    it is ended all the same, and its place is free for the next visitor."""
    async def visit_and_leave() -> int:
        async with aiohttp.ClientSession() as session:
            async with session.ws_connect(served.url + "/ws", origin=served.url) as ws:
                await _first_bytes(ws)
                pid = _wait_for(served.app_processes, "the visitor's app process")[0]
                os.kill(pid, signal.SIGSTOP)
        return pid

    pid = _run(visit_and_leave())
    try:
        _watch_until_gone(pid, END_LIMIT_S)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with urllib.request.urlopen(served.url + "/", timeout=30) as page:
        assert page.status == 200  # not "full"


def test_a_request_without_host_gets_a_websocket_url_with_the_port(served):
    port = int(served.url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(b"GET / HTTP/1.0\r\n\r\n")
        response = b""
        while chunk := client.recv(65536):
            response += chunk
    found = re.search(rb'data-session-websocket-url="([^"]*)"', response)
    assert found and found.group(1).decode() == f"ws://127.0.0.1:{port}/ws", response[:300]


def test_sigterm_ends_every_visitors_app(tmp_path):
    """SIGTERM to the server alone (not its group): the server ends its visitors' apps, an idle
    one and one that reads nothing (SIGSTOP), and no process of its session is left."""
    with serve("replay", "fork-cow", log_dir=tmp_path) as server:
        async def two_visitors_then_sigterm() -> list[int]:
            async with aiohttp.ClientSession() as session:
                first = await session.ws_connect(server.url + "/ws", origin=server.url)
                second = await session.ws_connect(server.url + "/ws", origin=server.url)
                await _first_bytes(first)
                await _first_bytes(second)
                pids = _wait_for(lambda: len(found := server.app_processes()) == 2 and found, "two app processes")
                os.kill(pids[0], signal.SIGSTOP)
                server.process.send_signal(signal.SIGTERM)
                for ws in (first, second):
                    while not ws.closed:
                        await ws.receive(timeout=END_LIMIT_S)
                return pids

        pids = _run(two_visitors_then_sigterm())
        assert server.process.wait(timeout=END_LIMIT_S) == 0  # reaped: a zombie would count as alive
        deadline = time.monotonic() + END_LIMIT_S
        while group_alive(server.process.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [pid for pid in pids if _rss_kib(pid) is not None]
        assert not group_alive(server.process.pid), f"left behind: {left}"
        assert "Traceback" not in server.log()


def test_half_open_connections_leave_the_server_answering(tmp_path):
    """HALF_OPEN connections that send part of a request header and wait, against a server that
    may open SERVER_OPEN_FILES files: it keeps answering a normal visitor, and keeps running."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = HALF_OPEN + 256
    if hard != resource.RLIM_INFINITY and hard < needed:
        pytest.skip(f"this test opens {HALF_OPEN} sockets; RLIMIT_NOFILE's hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sockets: list[socket.socket] = []
    try:
        with serve("replay", "fork-cow", log_dir=tmp_path, open_files=SERVER_OPEN_FILES) as server:
            port = int(server.url.rsplit(":", 1)[1])
            sockets = _half_open(port, HALF_OPEN)
            with urllib.request.urlopen(server.url + "/", timeout=10) as page:
                assert page.status == 200 and b"data-session-websocket-url" in page.read()
            assert server.process.poll() is None, server.log()
            assert "Too many open files" not in server.log()
    finally:
        for client in sockets:
            client.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _half_open(port: int, count: int) -> list[socket.socket]:
    """`count` connections, opened at once (as an attacker would), each sending part of a header."""
    sockets, connecting = [], selectors.DefaultSelector()
    for _ in range(count):
        client = socket.socket()
        client.setblocking(False)
        client.connect_ex(("127.0.0.1", port))
        sockets.append(client)
        connecting.register(client, selectors.EVENT_WRITE)
    deadline = time.monotonic() + CONNECT_LIMIT_S
    while connecting.get_map() and time.monotonic() < deadline:
        for key, _ in connecting.select(timeout=1):
            connecting.unregister(key.fileobj)
            with contextlib.suppress(OSError):  # refused, or closed by the server to make room
                key.fileobj.send(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n")
    connecting.close()
    return sockets


def test_the_listener_closes_silent_connections_and_makes_room(tmp_path):
    """The ConnectionGuard in this process, with small limits: a connection that sends no whole
    header is closed after the header timeout, and one beyond the limit closes the longest-waiting."""
    async def scenario() -> None:
        server = BlockvizServer("exec true", title="t", host="127.0.0.1", port=free_port(), on_ready=print)
        runner = await server.listen(max_connections=3, header_timeout_s=1.0)
        url = f"http://127.0.0.1:{server.port}/"
        try:
            silent = [await asyncio.open_connection("127.0.0.1", server.port) for _ in range(3)]
            for _, writer in silent:
                writer.write(b"GET / HTTP/1.1\r\n")
                await writer.drain()
            async with aiohttp.ClientSession() as session:
                async with session.get(url) as page:  # a fourth: room made for it
                    assert page.status == 200
            oldest, *others = silent
            assert await asyncio.wait_for(oldest[0].read(), 5) == b""  # closed to make room
            for reader, _ in others:  # the header timeout
                assert await asyncio.wait_for(reader.read(), 10) == b""
            assert server.guard.num_dropped >= 3
            for _, writer in silent:
                writer.close()
        finally:
            await runner.cleanup()

    _run(scenario())


def test_out_of_files_in_accept_is_one_log_line(caplog):
    """asyncio's accept failing with EMFILE (it retries a moment later) is logged as one line, with
    no traceback to format (formatting one needs a file, which is what ran out)."""
    import errno

    loop = asyncio.new_event_loop()
    try:
        with caplog.at_level(logging.WARNING, logger="blockviz.serve"):
            web_listener.log_loop_error(loop, {"message": "socket.accept() out of system resource",
                                                "exception": OSError(errno.EMFILE, "Too many open files")})
    finally:
        loop.close()
    assert [record.exc_info for record in caplog.records] == [None]
    assert "out of open files" in caplog.records[0].getMessage()


def test_a_token_bucket_allows_a_burst_then_the_rate():
    now = [0.0]
    limit = RateLimit(rate=10, burst=20, clock=lambda: now[0])
    assert limit.take(20) and not limit.take(1)
    now[0] = 0.5
    assert limit.take(5) and not limit.take(1)
    now[0] = 100.0
    assert limit.take(20) and not limit.take(1)  # never more than the burst


def test_input_is_counted_in_the_events_the_app_makes_of_it():
    assert count_input_events("x") == 1 and count_input_events("hello") == 5
    assert count_input_events("\x1b[A") == 1 and count_input_events("\x1b[<35;10;20M\x1b[<35;11;20M") == 2
    assert count_input_events("\x1b[200~hi\x1b[201~") == 1  # a bracketed paste: one Paste event
    assert count_input_events("a\x1b[200~" + "x" * 20_000 + "\x1b[201~b\x1b[A") == 4
    assert count_input_events("\x1b[200~" + "x" * 20_000) == 1  # a paste the next message ends


def test_messages_are_parsed_as_the_page_sends_them():
    assert parse_message('["stdin", "q"]') == ("stdin", "q")
    assert parse_message('["resize", {"width": 80, "height": 24}]') == ("resize", {"width": 80, "height": 24})
    assert parse_message('["focus"]') == ("focus", None) and parse_message('["later", 1]') == ("", None)
    for text in ("", "[]", "[1]", '["resize", {"width": true, "height": 24}]', '["stdin", null]'):
        with pytest.raises(SessionEnded):
            parse_message(text)
    assert MAX_MESSAGE_BYTES < 3_900_000
