"""Subcommands: each module has `add_parser(subparsers)` and `execute(args) -> int`.

Modules are imported lazily by name so a subcommand pulls in only what it needs.
"""

from __future__ import annotations

import importlib

COMMANDS = ("generate", "run", "record", "replay", "explain", "compare", "serve", "publish", "attach", "export",
            "site")


def _module(name: str):
    return importlib.import_module(f"blockviz.commands.{name}")


def register(subparsers) -> None:
    for name in COMMANDS:
        _module(name).add_parser(subparsers)


def dispatch(args) -> int:
    return _module(args.command).execute(args)
