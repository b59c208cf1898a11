"""The TUI in a browser tab: textual-serve's server with a page that needs nothing from outside.

textual-serve (Textualize/textual-serve) starts one app process per browser connection: the
page's xterm.js terminal talks to it over a websocket, keys in, screen out. Its stock page asks
fonts.googleapis.com for Roboto Mono and builds the websocket's address from --host, so
`--host 0.0.0.0` hands students ws://0.0.0.0:8000/ws. This page instead declares Roboto Mono from
the font files textual-serve ships (served from /static, like its xterm.js bundle) and takes the
websocket's address from the Host the browser asked for. Nothing here imports torch or textual.

On a shared network it also guards what textual-serve leaves open (docs/serve.md, "Security"):
a request naming a Host this server does not answer to is refused (DNS rebinding); the
websocket is refused to a page of another origin (a site the visitor has open elsewhere); at
most `max_visitors` sessions run at once, and a visitor beyond that is told to wait; the
terminal size a browser asks for is clamped.

Against a hostile visitor it bounds what each one costs: the listener's connections (web_listener.py);
a visitor's input, per message and per second, a malformed message ending that session with one
log line; the visitor's app process, which ends with its tab and with the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import ipaddress
import json
import logging
import os
import re
import signal
import socket
import sys
import time
from typing import Any, Callable, Iterable

from aiohttp import WSCloseCode, WSMsgType, web
from textual_serve.app_service import AppService
from textual_serve.server import Server, to_int

from blockviz.web_listener import HEADER_TIMEOUT_S, ConnectionGuard, GuardedSite, connection_limit, log_loop_error

log = logging.getLogger("blockviz.serve")

PAGE = """<!DOCTYPE html>
<html>
<head>
<meta charset="utf-8">
<title>{title}</title>
<link rel="stylesheet" href="/static/css/xterm.css">
<style>
@font-face {{ font-family: "Roboto Mono"; font-style: normal;
  src: url("/static/fonts/RobotoMono-VariableFont_wght.ttf") format("truetype"); }}
@font-face {{ font-family: "Roboto Mono"; font-style: italic;
  src: url("/static/fonts/RobotoMono-Italic-VariableFont_wght.ttf") format("truetype"); }}
html, body {{ margin: 0; height: 100%; background: #0c181f; color: #f2f2f2;
  font-family: "Roboto Mono", monospace; }}
.textual-terminal {{ width: 100vw; height: 100vh; opacity: 0; }}
body.-first-byte .textual-terminal {{ opacity: 1; }}
.notice {{ position: absolute; inset: 0; display: flex; flex-direction: column;
  align-items: center; justify-content: center; gap: 16px; }}
body.-first-byte .starting, .ended, #start {{ display: none; }}
body.-closed .ended {{ display: flex; z-index: 10; background: #0c181f; }}
body.-closed.-first-byte .ended {{ inset: auto 0 0 0; flex-direction: row; padding: 12px; }}
button {{ padding: 12px 28px; background: #5e0ba7; color: #fff; border: none;
  font: inherit; cursor: pointer; }}
</style>
<script src="/static/js/textual.js"></script>
<script>
// keys reach the app from the first moment, with no click on the page first: xterm's input takes
// the focus as soon as the terminal has made it
window.addEventListener("load", () => {{
  const terminal = document.getElementById("terminal");
  const focus = () => {{
    const input = terminal.querySelector("textarea.xterm-helper-textarea");
    if (input) input.focus();
    return input !== null;
  }};
  if (!focus()) {{
    const watch = new MutationObserver(() => {{ if (focus()) watch.disconnect(); }});
    watch.observe(terminal, {{ childList: true, subtree: true }});
  }}
}});
</script>
</head>
<body>
<div class="notice starting">Starting {title}...</div>
<div class="notice ended">Session ended.
  <button type="button" onclick="window.location.reload()">Restart</button></div>
<div id="start"></div>
<div id="terminal" class="textual-terminal" data-session-websocket-url="{websocket_url}"
     data-font-size="{font_size}"></div>
</body>
</html>
"""


FULL_PAGE = """<!DOCTYPE html>
<html>
<head><meta charset="utf-8"><meta http-equiv="refresh" content="{retry_s}"><title>{title}: full</title></head>
<body style="background: #0c181f; color: #f2f2f2; font-family: monospace; padding: 48px;">
<p>{message}</p>
<p>This page tries again every {retry_s} seconds.</p>
</body>
</html>
"""
DEFAULT_MAX_VISITORS = 16
WIDTH_RANGE, HEIGHT_RANGE = (20, 500), (8, 200)  # terminal cells a visitor may ask for
RETRY_S = 10
LOOPBACK_NAMES = ("localhost",)
# What one visitor may cost (docs/serve.md, "Security"): limits, not measurements.
MAX_MESSAGE_BYTES = 16 * 1024  # one websocket message from a page (a paste); a larger one ends the session
# input events (a key, a mouse report, a pasted character) the app queues: a burst holds one message
# at the cap, so a paste of up to MAX_MESSAGE_BYTES is admitted whole
INPUT_BURST, INPUT_RATE_S = MAX_MESSAGE_BYTES, 64
MESSAGE_BURST, MESSAGE_RATE_S = 512, 64  # websocket messages of any kind (a key, a mouse move, a resize)
APP_QUIT_S = 2  # how long an app may take to quit, then to stop on SIGTERM, before SIGKILL
SEND_LIMIT_S = 10  # how long a message to the app (or a pong to the page) may wait to be taken


def clamp_size(width: int, height: int) -> tuple[int, int]:
    """A terminal size within WIDTH_RANGE x HEIGHT_RANGE (a huge one would cost the server memory)."""
    return (min(max(width, WIDTH_RANGE[0]), WIDTH_RANGE[1]), min(max(height, HEIGHT_RANGE[0]), HEIGHT_RANGE[1]))


class BlockvizServer(Server):
    """textual-serve's Server running `command` once per visitor, with blockviz's offline page.

    `on_ready` is called with the server's URLs once it listens (the CLI prints them).
    `max_visitors` sessions run at once; `allow_origins` are origins besides the page's own whose
    pages may open a session (e.g. "https://course.example.org"); `allow_hosts` are names besides
    this machine's addresses that the server answers to (a name the room's DNS gives it)."""

    def __init__(self, command: str, *, title: str, host: str, port: int,
                 on_ready: Callable[[list[str]], None], max_visitors: int = DEFAULT_MAX_VISITORS,
                 allow_origins: Iterable[str] = (), allow_hosts: Iterable[str] = ()) -> None:
        super().__init__(command, host=host, port=port, title=title)
        self.on_ready = on_ready
        self.max_visitors = max_visitors
        self.allow_origins = {normal_origin(origin) for origin in allow_origins}
        self.allow_hosts = {name.lower().rstrip(".") for name in allow_hosts}
        self.sessions: set[VisitorSession] = set()
        self.guard: ConnectionGuard | None = None

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.extend([self._track_request, self._check_host])
        return app

    @web.middleware
    async def _track_request(self, request: web.Request, handler) -> web.StreamResponse:
        """Tell the connection guard a whole request header arrived, and when its request ends."""
        if self.guard is None or request.transport is None:
            return await handler(request)
        self.guard.request_started(request.transport)
        try:
            return await handler(request)
        finally:
            self.guard.request_ended(request.transport)

    @web.middleware
    async def _check_host(self, request: web.Request, handler) -> web.StreamResponse:
        """Refuse a request whose Host this server does not answer to: a page on another site
        whose name was rebound to this machine's address (DNS rebinding) names its own host."""
        host = request.headers.get("Host")
        if host is not None and not self.answers_to(host):
            return web.Response(status=403, text=f"blockviz serve does not answer to the host {host!r}; "
                                                 "the speaker can add a name with --allow-host NAME\n")
        return await handler(request)

    def answers_to(self, host_header: str) -> bool:
        """Whether a Host header names this server: one of its addresses, or an allowed name."""
        name = host_name(host_header)
        if name in self.allow_hosts:
            return True
        served = self.host.lower().rstrip(".")
        wildcard = served in ("0.0.0.0", "::", "")
        try:
            address = ipaddress.ip_address(name)
        except ValueError:  # a name: this machine's own, or what --host named
            if name == served or (name in LOOPBACK_NAMES and (wildcard or _is_loopback(served))):
                return True
            return wildcard and name in _own_names()
        if wildcard:
            return True  # any address of this machine; a rebound name never arrives as an address
        return address == _address(served) or (address.is_loopback and _is_loopback(served))

    def origin_allowed(self, request: web.Request) -> bool:
        """The websocket's Origin is the page's own (this server, as the browser named it) or one
        given with --allow-origin. No Origin: not a browser, which no other site can drive."""
        origin = request.headers.get("Origin")
        if origin is None:
            return True
        own = f"{'https' if request.secure else 'http'}://{request.host}"
        return normal_origin(origin) in {normal_origin(own), *self.allow_origins}

    @property
    def full(self) -> bool:
        """Whether max_visitors apps run (or are starting): an app that has exited frees its place
        at once, before the server has read the end of its output."""
        return sum(session.app.running for session in self.sessions) >= self.max_visitors

    def full_message(self) -> str:
        visitors = f"{self.max_visitors} visitor{'s' if self.max_visitors != 1 else ''}"
        return (f"This blockviz server is full ({visitors} at once). "
                "Wait a little: a place frees when someone closes their tab.")

    async def handle_websocket(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]
        """textual-serve's session (its `handle_websocket`), once the Origin is checked, a place is free,
        and the size asked for is clamped; a visitor beyond max_visitors reads why in the terminal and
        no process starts. The session ends, and its app process with it, when the tab closes, when the
        visitor breaks a limit or sends a malformed message (one log line), or when the server stops."""
        if not self.origin_allowed(request):
            return web.Response(status=403, text=f"blockviz serve: a page from {request.headers['Origin']!r} "
                                                 "may not open a session here (--allow-origin adds one)\n")
        if self.full:
            return await self._refuse_full(request)
        width, height = clamp_size(to_int(request.query.get("width", "80"), 80),
                                   to_int(request.query.get("height", "24"), 24))
        websocket = web.WebSocketResponse(heartbeat=15, max_msg_size=MAX_MESSAGE_BYTES, timeout=APP_QUIT_S)
        app = VisitorApp(self.command, write_bytes=websocket.send_bytes, write_str=websocket.send_str,
                         close=websocket.close, download_manager=self.download_manager, debug=self.debug)
        session = VisitorSession(websocket, app, visitor=request.remote or "a visitor")
        self.sessions.add(session)
        try:
            await websocket.prepare(request)
            await app.start(width, height)
            await session.run()
        finally:
            await session.end()
            self.sessions.discard(session)
        return websocket

    async def _refuse_full(self, request: web.Request) -> web.WebSocketResponse:
        websocket = web.WebSocketResponse()
        await websocket.prepare(request)
        await websocket.send_bytes(f"\r\n  {self.full_message()}\r\n  Then press Restart.\r\n".encode())
        await websocket.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"server full")
        return websocket

    async def handle_index(self, request: web.Request) -> web.Response:  # type: ignore[override]
        """The page; its websocket goes back to the host and port the browser used (the address the
        connection came to, for a client that sends no Host). When every place is taken, a page
        that says so and tries again."""
        if self.full:
            return web.Response(status=503, content_type="text/html", headers={"Retry-After": str(RETRY_S)},
                                text=FULL_PAGE.format(title=html.escape(self.title), retry_s=RETRY_S,
                                                      message=html.escape(self.full_message())))
        scheme = "wss" if request.secure else "ws"
        page = PAGE.format(title=html.escape(self.title),
                           websocket_url=html.escape(f"{scheme}://{page_host(request)}/ws"),
                           font_size=to_int(request.query.get("fontsize", "16"), 16))
        return web.Response(text=page, content_type="text/html")

    def initialize_logging(self) -> None:
        """One plain line per log record on stderr, never a traceback (textual-serve's own logging
        prints Rich tracebacks), and no line per request: a classroom loading the page and its
        assets would push the URLs printed at the start off the speaker's screen."""
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(OneLineFormatter())
        logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def on_startup(self, app: web.Application) -> None:
        """Nothing: textual-serve prints its logo here; `serve` calls on_ready once it listens."""

    def serve(self, debug: bool = False) -> None:
        """Listen until SIGINT or SIGTERM, then end every visitor's session and app process.

        textual-serve's `serve` (aiohttp's `run_app`), with the listener behind a ConnectionGuard.
        Raises OSError when the address cannot be listened on."""
        self.debug = debug
        self.initialize_logging()
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(log_loop_error)
        stopping = asyncio.Event()
        for stop_signal in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(stop_signal, stopping.set)
        runner = await self.listen(connection_limit(self.max_visitors))
        try:
            self.on_ready(urls(self.host, self.port))
            await stopping.wait()
            for site in list(runner.sites):
                await site.stop()
            await self.end_sessions()
        finally:
            await runner.cleanup()

    async def end_sessions(self) -> None:
        """End every session and its app, and wait for their handlers to finish (one that was
        starting its app ends it too), for 4 x APP_QUIT_S at most."""
        deadline = asyncio.get_running_loop().time() + 4 * APP_QUIT_S
        while self.sessions and asyncio.get_running_loop().time() < deadline:
            await asyncio.gather(*(session.end(WSCloseCode.GOING_AWAY, "the server stopped")
                                   for session in list(self.sessions)))
            await asyncio.sleep(0.05)

    async def listen(self, max_connections: int, header_timeout_s: float = HEADER_TIMEOUT_S) -> web.AppRunner:
        """Listen on host:port behind a ConnectionGuard; the caller cleans the runner up."""
        runner = web.AppRunner(await self._make_app(), shutdown_timeout=APP_QUIT_S)
        await runner.setup()
        self.guard = ConnectionGuard(runner.server, max_connections, header_timeout_s)
        try:
            await GuardedSite(runner, self.host, self.port, self.guard).start()
        except BaseException:
            await runner.cleanup()
            raise
        return runner


class _ClampedSize:
    """An AppService whose set_terminal_size clamps what the browser asks for."""

    def __init__(self, app_service: Any) -> None:
        self._app_service = app_service

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app_service, name)

    async def set_terminal_size(self, width: int, height: int) -> None:
        await self._app_service.set_terminal_size(*clamp_size(int(width), int(height)))


class VisitorApp(AppService):
    """textual-serve's AppService (one visitor's app process) that can be ended at once."""

    _ending: asyncio.Future | None = None

    @property
    def running(self) -> bool:
        """Whether the app is starting or runs; one that has exited, reaped or not, does not."""
        process = self._process
        if process is None:
            return True
        if process.returncode is not None:
            return False
        try:  # WNOWAIT: look, and leave it to asyncio to reap
            return os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is None
        except ChildProcessError:
            return False
        except (AttributeError, OSError):  # no waitid here: it runs until asyncio has reaped it
            return True

    async def end(self) -> None:
        """textual-serve's `stop` (cancel the app's downloads, ask it to quit, wait for its output to
        close), but for APP_QUIT_S only, then SIGTERM and SIGKILL, each after APP_QUIT_S: an app busy
        with a visitor's input, or not reading it, would otherwise outlive the visitor's tab. Once
        for a started app, however often and from wherever it is called (its tab, the server)."""
        if self._process is None or self._task is None:
            return  # not started (yet: the session's own end comes after its start)
        if self._ending is None:
            self._ending = asyncio.ensure_future(self._end(self._process, self._task))
        await asyncio.shield(self._ending)

    async def _end(self, process: asyncio.subprocess.Process, task: asyncio.Task) -> None:
        await self._download_manager.cancel_app_downloads(app_service_id=self.app_service_id)
        asking = asyncio.ensure_future(self.send_meta({"type": "quit"}))
        await asyncio.wait({task}, timeout=APP_QUIT_S)
        asking.cancel()
        if task.done() and process.stdout is not None and process.stdout.at_eof():
            return  # it quit: its output closed as it exited (asyncio reaps it)
        for stop_signal in (signal.SIGTERM, signal.SIGKILL):
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(stop_signal)
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(process.wait(), APP_QUIT_S)
                break
        await process.wait()
        await asyncio.wait({task}, timeout=APP_QUIT_S)  # it reads the output to its end


class SessionEnded(Exception):
    """Why the server ends a visitor's session (a limit broken, a malformed message): one log line."""

    def __init__(self, reason: str, code: int = WSCloseCode.POLICY_VIOLATION) -> None:
        super().__init__(reason)
        self.code = code


class RateLimit:
    """A token bucket: `burst` at once, refilled at `rate` a second; `take` says whether it had enough."""

    def __init__(self, rate: float, burst: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.last = burst, clock()

    def take(self, amount: float) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.last) * self.rate)
        self.last = now
        if amount > self.tokens:
            return False
        self.tokens -= amount
        return True


class VisitorSession:
    """One visitor's websocket and app process: textual-serve's `_process_messages` loop, with every
    message checked (its shape, its size, the visitor's rate) before the app sees it."""

    def __init__(self, websocket: web.WebSocketResponse, app: VisitorApp, visitor: str) -> None:
        self.websocket, self.app, self.visitor = websocket, app, visitor
        self.messages = RateLimit(MESSAGE_RATE_S, MESSAGE_BURST)
        self.input_events = RateLimit(INPUT_RATE_S, INPUT_BURST)

    async def run(self) -> None:
        """Forward the page's messages to the app until the tab closes or a message breaks a rule."""
        try:
            async for message in self.websocket:
                await self.forward(message)
        except ConnectionError:  # the tab went away while the server answered it
            pass
        except SessionEnded as ended:
            log.warning("%s: session ended: %s", self.visitor, ended)
            await self.end(ended.code, str(ended))

    async def forward(self, message: Any) -> None:
        """One websocket message to the app, or SessionEnded saying what was wrong with it."""
        if message.type == WSMsgType.ERROR:
            raise SessionEnded(f"{message.data}", WSCloseCode.MESSAGE_TOO_BIG)
        if not self.messages.take(1):
            raise SessionEnded(f"more than {MESSAGE_RATE_S} messages a second")
        if message.type != WSMsgType.TEXT:
            return
        kind, data = parse_message(message.data)
        if kind == "stdin":
            if not self.input_events.take(count_input_events(data)):
                raise SessionEnded(f"more than {INPUT_RATE_S} keys a second")
            sending = self.app.send_bytes(data.encode("utf-8", "replace"))
        elif kind == "resize":
            sending = _ClampedSize(self.app).set_terminal_size(data["width"], data["height"])
        elif kind == "ping":
            sending = self.websocket.send_json(["pong", data])
        elif kind in ("blur", "focus"):
            sending = getattr(self.app, kind)()
        else:
            return
        try:  # an app (or a page) that takes nothing would hold this loop, and miss the tab closing
            await asyncio.wait_for(sending, SEND_LIMIT_S)
        except asyncio.TimeoutError:
            raise SessionEnded(f"the app or the page took nothing for {SEND_LIMIT_S} s") from None

    async def end(self, code: int = WSCloseCode.GOING_AWAY, reason: str = "") -> None:
        """Close the websocket, saying why, and end the app process, both at once: a page that does
        not answer the close (within APP_QUIT_S) does not hold the app."""
        if self.websocket.closed:
            await self.app.end()
            return

        async def close() -> None:
            with contextlib.suppress(ConnectionError, RuntimeError):
                await self.websocket.close(code=code, message=reason.encode()[:120])

        await asyncio.gather(close(), self.app.end())


MESSAGE_KINDS = ("stdin", "resize", "ping", "blur", "focus")  # what textual-serve's page sends
ESCAPE_SEQUENCE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|O.|.)?", re.DOTALL)  # a CSI or SS3 sequence, or Alt+key
# a bracketed paste (the page wraps a paste in these when the app asked for mode 2004, as Textual
# does), to its end marker or to the end of the message
BRACKETED_PASTE = re.compile(r"\x1b\[200~.*?(?:\x1b\[201~|$)", re.DOTALL)


def count_input_events(keys: str) -> int:
    """How many events the app makes of this terminal input: one per bracketed paste (Textual's
    XTermParser makes one Paste event of it), one per escape sequence (an arrow key, a mouse
    report) and one per other character. The app queues them all at once, so this, not the bytes,
    is what a visitor's input costs it."""
    return len(ESCAPE_SEQUENCE.sub("e", BRACKETED_PASTE.sub("p", keys)))


def parse_message(text: str) -> tuple[str, Any]:
    """A page's message as (kind, data), checked as textual-serve's loop expects it, or SessionEnded.
    A kind this server does not know is ("", None): a newer page may send more."""
    try:
        envelope = json.loads(text)
    except ValueError:
        raise SessionEnded("a message that is not JSON") from None
    if not isinstance(envelope, list) or not envelope or not isinstance(envelope[0], str):
        raise SessionEnded("a message that is not [kind, data]")
    kind, data = envelope[0], envelope[1] if len(envelope) > 1 else None
    if kind == "stdin" and not isinstance(data, str):
        raise SessionEnded("a stdin message whose data is not text")
    if kind == "resize" and not (isinstance(data, dict) and all(
            isinstance(data.get(side), int) and not isinstance(data.get(side), bool) for side in ("width", "height"))):
        raise SessionEnded("a resize message without an integer width and height")
    return (kind, data) if kind in MESSAGE_KINDS else ("", None)


class OneLineFormatter(logging.Formatter):
    """A log record as one line, `blockviz serve: ...`; an exception as its type and message."""

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            text += f" ({type(record.exc_info[1]).__name__}: {record.exc_info[1]})"
        return "blockviz serve: " + " ".join(text.split())


def page_host(request: web.Request) -> str:
    """The host[:port] the browser asked for: its Host header, or without one (HTTP/1.0) the address
    and port the connection came to (aiohttp would give this machine's name, without the port)."""
    if "Host" in request.headers:
        return request.host
    sockname = request.transport.get_extra_info("sockname") if request.transport else None
    return f"{_bracket(sockname[0])}:{sockname[1]}" if sockname else request.host


def host_name(host_header: str) -> str:
    """The name or address in a Host header, without its port or IPv6 brackets, lower-cased."""
    host = host_header.strip().lower()
    if host.startswith("["):
        return host[1:].split("]", 1)[0]
    if host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


def normal_origin(origin: str) -> str:
    """An origin (scheme://host[:port]) lower-cased, without a trailing slash or a default port."""
    origin = origin.strip().lower().rstrip("/")
    for scheme, port in (("http://", ":80"), ("https://", ":443")):
        if origin.startswith(scheme) and origin.endswith(port):
            origin = origin[: -len(port)]
    return origin


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _is_loopback(host: str) -> bool:
    address = _address(host)
    return host in LOOPBACK_NAMES or (address is not None and address.is_loopback)


def _own_names() -> set[str]:
    """This machine's host name, bare and with .local (what mDNS gives it on a LAN)."""
    name = socket.gethostname().lower().rstrip(".")
    short = name.split(".", 1)[0]
    return {name, short, f"{short}.local"}


def urls(host: str, port: int) -> list[str]:
    """The addresses to open: the host given, or for a wildcard (0.0.0.0, ::) this machine
    itself and then its LAN address when one can be found."""
    if host not in ("0.0.0.0", "::", ""):
        return [f"http://{_bracket(host)}:{port}"]
    found = [f"http://127.0.0.1:{port}"]
    lan = lan_address()
    if lan:
        found.append(f"http://{lan}:{port}")
    return found


def lan_address() -> str | None:
    """This machine's address on its LAN: the source address of a route to a private address
    (a UDP connect sends nothing), or None without a network."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.254.254.254", 1))
            address = probe.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith(("127.", "0.")) else address


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def check_port_free(host: str, port: int) -> str | None:
    """Why `port` on `host` cannot be listened on (in use, not this machine's address, ...) as
    one line, or None when it can. The server binds the same way (SO_REUSEADDR)."""
    import errno

    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as exc:
        return f"--host {host}: {exc.strerror}"
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use: pick another with --port"
            if exc.errno == errno.EADDRNOTAVAIL:
                return f"--host {host} is not an address of this machine (0.0.0.0 listens on all of them)"
            if exc.errno == errno.EACCES:
                return f"port {port} needs privileges: use a port above 1023"
            return f"cannot listen on {host}:{port}: {exc.strerror}"
    return None
