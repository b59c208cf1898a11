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
"""

from __future__ import annotations

import html
import ipaddress
import logging
import socket
from typing import Any, Callable, Iterable

from aiohttp import web
from textual_serve.server import Server, to_int

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
        self.num_visitors = 0
        self.allow_origins = {normal_origin(origin) for origin in allow_origins}
        self.allow_hosts = {name.lower().rstrip(".") for name in allow_hosts}

    async def _make_app(self) -> web.Application:
        app = await super()._make_app()
        app.middlewares.append(self._check_host)
        return app

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
        return self.num_visitors >= self.max_visitors

    def full_message(self) -> str:
        visitors = f"{self.max_visitors} visitor{'s' if self.max_visitors != 1 else ''}"
        return (f"This blockviz server is full ({visitors} at once). "
                "Wait a little: a place frees when someone closes their tab.")

    async def handle_websocket(self, request: web.Request) -> web.StreamResponse:  # type: ignore[override]
        """textual-serve's session, once the Origin is checked, a place is free, and the size asked
        for is clamped; a visitor beyond max_visitors reads why in the terminal and no process starts."""
        if not self.origin_allowed(request):
            return web.Response(status=403, text=f"blockviz serve: a page from {request.headers['Origin']!r} "
                                                 "may not open a session here (--allow-origin adds one)\n")
        if self.full:
            return await self._refuse_full(request)
        width, height = clamp_size(to_int(request.query.get("width", "80"), 80),
                                   to_int(request.query.get("height", "24"), 24))
        clamped = request.clone(rel_url=request.rel_url.update_query(width=str(width), height=str(height)))
        self.num_visitors += 1
        try:
            return await super().handle_websocket(clamped)
        finally:
            self.num_visitors -= 1

    async def _refuse_full(self, request: web.Request) -> web.WebSocketResponse:
        websocket = web.WebSocketResponse()
        await websocket.prepare(request)
        await websocket.send_bytes(f"\r\n  {self.full_message()}\r\n  Then press Restart.\r\n".encode())
        await websocket.close(code=1013, message=b"server full")  # 1013: try again later
        return websocket

    async def _process_messages(self, websocket: web.WebSocketResponse, app_service: Any) -> None:
        """textual-serve's loop, with every resize clamped."""
        await super()._process_messages(websocket, _ClampedSize(app_service))

    async def handle_index(self, request: web.Request) -> web.Response:  # type: ignore[override]
        """The page; its websocket goes back to the host and port the browser used. When every
        place is taken, a page that says so and tries again."""
        if self.full:
            return web.Response(status=503, content_type="text/html", headers={"Retry-After": str(RETRY_S)},
                                text=FULL_PAGE.format(title=html.escape(self.title), retry_s=RETRY_S,
                                                      message=html.escape(self.full_message())))
        scheme = "wss" if request.secure else "ws"
        page = PAGE.format(title=html.escape(self.title),
                           websocket_url=html.escape(f"{scheme}://{request.host}/ws"),
                           font_size=to_int(request.query.get("fontsize", "16"), 16))
        return web.Response(text=page, content_type="text/html")

    def initialize_logging(self) -> None:
        """textual-serve's logging without aiohttp's line per request: a classroom loading the page
        and its assets would push the URLs printed at the start off the speaker's screen."""
        super().initialize_logging()
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)

    async def on_startup(self, app: web.Application) -> None:
        self.on_ready(urls(self.host, self.port))


class _ClampedSize:
    """An AppService whose set_terminal_size clamps what the browser asks for."""

    def __init__(self, app_service: Any) -> None:
        self._app_service = app_service

    def __getattr__(self, name: str) -> Any:
        return getattr(self._app_service, name)

    async def set_terminal_size(self, width: int, height: int) -> None:
        await self._app_service.set_terminal_size(*clamp_size(int(width), int(height)))


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
