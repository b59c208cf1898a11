"""The TUI in a browser tab: textual-serve's server with a page that needs nothing from outside.

textual-serve (Textualize/textual-serve) starts one app process per browser connection: the
page's xterm.js terminal talks to it over a websocket, keys in, screen out. Its stock page asks
fonts.googleapis.com for Roboto Mono and builds the websocket's address from --host, so
`--host 0.0.0.0` hands students ws://0.0.0.0:8000/ws. This page instead declares Roboto Mono from
the font files textual-serve ships (served from /static, like its xterm.js bundle) and takes the
websocket's address from the Host the browser asked for. Nothing here imports torch or textual.
"""

from __future__ import annotations

import html
import logging
import socket
from typing import Callable

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


class BlockvizServer(Server):
    """textual-serve's Server running `command` once per visitor, with blockviz's offline page.

    `on_ready` is called with the server's URLs once it listens (the CLI prints them)."""

    def __init__(self, command: str, *, title: str, host: str, port: int,
                 on_ready: Callable[[list[str]], None]) -> None:
        super().__init__(command, host=host, port=port, title=title)
        self.on_ready = on_ready

    async def handle_index(self, request: web.Request) -> web.Response:  # type: ignore[override]
        """The page; its websocket goes back to the host and port the browser used."""
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
