"""`blockviz serve run|replay ... [--host H] [--port P]`: the TUI in a browser tab, one app process
per visitor (textual-serve).

The command to serve is parsed and checked here first, with blockviz's own parser and the checks
its command makes before opening the app, so bad input is one line and exit 2 before any server
starts. Each visitor then gets `python -m blockviz <that command>`, run with this Python and this
blockviz. This process never imports torch: `run --device cuda` is checked in a short child process.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
from pathlib import Path

from blockviz.commands.options import OneLineParser, int_at_least
from blockviz.errors import UsageError

SERVED = ("run", "replay")
DEFAULT_MAX_VISITORS = {"replay": 30, "run": 4}  # a laptop: a replay app is light, a run holds an engine
DEFAULT_HOST, DEFAULT_PORT = "127.0.0.1", 8000
DEVICE_CHECK_LIMIT_S = 300  # importing torch on a cold disk; a limit, not a measurement
DEVICE_CHECK = ("import sys\nfrom blockviz.errors import UsageError\nfrom blockviz.session.spec import check_device\n"
                "try:\n    check_device(sys.argv[1])\nexcept UsageError as exc:\n    sys.exit(str(exc))\n")


def _add_address_options(parser: argparse.ArgumentParser) -> None:
    """The server's own options; they may come before or after the served command."""
    parser.add_argument("--host", default=DEFAULT_HOST,
                        help=f"address to listen on (default {DEFAULT_HOST}: this machine only); "
                             "--host 0.0.0.0 lets anyone on the LAN open it, with no password")
    parser.add_argument("--port", type=int_at_least("--port", 1, 65535), default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})")
    parser.add_argument("--max-visitors", type=int_at_least("--max-visitors", 1), default=None, metavar="N",
                        help=f"sessions at once, each an app process (default {DEFAULT_MAX_VISITORS['replay']} "
                             f"for replay, {DEFAULT_MAX_VISITORS['run']} for run); later visitors are told to wait")
    parser.add_argument("--allow-origin", action="append", default=[], metavar="URL",
                        help="let pages of this origin (e.g. https://course.example.org) open a session too; "
                             "repeat it for several (default: only the page this server serves)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="answer to this host name too (e.g. speaker.lan); by default only this "
                             "machine's addresses, localhost and its host name")


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "serve", help="serve the TUI to browsers (one app process per visitor)",
        description="Put the TUI in a browser tab: every visitor of the printed URL gets their own "
                    "`blockviz run` or `blockviz replay` process, nothing to install but a browser. "
                    "The page needs no network beyond this server. There is no authentication: "
                    "keep it on 127.0.0.1, or on a LAN you trust with --host 0.0.0.0.",
        epilog="examples: blockviz serve replay fork-cow --host 0.0.0.0   |   "
               "blockviz serve run --prompt 'ROMEO:' --port 8080")
    _add_address_options(parser)
    parser.add_argument("command_to_serve", nargs=argparse.REMAINDER, metavar="run|replay ...",
                        help="the command each visitor gets, with its options (--host and --port "
                             "may come after it too)")


def split_command(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """--host/--port given after the served command, taken out of it: (address options, the rest)."""
    parser = OneLineParser(prog="blockviz serve", add_help=False, allow_abbrev=False)
    _add_address_options(parser)
    parser.set_defaults(host=None, port=None, max_visitors=None)
    return parser.parse_known_args(argv)


def check_command(argv: list[str]) -> argparse.Namespace:
    """Parse and check the served command as `blockviz` would before opening its app."""
    if not argv or argv[0] not in SERVED:
        given = f", not {argv[0]!r}" if argv else ""
        raise UsageError(f"serve needs a command to serve: run or replay{given} "
                         "(e.g. blockviz serve replay fork-cow)")
    from blockviz.cli import build_parser
    from blockviz.commands import replay, run

    args = build_parser().parse_args(argv)  # a bad option: one line and exit 2, as blockviz's own
    if args.command == "replay":
        replay.check(args)
    else:
        spec = run.check(args, device=False)
        if spec.config.device is not None:
            check_device_in_child(spec.config.device)
    return args


def check_device_in_child(device: str) -> None:
    """EngineSpec's CUDA check, run where importing torch does not weigh on the server."""
    if not device.startswith("cuda"):
        return
    result = subprocess.run([sys.executable, "-c", DEVICE_CHECK, device], capture_output=True, text=True,
                            timeout=DEVICE_CHECK_LIMIT_S, stdin=subprocess.DEVNULL)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        raise UsageError(lines[-1] if lines else f"--device {device}: the check failed")


def visitor_command(argv: list[str]) -> str:
    """The shell line textual-serve runs for each visitor (exec: the app is the process it stops)."""
    return "exec " + shlex.join([sys.executable, "-m", "blockviz", *argv])


def use_this_blockviz() -> None:
    """Visitors' processes import the blockviz this process runs, wherever they start."""
    root = str(Path(__file__).resolve().parents[2])
    paths = os.environ.get("PYTHONPATH", "")
    if root not in paths.split(os.pathsep):
        os.environ["PYTHONPATH"] = root + (os.pathsep + paths if paths else "")


def print_ready(argv: list[str], host: str, found_urls: list[str], max_visitors: int) -> None:
    print(f"blockviz serve: `blockviz {shlex.join(argv)}`, one app process per visitor, "
          f"{max_visitors} at once (--max-visitors)")
    print(f"  open {found_urls[0]}" + "".join(f"\n  or   {url}" for url in found_urls[1:]))
    if host in ("127.0.0.1", "localhost", "::1"):
        print("  only this machine can connect; --host 0.0.0.0 opens it to the LAN")
    else:
        print("  no authentication: anyone who can reach this address can connect")
    print("  Ctrl+C stops the server and every visitor's app", flush=True)


def execute(args) -> int:
    address, argv = split_command(args.command_to_serve)
    host, port = address.host or args.host, address.port or args.port
    use_this_blockviz()
    check_command(argv)
    from blockviz.web import BlockvizServer, check_port_free

    problem = check_port_free(host, port)
    if problem:
        raise UsageError(problem)
    max_visitors = address.max_visitors or args.max_visitors or DEFAULT_MAX_VISITORS[argv[0]]
    server = BlockvizServer(visitor_command(argv), title=f"blockviz {shlex.join(argv)}", host=host, port=port,
                            on_ready=lambda found: print_ready(argv, host, found, max_visitors),
                            max_visitors=max_visitors, allow_origins=args.allow_origin + address.allow_origin,
                            allow_hosts=args.allow_host + address.allow_host)
    try:
        server.serve()
    except OSError as exc:  # the port taken between the check and the bind
        raise UsageError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None
    return 0
