"""`blockviz replay FILE.jsonl [--projector]`: open the TUI on a recorded trace.

No model and no torch: the trace holds every event, the reducer rebuilds the picture. A name of a
shipped trace (`blockviz replay fork-cow`) opens the one bundled in blockviz/traces/.
"""

from __future__ import annotations

from pathlib import Path

from blockviz.cli import UsageError

TRACES_DIR = Path(__file__).resolve().parent.parent / "traces"


def shipped_traces() -> list[str]:
    return sorted(path.stem for path in TRACES_DIR.glob("*.jsonl"))


def resolve_trace_path(name: str) -> Path:
    """A path as given, else a shipped trace of that name (with or without .jsonl)."""
    path = Path(name)
    if path.exists():
        return path
    shipped = TRACES_DIR / (path.name if path.suffix == ".jsonl" else f"{path.name}.jsonl")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    return path


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "replay", help="open the TUI on a recorded trace (no model needed)",
        description="Open the TUI on a trace written by `blockviz record`. Shipped traces: "
                    + (", ".join(shipped_traces()) or "none"))
    parser.add_argument("trace", metavar="FILE.jsonl", help="a trace file, or the name of a shipped trace")
    parser.add_argument("--projector", action="store_true", help="big cells, high contrast, fewer panels")


def execute(args) -> int:
    from blockviz.trace import TraceError, read_trace

    path = resolve_trace_path(args.trace)
    try:
        trace = read_trace(path)
    except TraceError as exc:
        message = str(exc)
        if not path.exists() and shipped_traces():
            message += f" (shipped traces: {', '.join(shipped_traces())})"
        raise UsageError(message) from None
    from blockviz.app import BlockvizApp

    app = BlockvizApp(trace=trace, projector=args.projector, source_name=path.name)
    app.run()
    return app.return_code or 0
