"""Pictures for slides: a frame at a cursor written as SVG (blockviz.model.svg) or PNG.

`viz.save("step.svg")`, `moment.save(...)` and `blockviz export TRACE --at N --out step.svg` all
come here: the frame is the notebook's (view.snapshot() plus the cursor line the controls show),
drawn by svg.frame_svg; a PNG is that SVG rasterized by resvg (the `resvg-py` package, the
[export] extra: a prebuilt wheel, nothing to compile).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from blockviz.model.player import Player
from blockviz.model.radix_view import RadixHistory, eviction_policy, radix_history, radix_record
from blockviz.model.svg import frame_svg
from blockviz.model.timeline import Timeline
from blockviz.model.trace import Trace, TraceError, check_new_trace_path, engine_title, kv_geometry
from blockviz.model.view import cursor_line, snapshot

FORMATS = (".svg", ".png")
PNG_SCALE = 2  # device pixels per SVG pixel: a PNG stays sharp on a projector's full width
MAX_PNG_PIXELS = 1 << 26  # a PNG's width x height at most (4 bytes each in resvg's buffer): a limit, not a measurement
PNG_NEEDS = "PNG export needs the resvg-py package: pip install 'blockviz[export]' (or save as .svg)"


class ExportError(ValueError):
    """A picture that cannot be written as asked (one line: the format, the file, the library)."""


def picture_format(path: str | Path) -> str:
    """".svg" or ".png" from the file name, else ExportError."""
    suffix = Path(path).suffix.lower()
    if suffix not in FORMATS:
        raise ExportError(f"{str(path)!r}: unknown picture format {suffix or '(none)'!r}; give a .svg or .png name")
    return suffix


def trace_frame(timeline: Timeline, header: dict[str, Any], title: str,
                ranges: dict[str, tuple[int, int]] | None = None, radix: RadixHistory | None = None) -> dict[str, Any]:
    """The frame the notebook draws at `timeline`'s cursor (Visualizer.frame without the log and
    the insights): the view records and the controls' cursor line; `ranges` the blocks a pool is
    zoomed into (view.snapshot). A radix-tree run's frame holds the tree ("radix": radix_view's
    record), from `radix` (the trace's RadixHistory, made here when not given)."""
    frame = snapshot(timeline.state, current=timeline.current_event, vocab=timeline.token_texts,
                     geometry=kv_geometry(header), ranges=ranges)
    if timeline.state.design.radix_tree:
        history = radix if radix is not None else radix_history(header, timeline.events)
        frame["radix"] = radix_record(timeline.state, history, timeline.position, event=timeline.current_event,
                                      vocab=timeline.token_texts, policy=eviction_policy(header)).to_json()
    frame["cursor"] = cursor_line(timeline, Player(timeline), title=title, finished=timeline.at_end)
    return frame


def trace_title(trace: Trace) -> str:
    """The title a Visualizer gives a trace (Visualizer.from_trace)."""
    name = Path(trace.path).stem if trace.path else "trace"
    return f"trace {name} · {engine_title(trace.header)}"


def check_png_size(svg: str, scale: float = PNG_SCALE) -> None:
    """ExportError (one line) when `svg` rasterized at `scale` would be more than MAX_PNG_PIXELS:
    resvg allocates the whole picture at once, and aborts the process when that fails."""
    size = _SIZE.search(svg[:1000])
    if size is None:
        raise ExportError("the picture has no width and height")
    width, height = (round(float(value) * scale) for value in size.groups())
    if width * height > MAX_PNG_PIXELS:
        raise ExportError(f"the picture would be {width} x {height} pixels as a PNG, more than the "
                          f"{MAX_PNG_PIXELS:,} a PNG may have; save it as .svg")


_SIZE = re.compile(r'<svg [^>]*?width="([0-9.]+)" height="([0-9.]+)"')


def png_bytes(svg: str, scale: float = PNG_SCALE) -> bytes:
    """The SVG rasterized by resvg at `scale`, or ExportError (one line) when resvg-py is missing
    or the picture is too big for a PNG (check_png_size)."""
    try:
        import resvg_py
    except ImportError:
        raise ExportError(PNG_NEEDS) from None
    check_png_size(svg, scale)
    return bytes(resvg_py.svg_to_bytes(svg_string=svg, zoom=scale))


def check_out_path(path: str | Path, *, overwrite: bool) -> Path:
    """ExportError when `path` cannot take a picture: its format, a directory, a missing directory,
    or an existing file and not `overwrite` (trace.check_new_trace_path's checks)."""
    path = Path(path)
    picture_format(path)
    try:
        check_new_trace_path(path, overwrite=overwrite, example="step.svg")
    except TraceError as exc:
        raise ExportError(str(exc)) from None
    return path


def save_frame(frame: dict[str, Any], path: str | Path, *, title: str = "", projector: bool = False,
               overwrite: bool = True) -> Path:
    """Write `frame`'s picture to `path`: .svg as is, .png through resvg. Returns the path."""
    path = check_out_path(path, overwrite=overwrite)
    svg = frame_svg(frame, title=title, projector=projector)
    data = png_bytes(svg) if picture_format(path) == ".png" else svg.encode("utf-8")
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    try:
        partial.write_bytes(data)
        os.replace(partial, path)  # a reader never sees half a picture
    finally:
        partial.unlink(missing_ok=True)
    return path
