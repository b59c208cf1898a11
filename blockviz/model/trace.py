"""Trace files: an engine's event stream on disk, one JSON object per line.

Line 1 is a header ({"format": "blockviz-trace", "version": 1, ...} with the model, block size,
pool sizes, prefix caching and the requests that were run); every following line is one event's
`Event.to_json()`. A replay feeds these events to the same reducer and views as a live run, so a
trace needs no model and no torch (this module imports only `engine.events`).

Reading is strict and says exactly what is wrong, in one line: a missing file, a file that is not
a trace, a trace from a newer blockviz, or the number of the first corrupted line: a line that does
not parse, or an event that does not make sense where it stands (blockviz/model/trace_check.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterable

from blockviz.model.trace_check import TraceChecker
from engine.events import Event, event_from_dict

TRACES_DIR = Path(__file__).resolve().parents[1] / "traces"  # the shipped traces (package data)
FORMAT_NAME = "blockviz-trace"
FORMAT_VERSION = 1
REQUIRED_HEADER_FIELDS = ("block_size", "num_gpu_blocks", "num_cpu_blocks")


class TraceError(ValueError):
    """A trace cannot be read; str() is one line naming the file (and line) and the problem."""


@dataclass(slots=True)
class Trace:
    """A header and the events that follow it."""

    header: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    path: str | None = None

    @property
    def block_size(self) -> int:
        return int(self.header["block_size"])

    @property
    def num_gpu_blocks(self) -> int:
        return int(self.header["num_gpu_blocks"])

    @property
    def num_cpu_blocks(self) -> int:
        return int(self.header["num_cpu_blocks"])


def engine_title(header: dict[str, Any]) -> str:
    """A short description for the UI from a trace header or an engine session's header: model,
    block size, pools, and prefix caching when on."""
    caching = " · prefix caching" if header.get("enable_prefix_caching") else ""
    return (f"{header.get('model', '?')} · block size {header['block_size']} · "
            f"{header['num_gpu_blocks']} GPU / {header['num_cpu_blocks']} CPU blocks{caching}")


def make_header(engine_header: dict[str, Any], **run: Any) -> dict[str, Any]:
    """The header line: format name and version, blockviz version, the engine's settings
    (blockviz.session.engine_session.trace_header: model, block_size, num_gpu_blocks,
    num_cpu_blocks, enable_prefix_caching, ...) and the run's settings (prompts, n, max_tokens,
    seed, ...)."""
    from blockviz import __version__

    header: dict[str, Any] = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "blockviz_version": __version__}
    header.update(engine_header)
    header.update(run)
    missing = [name for name in REQUIRED_HEADER_FIELDS if name not in header]
    if missing:
        raise ValueError(f"trace header lacks {', '.join(missing)}")
    return header


class TraceWriter:
    """Writes a header then events, one per line; usable as an EventBus subscriber.

    >>> with TraceWriter.open(path, header) as writer:
    ...     unsubscribe = engine.events.subscribe(writer)
    """

    def __init__(self, stream: IO[str], header: dict[str, Any]) -> None:
        self._stream = stream
        self.num_events = 0
        stream.write(json.dumps(header, separators=(",", ":")) + "\n")

    @classmethod
    def open(cls, path: str | Path, header: dict[str, Any]) -> "TraceWriter":
        return cls(open(path, "w", encoding="utf-8"), header)

    def __call__(self, event: Event) -> None:
        self.write(event)

    def write(self, event: Event) -> None:
        self._stream.write(event.to_json() + "\n")
        self.num_events += 1

    def write_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.write(event)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def write_trace(path: str | Path, header: dict[str, Any], events: Iterable[Event]) -> None:
    with TraceWriter.open(path, header) as writer:
        writer.write_all(events)


def parse_header(line: str, name: str) -> dict[str, Any]:
    """Check line 1 and return the header dict, or raise TraceError."""
    not_a_trace = f"{name} is not a blockviz trace (line 1 must be a {FORMAT_NAME!r} header)"
    try:
        header = json.loads(line)
    except ValueError:
        raise TraceError(not_a_trace) from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise TraceError(not_a_trace)
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceError(f"{name} line 1: format version {version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        from blockviz import __version__

        raise TraceError(
            f"{name} has trace format version {version}, newer than the version {FORMAT_VERSION} "
            f"this blockviz {__version__} reads: upgrade blockviz"
        )
    for key in REQUIRED_HEADER_FIELDS:
        value = header.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < (1 if key != "num_cpu_blocks" else 0):
            raise TraceError(f"{name} line 1: header field {key!r} is missing or not a valid count ({value!r})")
    return header


def read_trace(path: str | Path) -> Trace:
    """Read a whole trace; raise TraceError (one line) for any problem."""
    name = repr(str(path))
    path = Path(path)
    if not path.exists():
        raise TraceError(f"trace file {name} does not exist")
    if path.is_dir():
        raise TraceError(f"{name} is a directory, not a trace file")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TraceError(f"{name} is not a blockviz trace (not UTF-8 text)") from None
    except OSError as exc:
        raise TraceError(f"cannot read {name}: {exc.strerror or exc}") from None
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise TraceError(f"{name} is not a blockviz trace (it is empty)" if not text.strip()
                         else f"{name} is not a blockviz trace (line 1 must be a {FORMAT_NAME!r} header)")
    header = parse_header(lines[0], name)
    trace = Trace(header, [], str(path))
    try:
        checker = TraceChecker(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"],
                               header.get("kv_manager") or "v0")
    except ValueError as exc:
        raise TraceError(f"{name} line 1: {exc}") from None
    for number, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            event = event_from_dict(data)
            checker.check(event)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TraceError(f"{name} line {number} is corrupted: {reason}") from None
        trace.events.append(event)
    return trace


def shipped_traces() -> list[str]:
    """Names of the traces bundled in blockviz/traces/ (`blockviz replay NAME`, `Visualizer.from_trace(NAME)`)."""
    return sorted(path.stem for path in TRACES_DIR.glob("*.jsonl"))


def resolve_trace_path(name: str | Path) -> Path:
    """A path as given, else a shipped trace of that name (with or without .jsonl)."""
    path = Path(name)
    if path.exists():
        return path
    shipped = TRACES_DIR / (path.name if path.suffix == ".jsonl" else f"{path.name}.jsonl")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    return path


def load_trace(name: str | Path) -> Trace:
    """read_trace() of a path or a shipped trace's name; a missing one's TraceError lists the shipped names."""
    path = resolve_trace_path(name)
    try:
        return read_trace(path)
    except TraceError as exc:
        if path.exists() or not shipped_traces():
            raise
        raise TraceError(f"{exc} (shipped traces: {', '.join(shipped_traces())})") from None
