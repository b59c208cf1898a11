"""One HTML file that plays a trace with the notebook's own front end, offline and with no kernel.

The page holds three things: the notebook's ES module and stylesheet (blockviz/jupyter/static/,
read from the package when the page is made, the files widgets.ESM_FILES names), the frames of
every position (blockviz/webpage/frames.py) as gzipped JSON in base64, and the controller
(webpage/page.js) that unpacks them with the browser's DecompressionStream and plays the part of
the kernel: it gives each view an object with anywidget's model methods (get, set, save_changes,
send, on, off) and answers the messages the views send (select, action, seek, speed, filter, pick,
break, zoom, projector) from the frames. A Content-Security-Policy forbids every network request.

What a page cannot do, because no engine is behind it: add a request, step a live engine, change a
run's settings. Those controls are not in the notebook's widget either (they are Python calls).
"""

from __future__ import annotations

import base64
import gzip
import html
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from blockviz.jupyter.widgets import CSS, ESM

CONTROLLER = Path(__file__).resolve().parent / "page.js"
PAGE_CSS = Path(__file__).resolve().parent / "page.css"
# The most a page may weigh; a trace past it is refused with the size it would have been.
MAX_PAGE_BYTES = 32 << 20
CSP = ("default-src 'none'; script-src 'unsafe-inline' blob:; style-src 'unsafe-inline'; "
       "img-src data: blob:; font-src data:")


@dataclass
class Moment:
    """A frozen picture of a recorded run at event position `position`, with what it shows."""

    position: int
    svg: str
    title: str = ""
    lines: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"position": self.position, "svg": self.svg, "title": self.title, "lines": self.lines}


def moments(viz: Any, limit: int | None = None) -> list[Moment]:
    """Pictures of a replay Visualizer's run (model/svg.py frame_svg of `viz.frame()`): one at each
    card stop (Guide.stop_of, where guided play stops) with the card's title, what, why and upstream
    function, the first `limit` of them; a run with no card, its end. The cursor is put back."""
    from blockviz.model.svg import frame_svg

    timeline, back = viz.timeline, viz.timeline.position
    guide = viz.player.scan_guide()
    stops = [guide.stop_of(card) for card in guide.cards][:limit] if guide is not None else []
    shots = []
    try:
        for stop in stops or [len(timeline)]:
            timeline.seek(stop)
            frame = viz.frame()
            card = frame.get("card") or {}
            lines = [text for text in (card.get("what"), card.get("why")) if text]
            if card.get("function"):
                lines.append(f"{card.get('upstream') or 'vLLM'}: {card['function']}")
            if not card:
                lines.append(f"the run's end, event {stop} of {len(timeline)}")
            shots.append(Moment(stop, frame_svg(frame, title=viz.title or ""), card.get("title") or viz.title or "", lines))
    finally:
        timeline.seek(back)
    return shots


def picture(svg: str, alt: str) -> str:
    """An <img> of `svg`, inline as a data URL (the pages' CSP allows data: images only)."""
    data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
    return f'<img src="data:image/svg+xml;base64,{data}" alt="{html.escape(alt)}">'


class PageError(ValueError):
    """A page that cannot be made (too big); its message is one line."""


def pack(data: dict[str, Any]) -> str:
    """`data` as gzipped JSON in base64: what page.js unpacks with DecompressionStream("gzip")."""
    raw = json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return base64.b64encode(gzip.compress(raw, compresslevel=9, mtime=0)).decode("ascii")


def first_values(data: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """`data` in two: everything but the values, with the values position 0 draws (`first`: index
    -> value), and all the values. The page draws its first frame from the first, small part while
    the browser unpacks the rest (a zoomed-in range's blocks among it: no view asks for them first)."""
    deltas = data.get("deltas") or [[]]
    keys = data.get("keys") or []
    first = {str(v): data["values"][v] for k, v in zip(deltas[0][0::2], deltas[0][1::2])
             if v >= 0 and not keys[k].startswith("zoom ")}
    return {key: value for key, value in data.items() if key != "values"} | {"first": first}, data["values"]


def _script(kind: str, element_id: str, text: str) -> str:
    if "</script" in text.lower():
        raise PageError(f"{element_id}: text that would end its script element")
    return f'<script type="{kind}" id="{element_id}">{text}</script>'


def page_html(data: dict[str, Any], title: str, prints: list[dict[str, Any]] = ()) -> str:
    """The page: the notebook's front end over `data` (frames.PageData.to_json()), and `prints`
    (Moment.to_json()s: what the page prints, each card's text beside its frozen picture). Raises
    PageError when it would weigh more than MAX_PAGE_BYTES."""
    start, values = first_values(data)
    parts = [
        "<!doctype html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{html.escape(title)}</title>",
        f"<style>{CSS.read_text(encoding='utf-8')}\n{PAGE_CSS.read_text(encoding='utf-8')}</style>",
        "</head><body>",
        '<div id="bv-page" class="blockviz" data-ready="false">'
        '<noscript>This page draws with JavaScript: turn it on to play the trace.</noscript></div>',
        _script("text/plain", "bv-esm", ESM),
        _script("application/octet-stream", "bv-data", pack(start)),
        _script("application/octet-stream", "bv-values", pack(values)),
        _script("application/octet-stream", "bv-print", pack({"title": title, "moments": list(prints)})),
        _script("module", "bv-controller", CONTROLLER.read_text(encoding="utf-8")),
        "</body></html>",
    ]
    text = "\n".join(parts)
    size = len(text.encode("utf-8"))
    if size > MAX_PAGE_BYTES:
        raise PageError(f"the page would be {size / (1 << 20):.1f} MiB, more than the {MAX_PAGE_BYTES >> 20} MiB "
                        "a page may weigh")
    return text


def write_atomic(path: Path, text: str, *, overwrite: bool = True) -> Path:
    """Write `text` to `path` through a temporary file in the same directory, renamed into place: a
    failed write leaves nothing half-written. Raises FileExistsError when `path` exists and not `overwrite`."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise FileExistsError(f"{str(path)!r} exists")
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".part", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.chmod(temp, 0o644)
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise
    return path


def trace_page(trace: Any, *, projector: bool = False) -> str:
    """The page of a trace (a Trace, a path or a shipped trace's name)."""
    from blockviz.jupyter.visualizer import Visualizer

    viz = Visualizer.from_trace(trace, projector=projector)
    try:
        return visualizer_page(viz)
    finally:
        viz.close()


def visualizer_page(viz: Any) -> str:
    """The page of a replay Visualizer's timeline (its cursor is put back where it was)."""
    from blockviz.webpage.frames import page_data

    back = viz.timeline.position
    try:
        data = page_data(viz)
    finally:
        viz.timeline.seek(back)
    data.meta["zoom"], data.meta["projector"] = viz.zoom, viz.projector
    prints = [shot.to_json() for shot in moments(viz)]
    return page_html(data.to_json(), viz.title or "blockviz", prints)


def save_page(viz: Any, path: str | Path, *, overwrite: bool = True) -> Path:
    """Write `viz`'s page (visualizer_page) to `path` through a temporary file; `Visualizer.save("x.html")`."""
    path = Path(path)
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{str(path)!r}: directory {str(path.parent)!r} does not exist")
    return write_atomic(path, visualizer_page(viz), overwrite=overwrite)
