"""`blockviz replay FILE.jsonl [--projector]`: open the TUI on a recorded trace.

No model and no torch: the trace holds every event, the reducer rebuilds the picture. A name of a
shipped trace (`blockviz replay fork-cow`) opens the one bundled in blockviz/traces/.
"""

from __future__ import annotations

from pathlib import Path

from blockviz.session.scenario import is_story  # noqa: F401 (the replay's default: guided for a story)

from blockviz.commands.options import add_break_on_option, add_guided_option
from blockviz.errors import UsageError, did_you_mean
from blockviz.model.trace import TRACES_DIR, resolve_trace_path, shipped_traces  # noqa: F401 (re-exported)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "replay", help="open the TUI on a recorded trace (no model needed)",
        description="Open the TUI on a trace written by `blockviz record`. Shipped traces: "
                    + (", ".join(shipped_traces()) or "none"))
    parser.add_argument("trace", metavar="FILE.jsonl", help="a trace file, or the name of a shipped trace")
    parser.add_argument("--projector", action="store_true", help="big cells, high contrast, fewer panels")
    add_break_on_option(parser)
    add_guided_option(parser, "default: on for a recording of the story, else off")


def check(args):
    """The trace, read and checked before the app opens (a bad one is a one-line UsageError);
    returns (path, trace). `blockviz serve replay` calls it too."""
    from blockviz.model.trace import TraceError, load_trace

    path = resolve_trace_path(args.trace)
    try:
        return path, load_trace(path)
    except TraceError as exc:
        near = "" if path.exists() else did_you_mean(Path(args.trace).stem, shipped_traces())
        raise UsageError(f"{exc}{near}") from None


def execute(args) -> int:
    path, trace = check(args)
    from blockviz.tui.app import BlockvizApp

    guided = args.guided if args.guided is not None else is_story(trace.header)
    app = BlockvizApp(trace=trace, projector=args.projector, source_name=path.name, break_on=args.break_on,
                      guided=guided)
    app.run()
    return app.return_code or 0
