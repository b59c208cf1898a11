"""`blockviz` command line: generate (no UI), run (live TUI), record (trace, no UI), replay (TUI),
and the rest of blockviz/commands/. This module builds the parser and dispatches; each command's
options are its own module's, the shared ones blockviz/commands/options.py's.

Bad input ends with one line on stderr and exit code 2, never a traceback. Heavy modules (torch,
textual) are imported only by the subcommand that needs them, so `blockviz replay` never loads torch.
"""

from __future__ import annotations

import argparse
import sys

from blockviz.commands.options import OneLineParser, check_attention_backend
from blockviz.errors import UsageError, in_flags, near_model
from blockviz.model.safe_text import safe_line


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="blockviz",
        description="Watch a real paged-KV engine allocate, share, copy-on-write, swap and free its "
                    "KV-cache blocks.",
    )
    from blockviz import __version__

    parser.add_argument("--version", action="version", version=f"blockviz {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)

    from blockviz import commands

    commands.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    try:
        from blockviz import commands

        check_attention_backend(args)
        return commands.dispatch(args)
    except UsageError as exc:
        message = safe_line(f"{in_flags(str(exc))}{near_model(getattr(args, 'model', None), str(exc))}")
        print(f"blockviz: error: {message}", file=sys.stderr)  # control characters written visibly
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())  # python -m blockviz.cli; `python -m blockviz` is blockviz/__main__.py
