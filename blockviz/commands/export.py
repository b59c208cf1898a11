"""`blockviz export TRACE --at N --out step.svg [--frames A:B] [--blocks START-END] [--projector] [--force]`:
the picture at a cursor of a trace, for a slide; `blockviz export TRACE --html lesson.html`: one page
that plays the whole trace in a browser, offline (blockviz/webpage/page.py).

No model and no torch: the trace's events are folded to the cursor (event N: N events applied, as
`Visualizer.seek(N)` and the status bar's "event N/total"; N inside an engine operation lands at its
end, blockviz/model/operation.py), and the frame the notebook draws there
is written as SVG, or PNG with the [export] extra (blockviz/model/export.py). `--frames A:B` writes
one picture per event from A to B, numbered (step-0012.svg ...), for an animation on a slide.
`--blocks START-END` draws those blocks of the GPU pool (a pool bigger than a picture's cells is
otherwise drawn zoomed out, a cell per N blocks: blockviz/model/pool_zoom.py).

What an export writes is bounded by the limits here and in blockviz/model/svg.py, never by the
pools a trace's header claims (docs/traces.md): a picture draws at most MAX_POOL_CELLS blocks per
pool, and --frames at most MAX_FRAMES pictures, MAX_FRAME_BLOCKS pool blocks and MAX_EXPORT_BYTES
of SVG in all; a PNG past export.MAX_PNG_PIXELS is refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

from blockviz.errors import UsageError

# --frames: a short sequence for a slide, not a film of a long run. Limits, not measurements.
MAX_FRAMES = 1000  # pictures
MAX_FRAME_BLOCKS = 1 << 22  # pool blocks summed over the pictures (each picture's view reads every block)
MAX_EXPORT_BYTES = 1 << 28  # SVG text summed over the pictures (each is bounded: blockviz/model/svg.py)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "export", help="write the picture at an event of a trace as SVG or PNG, for slides",
        description="Write the pools, block tables and hash chains at one event of a trace (what the "
                    "notebook's widget draws there) as an SVG, or a PNG with blockviz[export].")
    parser.add_argument("trace", metavar="TRACE", help="a trace file, or the name of a shipped trace")
    parser.add_argument("--at", metavar="N", help="events applied: 0 (the start) to the trace's length "
                                                  "(default: the end)")
    parser.add_argument("--frames", metavar="A:B", help="one picture per event from A to B (both included), "
                                                        "numbered after --out's name")
    parser.add_argument("--out", metavar="FILE", help="the picture: a .svg or .png name")
    parser.add_argument("--html", metavar="FILE", help="instead of a picture, one .html page that plays the whole "
                                                       "trace with the notebook's views, offline (no Python to open it)")
    parser.add_argument("--blocks", metavar="START-END", help="draw blocks START to END of the GPU pool (both "
                                                              "included); default the whole pool, zoomed out when big")
    parser.add_argument("--projector", action="store_true", help="big cells, the projector palette")
    parser.add_argument("--force", action="store_true", help="overwrite existing pictures")


def _position(text: str, length: int, option: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise UsageError(f"{option} must be an event position (an integer), got {text!r}") from None
    if not 0 <= value <= length:
        raise UsageError(f"{option} {value} is out of range: this trace has events 0 to {length}")
    return value


def positions(args, length: int, num_blocks: int = 0) -> list[int]:
    """The event positions to draw: --at's (default the end), or --frames A:B's: at most
    MAX_FRAMES pictures, and at most MAX_FRAME_BLOCKS pool blocks (`num_blocks` per picture) in all."""
    if args.frames is None:
        return [length if args.at is None else _position(args.at, length, "--at")]
    if args.at is not None:
        raise UsageError("give --at N or --frames A:B, not both")
    first, sep, last = args.frames.partition(":")
    if not sep:
        raise UsageError(f"--frames must be A:B (event positions), got {args.frames!r}")
    start, stop = _position(first, length, "--frames"), _position(last, length, "--frames")
    if stop < start:
        raise UsageError(f"--frames {args.frames}: the end comes before the start")
    count = stop - start + 1
    if count > MAX_FRAMES:
        raise UsageError(f"--frames {args.frames} is {count} pictures; at most {MAX_FRAMES}")
    if count * num_blocks > MAX_FRAME_BLOCKS:
        raise UsageError(f"--frames {args.frames} is {count} pictures of {num_blocks:,} pool blocks each; at most "
                         f"{MAX_FRAME_BLOCKS:,} blocks in all ({max(1, MAX_FRAME_BLOCKS // num_blocks)} pictures of this trace)")
    return list(range(start, stop + 1))


def out_paths(out: Path, chosen: list[int], numbered: bool) -> list[Path]:
    """--out itself, or one numbered name per position: step.svg -> step-0012.svg ..."""
    if not numbered:
        return [out]
    digits = max(4, len(str(chosen[-1])))
    return [out.with_name(f"{out.stem}-{position:0{digits}d}{out.suffix}") for position in chosen]


def _check_pictures(frames, what: str | None, *, png: bool, projector: bool) -> None:
    """ExportError when the pictures' SVG text is more than MAX_EXPORT_BYTES in all, or one of them
    is too big for a PNG (export.check_png_size)."""
    from blockviz.model.export import ExportError, check_png_size
    from blockviz.model.svg import frame_svg

    total = 0
    for frame in frames:
        svg = frame_svg(frame, projector=projector)
        if png:
            check_png_size(svg)
        total += len(svg.encode("utf-8"))
        if total > MAX_EXPORT_BYTES:
            raise ExportError(f"--frames {what} makes more than {MAX_EXPORT_BYTES >> 20} MiB of pictures, "
                              "the most an export may write; give fewer frames")


def execute(args) -> int:
    if args.html is not None:
        return execute_html(args)
    if args.out is None:
        raise UsageError("give --out FILE (a picture) or --html FILE (a page that plays the trace)")
    from blockviz.commands.replay import check
    from blockviz.model.export import ExportError, check_out_path, png_bytes, save_frame, trace_frame, trace_title
    from blockviz.model.radix_view import radix_history
    from blockviz.model.timeline import Timeline

    out = Path(args.out)
    try:
        check_out_path(out, overwrite=True)  # the format and the directory, before reading the trace
        if out.suffix.lower() == ".png":
            png_bytes('<svg xmlns="http://www.w3.org/2000/svg" width="1" height="1"/>')  # resvg is there
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    _, trace = check(args)
    timeline = Timeline.for_trace(trace)
    ranges = None
    if args.blocks is not None:
        from blockviz.model.pool_zoom import parse_block_range
        try:
            ranges = {"gpu": parse_block_range(args.blocks, trace.num_gpu_blocks)}
        except ValueError as exc:
            raise UsageError(f"--blocks: {exc}") from None
    chosen = positions(args, len(timeline), trace.num_gpu_blocks + trace.num_cpu_blocks)
    paths = out_paths(out, chosen, numbered=args.frames is not None)
    title = trace_title(trace)
    radix = radix_history(trace.header, trace.events) if timeline.state.design.radix_tree else None

    def frames():
        for position in chosen:
            timeline.seek(timeline.landing(position))  # a picture of a state the engine can be in
            yield trace_frame(timeline, trace.header, title, ranges, radix)

    try:
        for path in paths:
            check_out_path(path, overwrite=args.force)
        if len(paths) > 1 or out.suffix.lower() == ".png":  # every picture checked before any is written
            _check_pictures(frames(), args.frames, png=out.suffix.lower() == ".png", projector=args.projector)
        for frame, path in zip(frames(), paths):
            save_frame(frame, path, projector=args.projector, overwrite=args.force)
    except ExportError as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # a full disk, a file-size limit: the picture being written is removed
        raise UsageError(f"cannot write {str(out)!r}: {exc.strerror or exc}") from None
    where = str(paths[0]) if len(paths) == 1 else f"{len(paths)} pictures, {paths[0]} to {paths[-1]}"
    print(f"wrote {where}", file=sys.stdout)
    return 0


def check_html_path(path: Path, *, overwrite: bool) -> Path:
    """UsageError when a page cannot be written at `path`: not an .html name, a directory, a missing
    directory, or an existing file and not `overwrite`."""
    from blockviz.model.trace import TraceError, check_new_trace_path

    if path.suffix.lower() not in (".html", ".htm"):
        raise UsageError(f"--html {str(path)!r}: give a page name ending in .html")
    try:
        check_new_trace_path(path, overwrite=overwrite, example="lesson.html")
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    return path


def write_page(text: str, path: Path, *, overwrite: bool) -> None:
    """Write a page through a temporary file renamed into place (webpage.page.write_atomic); an
    OSError is one UsageError line and leaves nothing behind."""
    from blockviz.webpage.page import write_atomic

    try:
        write_atomic(path, text, overwrite=overwrite)
    except FileExistsError:
        raise UsageError(f"{str(path)!r} already exists: give another name, or --force to overwrite it") from None
    except OSError as exc:
        raise UsageError(f"cannot write {str(path)!r}: {exc.strerror or exc}") from None


def execute_html(args) -> int:
    """`export TRACE --html FILE`: the trace checked, every frame computed, one page written."""
    from blockviz.commands.replay import check

    for option in ("out", "at", "frames", "blocks"):
        if getattr(args, option) is not None:
            raise UsageError(f"--html writes a page of the whole trace: leave out --{option}")
    path = check_html_path(Path(args.html), overwrite=args.force)
    _, trace = check(args)
    print(html_of_trace(trace, path, overwrite=args.force, projector=args.projector, name=args.trace),
          file=sys.stdout)
    return 0


def html_of_trace(trace, path: Path, *, overwrite: bool, projector: bool = False, name: str = "") -> str:
    """Write the page of `trace` (a Trace or a trace file) to `path`; returns the line saying so.
    A page too big is one UsageError line with the size it would have been."""
    from blockviz.webpage.page import PageError, trace_page

    try:
        text = trace_page(trace, projector=projector)
    except PageError as exc:
        raise UsageError(f"{name or trace}: {exc}") from None
    write_page(text, path, overwrite=overwrite)
    return f"wrote {path} ({len(text.encode('utf-8')) / 1024:.0f} KiB)"
