"""The frames an exported page plays: what `Visualizer.frame()` draws at every position of a trace.

A page has no kernel, so everything the notebook's front end could be sent is computed here, once:
the frame at every event position (the Visualizer's own `frame()`, with the ledger and memory
panels), the inspector of every block and the explainer of every request and sequence at every
position, the log's rows, and the tables the in-page controller (webpage/page.js) moves the cursor
with (Timeline.landing, the step ends, the guide's card stops, each event's kind).

Frames repeat themselves from one position to the next, so they are stored as parts: each part of a
frame (its pools, its tables, its cursor line, block 3's inspector ...) is a key, each distinct value
of a key is kept once, and each position lists only the keys whose value changed since the position
before it (`PageData.deltas`).

A pool of more blocks than pool_zoom.MAX_BLOCK_CELLS is drawn zoomed out, a cell per N blocks; a
click on a cell asks for its N blocks one by one (the notebook's "zoom_pool" message). The page
holds those too: for each cell's range the block columns of view.pool_record(state, device,
start, stop) less the whole pool's counts ("zoom gpu:START"), a new value only at a position where
one of its blocks may have changed (zoom_parts).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from blockviz.jupyter.insight_views import INSIGHT_PARTS
from blockviz.jupyter.visualizer import Visualizer
from blockviz.jupyter.widgets import BREAK_KINDS, PALETTE, PROJECTOR_PALETTE, PROJECTOR_ZOOM, ZOOMS
from blockviz.model.insight_view import explain_record
from blockviz.model.narration import FILTERS
from blockviz.model.player import GUIDE_SLOW_EVENTS, GUIDE_SLOW_SPEED, SPEEDS
from blockviz.model.pool_zoom import MAX_BLOCK_CELLS, zoom_level
from blockviz.model.reducer import touched_blocks
from blockviz.model.trace import kv_geometry
from blockviz.model.names import RequestNames
from blockviz.model.view import MAX_LOG_ROWS, MAX_LOG_SCAN, inspect_block, log_row, pool_record

# A pool of more blocks than this is drawn zoomed out (pool_zoom.MAX_BLOCK_CELLS): a click on a cell
# zooms in rather than selecting a block, so the page carries no inspector for it.
MAX_INSPECTED_BLOCKS = MAX_BLOCK_CELLS
ABSENT = -1  # a key a position does not have (an explainer of a sequence not yet there)
# What a zoomed-in range's record takes from the whole pool's record at the same position (page.js merges them).
POOL_COUNTS = ("n", "used", "cached", "free", "empty_line")


@dataclass
class PageData:
    """A trace's frames as parts (`keys`, `values`, `deltas`) and what the controller moves with (`meta`)."""

    meta: dict[str, Any]
    keys: list[str] = field(default_factory=list)
    values: list[Any] = field(default_factory=list)
    deltas: list[list[int]] = field(default_factory=list)  # per position: key, value, key, value ...
    _key_index: dict[str, int] = field(default_factory=dict)
    _value_index: dict[str, int] = field(default_factory=dict)

    _families: list[str] = field(default_factory=list)  # per value: the kind of key that added it
    _table_blocks: set[tuple[str, int]] = field(default_factory=set)  # every table's blocks, the position before

    def value(self, value: Any, family: str = "") -> int:
        """The index of `value` in `values`, added once."""
        text = json.dumps(value, separators=(",", ":"), sort_keys=True, ensure_ascii=False)
        index = self._value_index.get(text)
        if index is None:
            index = self._value_index[text] = len(self.values)
            self.values.append(value)
            self._families.append(family)
        return index

    def key(self, name: str) -> int:
        index = self._key_index.get(name)
        if index is None:
            index = self._key_index[name] = len(self.keys)
            self.keys.append(name)
        return index

    def add_position(self, parts: dict[str, Any], previous: dict[int, int],
                     indexed: dict[int, int] | None = None) -> dict[int, int]:
        """Record the parts of the next position (and `indexed`: parts already as key index ->
        value index); returns them by key index (the next `previous`)."""
        now = {}
        for name, value in parts.items():
            key = self.key(name)
            same = previous.get(key, ABSENT)  # a part most often equals its value at the position before
            now[key] = same if same != ABSENT and self.values[same] == value else self.value(value, name.split(":")[0])
        now.update(indexed or {})
        delta = []
        for key, value in now.items():
            if previous.get(key) != value:
                delta += [key, value]
        for key in previous.keys() - now.keys():
            delta += [key, ABSENT]
        self.deltas.append(delta)
        return now

    def to_json(self) -> dict[str, Any]:
        """The parts with the values of one kind of key side by side (gzip's window then finds
        their repeats), the deltas renumbered to match."""
        order = sorted(range(len(self.values)), key=lambda i: (self._families[i], i))
        renumber = {old: new for new, old in enumerate(order)}
        deltas = [[v if k % 2 == 0 or v == ABSENT else renumber[v] for k, v in enumerate(delta)]
                  for delta in self.deltas]
        return {"meta": self.meta, "keys": self.keys, "values": [self.values[i] for i in order], "deltas": deltas}


def page_data(viz: Visualizer) -> PageData:
    """Every frame `viz` (a replayed trace's Visualizer) can draw, by position; the cursor is left at the end.

    Frame parts: the Visualizer's frame() with no block selected and the log left out (the page
    builds the log from `meta["log"]` as view.event_log does), the ledger and memory panels, the
    explainer of no one ("explain"), of each request ("explain r:ID") and of each sequence
    ("explain s:SEQ", the selected block's first owner's), and each block's inspector
    ("inspector gpu:3") for pools of at most MAX_INSPECTED_BLOCKS blocks."""
    timeline = viz.timeline
    length = len(timeline)
    insights = viz.insight.insights
    geometry = kv_geometry(viz.header)
    data = PageData(meta=_meta(viz))
    previous: dict[int, int] = {}
    zoomed: dict[int, int] = {}
    viz.selected = None
    viz.insight.picked = None
    for position in range(length + 1):
        timeline.seek(position)
        frame = viz.frame(log=False)
        frame.update(viz.insight.parts(("ledger", "memory", "radix")))  # radix: a radix-tree run's only
        frame["touched playing"] = {device: sorted(blocks)  # while playing no card is up (Player.card)
                                    for device, blocks in touched_blocks(timeline.current_event).items()}
        state = timeline.state
        explained = dict(events=timeline.events, vocab=timeline.token_texts)
        frame["explain"] = explain_record(insights, position, state=state, **explained).to_json()
        for request in frame["explain"]["requests"]:
            frame[f"explain r:{request}"] = explain_record(insights, position, state=state, request_id=request,
                                                           **explained).to_json()
        for seq_id in state.tables:
            frame[f"explain s:{seq_id}"] = explain_record(insights, position, state=state, seq_id=seq_id,
                                                          **explained).to_json()
        for device, pool in state.pools.items():
            if len(pool) <= MAX_INSPECTED_BLOCKS:
                for number in range(len(pool)):
                    frame[f"inspector {device}:{number}"] = inspect_block(
                        state, device, number, vocab=timeline.token_texts, geometry=geometry).to_json()
        zoomed.update(zoom_parts(data, timeline, position))
        previous = data.add_position(frame, previous, zoomed)
    data.meta["zoomable"] = {device: zoom_ranges(len(pool)) for device, pool in timeline.state.pools.items()
                             if zoom_ranges(len(pool))}
    return data


def zoom_ranges(num_blocks: int) -> list[int]:
    """The first block of each cell of a zoomed-out pool of `num_blocks` (its cells' ranges, as
    pool_canvas.js's click sends them: start + i * per_cell to the next), when each range is drawn
    one cell per block; [] for a pool drawn one cell per block, or one whose ranges are zoomed out too."""
    per_cell = zoom_level(num_blocks)
    if per_cell == 1 or per_cell > MAX_BLOCK_CELLS:
        return []
    return list(range(0, num_blocks, per_cell))


def zoom_parts(data: PageData, timeline: Any, position: int) -> dict[int, int]:
    """The zoomed-in ranges' parts (key index -> value index) that may differ at `position` (the
    timeline's cursor) from the position before: at position 0 every range; then the ranges of
    the blocks the last event touched (reducer.touched_blocks) and of every block a block table
    holds before or after it (a fork or a slot changes ref counts and fills of a table's blocks)."""
    state = timeline.state
    held = {block for tables in (state.tables, *state.group_tables.values()) for table in tables.values()
            for block in table}
    parts = {}
    for device, pool in state.pools.items():
        starts = zoom_ranges(len(pool))
        if not starts:
            continue
        per_cell = starts[1] - starts[0] if len(starts) > 1 else len(pool)
        if position == 0:
            dirty = set(starts)
        else:
            blocks = set(touched_blocks(timeline.events[position - 1]).get(device, ()))
            blocks.update(number for where, number in data._table_blocks | held if where == device)
            dirty = {number - number % per_cell for number in blocks if 0 <= number < len(pool)}
        for start in sorted(dirty):
            record = pool_record(state, device, start, min(start + per_cell, len(pool)))
            part = {key: value for key, value in record.items() if key not in POOL_COUNTS}
            parts[data.key(f"zoom {device}:{start}")] = data.value(part, "zoom")
    data._table_blocks = held
    return parts


def _meta(viz: Visualizer) -> dict[str, Any]:
    """What the controller needs besides the frames: the timeline's landings, step ends and card
    stops, the log's rows and filters, the controls' choices and palettes."""
    timeline, player = viz.timeline, viz.player
    length = len(timeline)
    guide = player.scan_guide()
    stops = [guide.stop_of(card) for card in guide.cards] if guide is not None else []
    spans = [[card.start - guide.offset, guide.stop_of(card)] for card in guide.cards] if guide is not None else []
    # the log's rows name requests as the notebook's do at the trace's end (every request and its
    # sequences known); the page keeps one text per event
    here = timeline.position
    timeline.seek(length)
    names = RequestNames(timeline.state)
    timeline.seek(here)
    op_start = []
    for position in range(length + 1):
        op = timeline.operation_at(position)
        op_start.append(-1 if op is None else op.start)
    return {
        "title": viz.title,
        "length": length,
        "guided": bool(player.guide is not None and player.guided),
        "speed_index": player.speed_index,
        "speeds": [None if s == float("inf") else s for s in SPEEDS],
        "speed_labels": ["max" if s == float("inf") else f"{s:g} ev/s" for s in SPEEDS],
        "guide_slow_events": GUIDE_SLOW_EVENTS,
        "guide_slow_speed": GUIDE_SLOW_SPEED,
        "zooms": list(ZOOMS),
        "projector_zoom": PROJECTOR_ZOOM,
        "palette": PALETTE,
        "projector_palette": PROJECTOR_PALETTE,
        "break_kinds": list(BREAK_KINDS),
        "filters": {name: None if kinds is None else sorted(cls.type for cls in kinds) for name, kinds in FILTERS.items()},
        "max_log_rows": MAX_LOG_ROWS,
        "max_log_scan": MAX_LOG_SCAN,
        "log": [log_row(event, timeline.token_texts, names) for event in timeline.events],
        "landing": [timeline.landing(position) for position in range(length + 1)],
        "op_start": op_start,
        "step_ends": list(timeline.step_ends),
        "stops": stops,
        "spans": spans,
        "insight_parts": list(INSIGHT_PARTS),
        "radix": viz.insight.has_tree,  # the page adds the radix tree's section
        "inspected": all(len(pool) <= MAX_INSPECTED_BLOCKS for pool in timeline.state.pools.values()),
    }
