"""The event log: every event up to the cursor, one line each, filterable by kind.

`describe(event)` words each event the way the seeds do (allocate, append_slot, copy-on-write,
fork, swap_out / swap_in, free, prefix-cache hit). The log is a Line API widget, so a trace of
100,000 events renders only the lines on screen.
"""

from __future__ import annotations

import bisect

from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Select

from blockviz.widgets.palette import short_hash, show_token
from engine import events as ev

MEMORY = frozenset({"block_allocated", "prefix_cache_hit", "block_hashed", "slot_appended", "copy_on_write",
                    "fork", "swap_out", "swap_in", "block_freed", "sequence_freed", "block_evicted"})
FILTERS: dict[str, frozenset[str] | None] = {
    "all events": None,
    "no slots/tokens/digests": frozenset(ev.EVENT_TYPES) - {"slot_appended", "token_generated", "kv_digest"},
    "memory (block manager)": MEMORY,
    "sharing: fork, CoW, hits": frozenset({"fork", "copy_on_write", "prefix_cache_hit", "block_hashed",
                                           "block_evicted"}),
    "swap & preemption": frozenset({"swap_out", "swap_in", "preempted", "kv_digest"}),
    "requests & steps": frozenset({"request_added", "step_started", "step_finished", "sequence_finished",
                                   "preempted"}),
    **{kind: frozenset({kind}) for kind in ev.EVENT_TYPES},
}

_KIND_STYLES = {
    "prefix_cache_hit": Style(color="#000000", bgcolor="#ffd400", bold=True),
    "copy_on_write": Style(color="#ff79c6", bold=True),
    "fork": Style(color="#bd93f9", bold=True),
    "swap_out": Style(color="#ff8c1a", bold=True),
    "swap_in": Style(color="#2fd12f", bold=True),
    "preempted": Style(color="#ff3b3b", bold=True),
    "step_started": Style(color="#61afef", bold=True),
    "step_finished": Style(color="#61afef"),
    "block_evicted": Style(color="#e5c07b"),
}


def _ids(ids) -> str:
    return ",".join(str(i) for i in ids)


def describe(event: ev.Event, vocab: dict[int, str] | None = None) -> str:
    """One line of plain words for an event."""
    e = event
    kind = e.type
    if kind == "block_allocated":
        return (f"allocate {e.device} {e.block} → seq {_ids(e.seq_ids)} L{e.logical_index} "
                f"ref {e.ref_count} ({len(e.token_ids)} tokens)")
    if kind == "prefix_cache_hit":
        return (f"prefix-cache HIT {e.device} {e.block} #{short_hash(e.block_hash)} → seq {_ids(e.seq_ids)} "
                f"L{e.logical_index} ref {e.ref_count}")
    if kind == "block_hashed":
        parent = f"#{short_hash(e.parent_hash)}" if e.parent_hash is not None else "root"
        return (f"hash {e.device} {e.block} #{short_hash(e.block_hash)} ← {parent}"
                + ("" if e.registered else " (duplicate: map unchanged)"))
    if kind == "slot_appended":
        piece = show_token((vocab or {}).get(e.token_id, f"<{e.token_id}>"))
        return f"append_slot seq {e.seq_id} L{e.logical_index} → {e.device} {e.block}[{e.offset}] '{piece}'"
    if kind == "copy_on_write":
        return (f"copy-on-write seq {e.seq_id} L{e.logical_index}: {e.device} {e.src_block} → "
                f"{e.device} {e.dst_block} (src ref {e.src_ref_count})")
    if kind == "fork":
        return f"fork seq {e.parent_seq_id} → seq {e.child_seq_id} shares {e.device} {_ids(e.blocks)}"
    if kind in ("swap_out", "swap_in"):
        src, dst = ("gpu", "cpu") if kind == "swap_out" else ("cpu", "gpu")
        pairs = " ".join(f"{a}→{b}" for a, b in e.mapping)
        return f"{kind} req {e.request_id} seq {_ids(e.seq_ids)}: {src}→{dst} {pairs}"
    if kind == "block_freed":
        left = "free-but-cached" if e.cached and e.ref_count == 0 else ("free" if e.ref_count == 0 else "kept")
        return f"free {e.device} {e.block} by seq {e.seq_id}: ref {e.ref_count} ({left})"
    if kind == "sequence_freed":
        return f"seq {e.seq_id}: block table freed"
    if kind == "block_evicted":
        return f"evict {e.device} {e.block} #{short_hash(e.block_hash)} (LRU)"
    if kind == "request_added":
        prompt = show_token(e.prompt)[:40]
        return (f"request {e.request_id} added: '{prompt}' ({len(e.prompt_token_ids)} tokens, "
                f"seq {_ids(e.seq_ids)}, n {e.n}, max {e.max_tokens})")
    if kind == "step_started":
        return f"── step {e.step} {e.kind}: seq {_ids(e.seq_ids)} ({e.num_tokens} tokens)"
    if kind == "token_generated":
        return f"seq {e.seq_id} sampled '{show_token(e.text)}' at position {e.position}"
    if kind == "preempted":
        return (f"PREEMPT req {e.request_id} seq {_ids(e.seq_ids)} by {e.mode}: {e.reason}"
                + (f" ({e.num_tokens_lost} tokens to recompute)" if e.num_tokens_lost else ""))
    if kind == "sequence_finished":
        return f"seq {e.seq_id} finished: {e.reason}" + (f" ({e.detail})" if e.detail else "")
    if kind == "kv_digest":
        return f"K/V digest {e.device} {e.block} = {e.digest}"
    if kind == "step_finished":
        return f"── step {e.step} {e.kind} done ({e.num_tokens} tokens)"
    return kind


class EventLog(ScrollView, can_focus=True):
    """Events up to the cursor, filtered; the newest shown is the cursor's (highlighted)."""

    DEFAULT_CSS = """
    EventLog {
        height: 1fr;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.events: list[ev.Event] = []
        self.position = 0
        self.vocab: dict[int, str] = {}
        self.kinds: frozenset[str] | None = None
        self._indices: list[int] = []  # indices of events passing the filter, of self.events
        self._scanned = 0
        self._visible = 0

    def set_filter(self, kinds: frozenset[str] | None) -> None:
        self.kinds = kinds
        self._indices = []
        self._scanned = 0
        self._update()

    def show(self, events: list[ev.Event], position: int, vocab: dict[int, str]) -> None:
        if events is not self.events:
            self.events, self._indices, self._scanned = events, [], 0
        self.position = position
        self.vocab = vocab
        self._update()

    def _update(self) -> None:
        kinds, events = self.kinds, self.events
        for index in range(self._scanned, len(events)):
            if kinds is None or events[index].type in kinds:
                self._indices.append(index)
        self._scanned = len(events)
        self._visible = bisect.bisect_left(self._indices, self.position)
        self.virtual_size = Size(self.scrollable_content_region.width, self._visible)
        self._follow_cursor()
        self.call_after_refresh(self._follow_cursor)  # again once laid out (a new or resized log)
        self.refresh()

    def _follow_cursor(self) -> None:
        """Keep the cursor's event (the newest shown) on the last line."""
        self.scroll_to(y=max(0, self._visible - self.scrollable_content_region.height), animate=False,
                       immediate=True)

    def on_resize(self) -> None:
        self._follow_cursor()

    def lines(self) -> list[str]:
        """The visible log as plain text (for tests)."""
        return [self._text(self._indices[i]) for i in range(self._visible)]

    def _text(self, index: int) -> str:
        event = self.events[index]
        return f"{event.seq_no:>6} {describe(event, self.vocab)}"

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        line = y + self.scroll_offset.y
        if line >= self._visible:
            return Strip.blank(width, self.rich_style)
        index = self._indices[line]
        event = self.events[index]
        style = _KIND_STYLES.get(event.type, Style())
        if index == self.position - 1:
            style = style + Style(reverse=True)
        text = self._text(index)[:width].ljust(width)
        return Strip([Segment(text, style)], width).apply_style(self.rich_style)


class EventLogPanel(Vertical):
    """The log with its filter (a Select of event kinds)."""

    DEFAULT_CSS = """
    EventLogPanel {
        border: round $secondary;
        border-title-color: $text;
        height: 1fr;
    }
    EventLogPanel:focus-within {
        border: round $accent;
    }
    EventLogPanel > Select {
        height: auto;
        margin: 0;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "Event log"
        self.log_view = EventLog(id="event-log")

    def compose(self) -> ComposeResult:
        yield Select([(name, name) for name in FILTERS], value="all events", allow_blank=False,
                     compact=True, id="log-filter")
        yield self.log_view

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.log_view.set_filter(FILTERS.get(str(event.value)))

    def show(self, events: list[ev.Event], position: int, vocab: dict[int, str]) -> None:
        """Show events up to `position` now if visible, else when the panel is next shown."""
        self._last = (events, position, vocab)
        if self.display:
            self.log_view.show(events, position, vocab)

    def on_show(self) -> None:
        last = getattr(self, "_last", None)
        if last is not None:
            self.log_view.show(*last)
