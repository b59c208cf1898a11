"""The text panels: block tables, generated text, hash chains, block inspector, status bar.

Each panel is handed the reducer's state from above (`show(...)`) and draws the records the view
model computes from it (blockviz/model/view.py: tables, hash_chains, inspect_block, pool_counts),
the same records the notebook draws; nothing here re-derives a block's state, a chain or a table,
and nothing reads an engine object. `StatePanel` is the reusable base: a scrolling, bordered box
holding one Static body.
"""

from __future__ import annotations

import io

from rich.cells import cell_len
from rich.console import Console, Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from blockviz.model.names import RequestNames
from blockviz.model.narration import plural
from blockviz.model.palette import block_tint, fill_glyph, group_mark, show_token
from blockviz.model.reducer import ReducerState
from blockviz.model.view import (STATE_LABELS, WINDOW_SLOT_NOTE, hash_chains, hash_summary, inspect_block,
                                 pool_counts, tables)
from blockviz.tui.styles import NULL_STYLE, group_style, seq_style, tokens_text
from engine import events as ev


def _select_seq_style(seq_id: int) -> Style:
    """Clicking a sequence label selects it (a Textual action link)."""
    return Style.from_meta({"@click": f"app.select_sequence({seq_id})"})


class DrawnWhenShown:
    """`show(...)` draws now if the widget is visible, else keeps the arguments and draws when it is
    next shown (a hidden view costs nothing per frame). Subclasses define `draw`."""

    def show(self, *args, **kwargs) -> None:
        self._last = (args, kwargs)
        if self.display:
            self.draw(*args, **kwargs)

    def on_show(self) -> None:
        last = getattr(self, "_last", None)
        if last is not None:
            self.draw(*last[0], **last[1])

    def draw(self, *args, **kwargs) -> None:
        raise NotImplementedError


class StatePanel(DrawnWhenShown, VerticalScroll):
    """A bordered, scrolling panel whose body is re-rendered from the reducer's state."""

    DEFAULT_CSS = """
    StatePanel {
        border: round $secondary;
        border-title-color: $text;
        height: 1fr;
        scrollbar-size-vertical: 1;
    }
    StatePanel:focus-within {
        border: round $accent;
    }
    StatePanel > Static {
        width: 100%;
        link-color: #000000;
        link-style: bold;
        link-background-hover: $accent;
        link-color-hover: $text;
    }
    """

    TITLE = ""

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = self.TITLE
        self.body = Static("", classes="panel-body")

    def compose(self) -> ComposeResult:
        yield self.body

    def set_body(self, renderable: RenderableType) -> None:
        self.body.update(renderable)

    def set_rows(self, rows: list[RenderableType], empty: str = "no sequences yet") -> None:
        """One row per sequence, or a dim line saying there is none yet."""
        self.set_body(Group(*rows) if rows else Text(empty, style="dim"))


# ---------------------------------------------------------------------------- block tables


def _row(text: str = "", style: str = "") -> Text:
    """A table row: cut with an ellipsis at the panel's edge, never wrapped under the next column."""
    return Text(text, style=style, no_wrap=True, overflow="ellipsis")


class BlockTables(StatePanel):
    """Per sequence: its block table, logical block -> physical block, with each slot's token
    (vLLM v0 BlockSpaceManager.block_tables; logical blocks are contiguous, physical
    ones need not be)."""

    TITLE = "Block tables (logical → physical)"

    def draw(self, state: ReducerState, selected_seq: int | None = None,
             vocab: dict[int, str] | None = None, marked: frozenset[tuple[str, int]] = frozenset(),
             about: tuple[int, ...] = ()) -> None:
        """`marked` (device, number): blocks a guide card names, pointed at with ◀ (first column, so
        a cut row keeps it) and scrolled into view; `about`: the sequences the card is about, whose
        table is the one scrolled to (its head, then its blocks)."""
        parts: list[RenderableType] = []
        first_marked: int | None = None
        size = state.block_size
        width = len(str(len(state.pools["gpu"]) - 1))
        for row in tables(state, limit=None, vocab=vocab):
            seq_id = row.seq
            head = _row("▶" if seq_id == selected_seq else " ")
            head.append(f" {row.name} ", seq_style(seq_id) + _select_seq_style(seq_id))
            if seq_id in about[:1]:  # the card's own sequence: its head in view above its blocks
                first_marked = len(parts) + 2
            head.append(f"· {row.status}"
                        + (f" ({row.finish})" if row.finish else "")
                        + f" · {plural(row.num_tokens, 'token')}", style="bold" if seq_id == selected_seq else "")
            parts.append(head)
            if row.progress is not None:  # vLLM v1: chunked prefill progress
                parts.append(_row(f"    {row.progress.text}", "bold #ff8c1a" if row.progress.prefilling else "dim"))
            per_group = [(0, row.label, row.blocks, row.skipped),
                      *((g.group, g.label, g.blocks, g.skipped) for g in row.groups)]
            for group, label, blocks, skipped in per_group:
                if label:  # a run with several KV-cache groups: one table per group
                    head = _row("  ")
                    head.append(group_mark(group), group_style(group))
                    head.append(f" {label}", "bold")
                    parts.append(head)
                if not blocks:
                    parts.append(Text("    no blocks", style="dim"))
                    continue
                placement = _row("    blocks ")
                for index, (device, number, _, _) in enumerate(blocks):
                    if index in skipped:
                        placement.append("∅", NULL_STYLE)
                    else:
                        placement.append(f"{'C' if device == 'cpu' else ''}{number}",
                                         Style(bgcolor=block_tint(device, number), color="#ffffff", bold=True))
                    placement.append(" ")
                parts.append(placement)
                for index, (device, number, ref, texts) in enumerate(blocks):
                    pointed = (device, number) in marked and (not about or seq_id in about)
                    line = _row("◀ " if pointed else "  ", style="bold reverse" if pointed else "")
                    line.append(f"L{index:<2}", style="dim")
                    if index in skipped:  # a slot the window let go: the null block
                        line.append(" → ")
                        line.append(WINDOW_SLOT_NOTE, NULL_STYLE)
                        parts.append(line)
                        continue
                    line.append(f" → {device} {number:<{width}}")
                    line.append(f" ×{ref}" if ref > 1 else "   ", style="bold")
                    line.append(" ")
                    line.append_text(tokens_text(texts, Style(bgcolor=block_tint(device, number, 0)),
                                                 Style(bgcolor=block_tint(device, number, 1))))
                    empty = size - len(texts)
                    if empty:
                        line.append(f" +{empty} empty", style="dim")
                    if pointed and first_marked is None:
                        first_marked = len(parts)
                    parts.append(line)
        self.set_rows(parts)
        if first_marked is not None:  # one line per row: the row's index is its line
            self.call_after_refresh(self.scroll_to, y=max(0, first_marked - 2), animate=False)


# ---------------------------------------------------------------------------- generated text


class GeneratedText(StatePanel):
    """Each sequence's text, one tinted run per token: the tint is the block holding the token
    (alternating shades mark token edges); a token without a slot yet is underlined."""

    TITLE = "Text (tint = its block)"

    def draw(self, state: ReducerState, selected_seq: int | None = None) -> None:
        parts: list[RenderableType] = []
        size = state.block_size
        names = RequestNames(state)
        for seq_id in sorted(state.seqs):
            seq = state.seqs[seq_id]
            table = state.history_table(seq_id)
            line = Text("▶" if seq_id == selected_seq else " ")
            line.append(f" {names((seq_id,))} ", seq_style(seq_id) + _select_seq_style(seq_id))
            line.append(" ")
            for position, piece in enumerate(seq.token_texts):
                index, offset = divmod(position, size)
                style = Style(underline=True, dim=True)
                if index < len(table):
                    device, number = table[index]
                    if offset < len(state.pools[device][number].token_ids):
                        style = Style(bgcolor=block_tint(device, number, position % 2), color="#ffffff")
                if position < seq.num_prompt_tokens:
                    style += Style(italic=True)
                line.append(show_token(piece), style)
            if seq.finish_reason:
                line.append(f"  [{seq.finish_reason}]", style="dim")
            parts.append(line)
        self.set_rows(parts)


# ---------------------------------------------------------------------------- hash chains


class HashChains(StatePanel):
    """The prefix cache: each full GPU block's chained hash (nano-vllm compute_hash: xxh64 of the
    parent's hash then the tokens), its parent's, its tokens; blocks that served a hit are lit."""

    TITLE = "Hash chains (prefix cache)"

    def draw(self, state: ReducerState, current: ev.Event | None = None, vocab: dict[int, str] | None = None) -> None:
        rows = hash_chains(state, limit=None, current=current, vocab=vocab)
        if not rows:
            self.set_body(Text("no hashed blocks: full blocks get a chained hash with --prefix-caching",
                               style="dim"))
            return
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column()
        for row in rows:
            label = Text("  " * min(row.depth, 8)
                         + (f"{row.branch} " if row.branch else ""))
            hash_style = "bold #000000 on #ffd400" if row.hits else "bold"
            if row.hit_now:
                hash_style += " reverse"
            label.append(f"#{row.hash}", hash_style)
            label.append(f" ← #{row.parent}" if row.parent else " ← root", "dim")
            info = Text(f"gpu {row.block}")
            if row.ref:
                info.append(f" ×{row.ref}")
            if row.state == "cached":
                info.append(" cached-free", "italic")
            if row.hits:
                info.append(f" HIT×{row.hits}", "bold #000000 on #ffd400")
            if not row.registered:
                info.append(" dup", "dim")
            grid.add_row(label, info, tokens_text(row.tokens, Style(bgcolor="#333344"), Style(bgcolor="#44445a")))
        summary = hash_summary(state)
        rate = summary.hits / summary.looked_up if summary.looked_up else 0.0
        self.set_body(Group(Text(f"{summary.in_map} in hash map · hits {summary.hits}"
                                 f"/{summary.looked_up} prompt blocks ({rate:.0%})", style="dim"), grid))


# ---------------------------------------------------------------------------- inspector


class BlockInspector(StatePanel):
    """Everything about the selected block: ref count, owners, hash, tokens, and the digest of its
    real K/V contents (so after copy-on-write or a swap the same digest shows up in the new block)."""

    TITLE = "Block inspector"

    def draw(self, state: ReducerState, selection: tuple[str, int] | None,
             vocab: dict[int, str] | None = None) -> None:
        if selection is None:
            self.set_body(Text("select a block: click it, or focus a pool (tab) and use the arrow keys",
                               style="dim"))
            return
        device, number = selection
        info = inspect_block(state, device, number, vocab)
        self.border_title = f"Block inspector · {device} {number}"
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column()
        grid.add_row("state", STATE_LABELS[info.state])
        if info.group is not None:  # a run with several KV-cache groups
            group = Text(group_mark(info.kv_cache_group_id), group_style(info.kv_cache_group_id))
            group.append(f" {info.group}")
            grid.add_row("KV group", group)
        if info.note is not None:  # vLLM v1's null block
            grid.add_row("what", info.note)
        if info.queue is not None:  # vLLM v1: a free block's place in the free queue
            grid.add_row("free queue", info.queue)
        grid.add_row("ref count", str(info.ref))
        owners = Text()
        for seq_id, name in zip(info.owners, info.owner_names):
            owners.append(f" {name} ", seq_style(seq_id) + _select_seq_style(seq_id))
            owners.append(" ")
        grid.add_row("owners", owners if info.owners else Text("none", "dim"))
        filled, size = info.fill, info.block_size
        grid.add_row("fill", f"{filled}/{size} slots {fill_glyph(filled, size)}")
        if info.hash:
            grid.add_row("hash", f"#{info.hash}" + ("" if info.registered else " (duplicate, not in map)"))
            grid.add_row("parent", f"#{info.parent}" if info.parent else "none (first block)")
            grid.add_row("hits", str(info.hits))
        if filled:
            grid.add_row("tokens", tokens_text(info.tokens, Style(bgcolor=block_tint(device, number, 0)),
                                              Style(bgcolor=block_tint(device, number, 1))))
        digest = info.digest
        shown = Text(digest, "bold") if digest else Text("none yet", "dim")
        # Slots written since the digest was taken (a live run at full speed digests once per
        # batch of steps, not every step): say what it covers.
        if digest and not info.digest_current:
            shown.append(f" (at {info.digest_slots}/{size} slots)", "dim")
        grid.add_row("K/V digest", shown)
        if info.same_kv:  # equal digests prove equal K/V only while this block's digest is current
            grid.add_row("same K/V in" if info.digest_current else "same digest", ", ".join(info.same_kv))
        self.set_body(grid)


# ---------------------------------------------------------------------------- status bar


class StatusBar(Widget):
    """Three lines. The first: play state, the engine step, the cursor's event, prefix-cache hit
    rate, blocks used per device, tokens/s and a note. The second: memory truth (GPU blocks in use
    beside slots holding tokens, empty slots in last blocks, what a max-length reservation would
    use) and the preemption ledger's totals. A narrow bar leaves out the least needed fields of
    each (the pool titles repeat the block counts). The third: what just happened
    (blockviz.model.narration), wrapped to as many lines as it needs (up to three). `deterministic`
    hides tokens/s (snapshots never show a clock)."""

    DEFAULT_CSS = """
    StatusBar {
        height: auto;
        max-height: 5;
        background: $boost;
        color: $text;
        padding: 0 1;
    }
    """

    IDLE_HINT = "s steps the engine · space plays · . goes one event · ? explains the picture"

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self._fields: list[tuple[int, Text]] = []  # (rank: lower stays longer, text) in display order
        self._memory: list[tuple[int, Text]] = []  # the second line's, the same way
        self.narration = ""

    def show(self, state: ReducerState, *, position: int, total: int, playing: bool, speed: str,
             tokens_per_s: float | None, deterministic: bool, live: bool, note: str = "",
             counts: dict[str, tuple[int, int, int]] | None = None, narration: str = "",
             memory: list[tuple[int, str]] = (), ledger: str = "", step: str | None = None) -> None:
        """`step`: the label of the step whose events are at the cursor (narration.cursor_step),
        else the reducer's last started step."""
        play = Text("▶ playing" if playing else "‖ paused", "bold green" if playing else "bold")
        play.append(f" {speed}")
        step = step if step is not None else f"step {state.step} {state.step_kind}".rstrip()
        fields = [(0, play), (2, Text(step)),
                  (1, Text(f"event {position}/{total}" + (" live" if live else "")))]
        if note:
            fields.append((1, Text(note, "italic")))
        fields.append((4, Text(f"prefix hits {state.prefix_hit_rate():.0%} of {state.prefix_hit_unit}")))
        for device, (used, cached, free) in (counts or pool_counts(state)).items():
            text = Text(f"{device.upper()} ", "bold")
            text.append(f"{used} used/{cached + free} free")
            if cached:
                text.append(f" ({cached} cached)", "italic")
            fields.append((6, text))
        if not deterministic:
            fields.append((7, Text(f"{tokens_per_s:.1f} tok/s" if tokens_per_s is not None else "— tok/s")))
        self._fields = fields
        self._memory = [(rank, Text(text)) for rank, text in memory]
        if ledger:
            preempted = state.num_preemptions
            self._memory.append((1 if preempted else 3, Text(ledger, "bold red" if preempted else "dim")))
        self.narration = narration
        lines = self._narration_lines()
        self.refresh(layout=lines != getattr(self, "_lines", None))  # the bar grows or shrinks with it
        self._lines = lines

    def _narration_lines(self) -> int:
        """The lines the narration wraps to (at most three: the bar's max-height)."""
        width = max(1, self.content_size.width or self.size.width or 80)
        return min(3, len(Text("▸ " + (self.narration or self.IDLE_HINT)).wrap(_MEASURE, width)))

    def render(self) -> RenderableType:
        width = max(1, self.content_size.width)
        what = Text("▸ ", "bold")
        what.append(self.narration or self.IDLE_HINT, "" if self.narration else "dim")
        return Group(_fit(self._fields, width, " │ "), _fit(self._memory, width, " · "), what)


_MEASURE = Console(file=io.StringIO(), width=400)  # measures wrapped text; prints nothing


class TitleBar(Static):
    """The header line: its parts (" · " between them) fitted to the width, the last ones left out
    first (the K/V geometry, then the pool sizes...), so a narrow terminal shows a shorter header
    rather than a cut one. `content` keeps the whole text."""

    def render(self) -> RenderableType:
        parts = str(self.content).split(" · ")
        return _fit([(index, Text(part)) for index, part in enumerate(parts)],
                    max(1, self.content_size.width), " · ")


def _fit(fields: list[tuple[int, Text]], width: int, between: str) -> Text:
    """The fields joined in one line, leaving out the highest ranks (the last first) until it fits."""
    separator = Text(between, "dim")
    while True:
        line = separator.join(text for _, text in fields)
        if cell_len(line.plain) <= width or len(fields) <= 1:
            break
        worst = max(rank for rank, _ in fields)
        if worst == 0:
            break
        drop = max(i for i, (rank, _) in enumerate(fields) if rank == worst)
        fields = fields[:drop] + fields[drop + 1:]
    line.truncate(width, overflow="ellipsis")
    return line
