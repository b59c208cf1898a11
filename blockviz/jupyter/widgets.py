"""The anywidget views: each holds its part of a frame in one synced `frame` dict and draws it.

Python holds the state, the JavaScript (static/blockviz.js with static/insights.js and
static/pool_canvas.js appended: one module for every view, picked by `_kind`) only renders it;
clicks come back as custom messages (`select`, `action`, `seek`, `speed`, `filter`, `pick`, `break`)
that the Visualizer turns into calls of its own Python API. No CDN import, no build step: the module
and its CSS are package data.

The views work on their own too: `PoolView().show(snapshot(state))` draws a reducer state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import anywidget
import traitlets

from blockviz.model.player import SPEEDS
from blockviz.model.narration import FILTERS
from blockviz.model.palette import BLOCK_COLOURS, CPU_TINTS, GROUP_COLOURS, SEQ_COLOURS, SEQ_COLOURS_BOLD
from engine import events as ev

STATIC = Path(__file__).resolve().parent / "static"
# One ES module: insights.js, radix.js, pool_canvas.js and display.js use blockviz.js's helpers, blockviz.js their renderers.
ESM_FILES = ("blockviz.js", "insights.js", "radix.js", "pool_canvas.js", "display.js")
ESM = "\n".join((STATIC / name).read_text(encoding="utf-8") for name in ESM_FILES)
CSS = STATIC / "blockviz.css"

PALETTE = {  # the page's colours: palette.py's (pool_canvas.js paints blocks in "blocks", the CSS reads them too)
    "seq": list(SEQ_COLOURS),
    "blocks": BLOCK_COLOURS,
    "cpu": list(CPU_TINTS),
    "groups": list(GROUP_COLOURS),  # KV-cache groups' badges (a hybrid run's)
}
# Projector mode (the TUI's `--projector`): fewer, stronger sequence colours.
PROJECTOR_PALETTE = {**PALETTE, "seq": list(SEQ_COLOURS_BOLD)}
ZOOMS = (1.0, 1.5, 2.0, 3.0)  # the size control's choices: the views' font size, and with it every cell
PROJECTOR_ZOOM = 2.0  # a projector's size: cells read from the back of a room

Handler = Callable[[dict[str, Any]], None]


class _View(anywidget.AnyWidget):
    """A view of one part of the frame; `show(frame)` takes a whole snapshot and keeps its part."""

    _esm = ESM
    _css = CSS
    _kind = traitlets.Unicode("").tag(sync=True)
    frame = traitlets.Dict().tag(sync=True)
    zoom = traitlets.Float(1.0).tag(sync=True)
    projector = traitlets.Bool(False).tag(sync=True)
    parts: tuple[str, ...] = ()

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._handler: Handler | None = None
        self.on_msg(self._on_frontend_msg)

    def part(self, snap: dict[str, Any]) -> dict[str, Any]:
        return {key: snap[key] for key in self.parts if key in snap}

    def show(self, snap: dict[str, Any]) -> None:
        """Draw the part of `snap` (a snapshot(), maybe with "log" and "cursor") this view shows."""
        with self.hold_sync():
            self.frame = self.part(snap)

    def set_look(self, zoom: float, projector: bool) -> None:
        """Draw at `zoom` times the normal size; `projector`: the projector palette, high contrast."""
        with self.hold_sync():
            self.zoom = float(zoom)
            self.projector = bool(projector)
            if self.has_trait("palette"):
                self.palette = PROJECTOR_PALETTE if projector else PALETTE

    def on_action(self, handler: Handler | None) -> None:
        """Call `handler(message)` for each message the frontend sends (a click, a slider move)."""
        self._handler = handler

    def _on_frontend_msg(self, widget: Any, content: Any, buffers: Any) -> None:
        if self._handler is not None and isinstance(content, dict):
            self._handler(content)


class PoolView(_View):
    """The GPU and CPU pools: one cell per block (number, ref count when shared, fill, owner colour,
    free / used / free-but-cached, last touched, selected) and the TUI's legend. A click on a cell
    sends {"event": "select", "device", "number"}.

    `renderer` picks how a pool is drawn: "canvas" (one canvas per pool, painting the rows in
    view; what it drew is in its data-states / data-refs) or "cells" (one element per block
    carrying data-block / data-state / data-ref), kept to compare the two (benchmarks/widgets.py)."""

    _kind = traitlets.Unicode("pool").tag(sync=True)
    palette = traitlets.Dict(PALETTE).tag(sync=True)
    renderer = traitlets.Enum(("canvas", "cells"), "canvas").tag(sync=True)
    parts = ("block_size", "pools", "touched", "selected", "free_queue", "notes", "kv_cache_groups",
             "card")  # a guided stop's card: a collapsed pool it names blocks of is opened


class BlockTableView(_View):
    """Each sequence's block table: logical block -> physical block, the token text in each slot;
    at a guided stop, scrolled to the table of the sequence the card is about (as the TUI's)."""

    _kind = traitlets.Unicode("tables").tag(sync=True)
    palette = traitlets.Dict(PALETTE).tag(sync=True)
    parts = ("tables", "block_size", "card")


class HashChainView(_View):
    """The prefix cache's hash chains: hash, parent, tokens; blocks that served a hit are lit."""

    _kind = traitlets.Unicode("hashes").tag(sync=True)
    parts = ("hashes", "hash_summary")


class EventLogView(_View):
    """The events up to the cursor, filterable by kind (the TUI log's filters)."""

    _kind = traitlets.Unicode("log").tag(sync=True)
    filters = traitlets.List(list(FILTERS)).tag(sync=True)
    filter = traitlets.Unicode("all events").tag(sync=True)
    parts = ("log",)


class Inspector(_View):
    """The selected block: state, refs, owners, fill, hash and parent, tokens, K/V digest."""

    _kind = traitlets.Unicode("inspector").tag(sync=True)
    palette = traitlets.Dict(PALETTE).tag(sync=True)
    parts = ("inspector",)


class Controls(_View):
    """Play/pause, one event, one engine step, back, speed, and a slider over the event position.
    Buttons send {"event": "action", "action": ...}; the slider {"event": "seek", "position"}; the
    size menu {"event": "zoom", "zoom"} (one of `zooms`), the projector box {"event": "projector", "on"}."""

    _kind = traitlets.Unicode("controls").tag(sync=True)
    speeds = traitlets.List(["max" if s == float("inf") else f"{s:g} ev/s" for s in SPEEDS]).tag(sync=True)
    zooms = traitlets.List(list(ZOOMS)).tag(sync=True)
    parts = ("cursor", "card")  # the card of a guided stop is drawn under the controls


class MomentHeader(_View):
    """A moment's line (blockviz.jupyter.moment): the title, the cursor it was taken at, the step,
    and what the last event did; its element carries data-position / data-length."""

    _kind = traitlets.Unicode("moment").tag(sync=True)
    parts = ("cursor", "card")  # the card of a guided stop is drawn under the controls


class _InsightView(_View):
    """An insight view: its part is in a frame only while it is shown (the Visualizer computes
    it then), so a frame without it leaves the view's last picture as it was. Displayed on its
    own (a cell's last expression), it is shown from then on: `displayed_alone`, and
    `on_display()` is called first so that the frame it shows is there."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.displayed_alone = False
        self.on_display: Callable[[], None] | None = None

    def show(self, snap: dict[str, Any]) -> None:
        if any(key in snap for key in self.parts):
            super().show(snap)

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        self.displayed_alone = True
        if self.on_display is not None:
            self.on_display()
        return super()._repr_mimebundle_(**kwargs)


class ExplainView(_InsightView):
    """Why a request's prefix lookup hit or missed (blockviz.model.explain), as the engine made it when
    the request was allocated: per block its hash, tokens, and hit (physical block) or the first
    miss's reason, and the hit length. The request is the selected block's first owner's, or the
    one picked in its menu, which sends {"event": "pick", "request": id}."""

    _kind = traitlets.Unicode("explain").tag(sync=True)
    parts = ("explain",)


class LedgerView(_InsightView):
    """The preemption ledger (blockviz.model.insights): victim, mode, blocks swapped or freed, tokens
    lost, steps until resumed, and the totals line."""

    _kind = traitlets.Unicode("ledger").tag(sync=True)
    parts = ("ledger",)


class MemoryView(_InsightView):
    """Memory truth at the cursor: block beside token utilization per pool and per sequence,
    internal fragmentation, a contiguous max-length reservation's waste, and an SVG sparkline of
    block and token utilization over the steps."""

    _kind = traitlets.Unicode("memory").tag(sync=True)
    parts = ("memory",)


class RadixView(_InsightView):
    """SGLang's radix tree (kv_manager "sglang"; blockviz.model.radix_view): nodes as runs of tokens
    with their slots and blocks, lock_ref and the requests holding each path, evictable and protected
    sizes, the last split, the last eviction and why, each running request's match."""

    _kind = traitlets.Unicode("radix").tag(sync=True)
    parts = ("radix",)


BREAK_KINDS = tuple(cls.type for cls in (ev.CopyOnWrite, ev.PrefixCacheHit, ev.Forked, ev.SwappedOut, ev.SwappedIn,
                                         ev.Preempted, ev.BlockEvicted, ev.SequenceFinished, ev.StepFinished))


class BreakpointsView(_View):
    """Breakpoints: tick event kinds (`break_on`, synced both ways; playback stops at them too),
    then "◂ previous" / "next ▸" send {"event": "break", "direction": "previous" | "next"}."""

    _kind = traitlets.Unicode("breaks").tag(sync=True)
    kinds = traitlets.List(list(BREAK_KINDS)).tag(sync=True)
    break_on = traitlets.List(traitlets.Unicode(), []).tag(sync=True)
    parts = ("breaks",)
