"""The text panels: block tables, generated text, hash chains, block inspector, status bar.

Each panel is handed the reducer's state from above (`show(...)`) and renders a Rich renderable
from it; nothing here reads an engine object. `StatePanel` is the reusable base: a scrolling,
bordered box holding one Static body.
"""

from __future__ import annotations

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.widget import Widget
from textual.widgets import Static

from blockviz.model.palette import (
    block_state_name,
    block_tint,
    block_token_texts,
    fill_glyph,
    is_cached_free,
    pool_counts,
    seq_style,
    short_hash,
    show_token,
    tokens_text,
)
from engine import events as ev
from blockviz.model.reducer import USED, BlockState, ReducerState


def _select_seq_style(seq_id: int) -> Style:
    """Clicking a sequence label selects it (a Textual action link)."""
    return Style.from_meta({"@click": f"app.select_sequence({seq_id})"})


class StatePanel(VerticalScroll):
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

    def show(self, *args, **kwargs) -> None:
        """Render from the given state now if visible, else when the panel is next shown."""
        self._last = (args, kwargs)
        if self.display:
            self.draw(*args, **kwargs)

    def on_show(self) -> None:
        last = getattr(self, "_last", None)
        if last is not None:
            self.draw(*last[0], **last[1])

    def draw(self, *args, **kwargs) -> None:
        raise NotImplementedError


# ---------------------------------------------------------------------------- block tables


class BlockTables(StatePanel):
    """Per sequence: its block table, logical block -> physical block, with each slot's token
    (vLLM v0 BlockSpaceManager.block_tables; logical blocks are contiguous, physical
    ones need not be)."""

    TITLE = "Block tables (logical → physical)"

    def draw(self, state: ReducerState, selected_seq: int | None = None) -> None:
        parts: list[RenderableType] = []
        size = state.block_size
        for seq_id in sorted(state.seqs):
            seq = state.seqs[seq_id]
            table = state.tables.get(seq_id)
            head = Text("▶" if seq_id == selected_seq else " ")
            head.append(f" seq {seq_id} ", seq_style(seq_id) + _select_seq_style(seq_id))
            head.append(f" req {seq.request_id} · {seq.status}"
                        + (f" ({seq.finish_reason})" if seq.finish_reason else "")
                        + f" · {len(seq.token_ids)} tokens", style="bold" if seq_id == selected_seq else "")
            parts.append(head)
            if not table:
                parts.append(Text("    no blocks", style="dim"))
                continue
            placement = Text("    blocks ")
            for index, (device, number) in enumerate(table):
                placement.append(f"{'C' if device == 'cpu' else ''}{number}",
                                 Style(bgcolor=block_tint(device, number), color="#ffffff", bold=True))
                placement.append(" ")
            parts.append(placement)
            width = len(str(len(state.pools["gpu"]) - 1))
            for index, (device, number) in enumerate(table):
                block = state.pools[device][number]
                texts = seq.token_texts[index * size:index * size + len(block.token_ids)]
                row = Text(f"  L{index:<2}", style="dim")
                row.append(f" → {device} {number:<{width}}")
                row.append(f" ×{block.ref_count}" if block.ref_count > 1 else "   ", style="bold")
                row.append(" ")
                row.append_text(tokens_text(texts, Style(bgcolor=block_tint(device, number, 0)),
                                            Style(bgcolor=block_tint(device, number, 1))))
                empty = size - len(block.token_ids)
                if empty:
                    row.append(f" +{empty} empty", style="dim")
                parts.append(row)
        self.set_rows(parts)


# ---------------------------------------------------------------------------- generated text


class GeneratedText(StatePanel):
    """Each sequence's text, one tinted run per token: the tint is the block holding the token
    (alternating shades mark token edges); a token without a slot yet is underlined."""

    TITLE = "Text (tint = its block)"

    def draw(self, state: ReducerState, selected_seq: int | None = None) -> None:
        parts: list[RenderableType] = []
        size = state.block_size
        for seq_id in sorted(state.seqs):
            seq = state.seqs[seq_id]
            table = state.tables.get(seq_id, [])
            line = Text("▶" if seq_id == selected_seq else " ")
            line.append(f" seq {seq_id} ", seq_style(seq_id) + _select_seq_style(seq_id))
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
        hashed = [b for b in state.pools["gpu"] if b.block_hash is not None]
        if not hashed:
            self.set_body(Text("no hashed blocks: full blocks get a chained hash with --prefix-caching",
                               style="dim"))
            return
        hit_block = current.block if isinstance(current, ev.PrefixCacheHit) else None
        by_parent: dict[int | None, list[BlockState]] = {}
        known = {b.block_hash for b in hashed}
        for block in hashed:
            parent = block.parent_hash if block.parent_hash in known else None
            by_parent.setdefault(parent, []).append(block)
        grid = Table.grid(padding=(0, 1))
        grid.add_column(no_wrap=True)
        grid.add_column(no_wrap=True)
        grid.add_column()
        seen: set[int] = set()

        def walk(parent: int | None, depth: int) -> None:
            children = sorted(by_parent.get(parent, []), key=lambda b: b.number)
            branching = len(children) > 1
            for position, block in enumerate(children):
                if block.number in seen:
                    continue
                seen.add(block.number)
                # A chain continues straight down; only where it branches do children indent.
                indent = "  " * min(depth, 8)
                if branching:
                    indent += "└ " if position == len(children) - 1 else "├ "
                label = Text(indent)
                hash_style = "bold #000000 on #ffd400" if block.num_hits else "bold"
                if block.number == hit_block:
                    hash_style += " reverse"
                label.append(f"#{short_hash(block.block_hash)}", hash_style)
                label.append(f" ← #{short_hash(block.parent_hash)}" if block.parent_hash is not None else " ← root",
                             "dim")
                info = Text(f"gpu {block.number}")
                if block.ref_count:
                    info.append(f" ×{block.ref_count}")
                if is_cached_free(block):
                    info.append(" cached-free", "italic")
                if block.num_hits:
                    info.append(f" HIT×{block.num_hits}", "bold #000000 on #ffd400")
                if not block.registered:
                    info.append(" dup", "dim")
                texts = block_token_texts(state, block, vocab)
                grid.add_row(label, info, tokens_text(texts, Style(bgcolor="#333344"), Style(bgcolor="#44445a")))
                walk(block.block_hash, depth + 1 if branching else depth)

        walk(None, 0)
        for block in hashed:  # anything left (a cycle cannot happen, but be safe)
            if block.number not in seen:
                walk(block.parent_hash, 0)
        rate = state.prefix_hit_rate()
        summary = Text(f"{len(state.hash_map)} in hash map · hits {state.num_prefix_hits}"
                       f"/{state.num_prompt_blocks_looked_up} prompt blocks ({rate:.0%})", style="dim")
        self.set_body(Group(summary, grid))


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
        block = state.pools[device][number]
        self.border_title = f"Block inspector · {device} {number}"
        grid = Table.grid(padding=(0, 1))
        grid.add_column(style="dim", no_wrap=True)
        grid.add_column()
        grid.add_row("state", block_state_name(block))
        grid.add_row("ref count", str(block.ref_count))
        owners = Text()
        for seq_id in sorted(block.owners):
            owners.append(f" seq {seq_id} ", seq_style(seq_id) + _select_seq_style(seq_id))
            owners.append(" ")
        grid.add_row("owners", owners if block.owners else Text("none", "dim"))
        filled = len(block.token_ids) if block.state == USED or is_cached_free(block) else 0
        grid.add_row("fill", f"{filled}/{state.block_size} slots {fill_glyph(filled, state.block_size)}")
        if block.block_hash is not None:
            grid.add_row("hash", f"#{short_hash(block.block_hash, 16)}"
                         + ("" if block.registered else " (duplicate, not in map)"))
            grid.add_row("parent", f"#{short_hash(block.parent_hash, 16)}" if block.parent_hash is not None
                         else "none (first block)")
            grid.add_row("hits", str(block.num_hits))
        if filled:
            texts = block_token_texts(state, block, vocab)
            grid.add_row("tokens", tokens_text(texts, Style(bgcolor=block_tint(device, number, 0)),
                                              Style(bgcolor=block_tint(device, number, 1))))
        digest = block.digest
        shown = Text(digest, "bold") if digest else Text("none yet", "dim")
        # Slots written since the digest was taken (a live run at full speed digests once per
        # batch of steps, not every step): say what it covers.
        current = block.digest_slots == filled
        if digest and not current:
            shown.append(f" (at {block.digest_slots}/{state.block_size} slots)", "dim")
        grid.add_row("K/V digest", shown)
        if digest:
            same = [f"{b.device} {b.number}" for pool in state.pools.values() for b in pool
                    if b.digest == digest and b is not block and (b.state == USED or is_cached_free(b))]
            if same:  # equal digests prove equal K/V only while this block's digest is current
                grid.add_row("same K/V in" if current else "same digest", ", ".join(same))
        self.set_body(grid)


# ---------------------------------------------------------------------------- status bar


class StatusBar(Widget):
    """Three lines. The first: play state, the engine step, the cursor's event, prefix-cache hit
    rate, blocks used per device, tokens/s and a note. The second: memory truth (GPU blocks in use
    beside slots holding tokens, empty slots in last blocks, what a max-length reservation would
    use) and the preemption ledger's totals. A narrow bar leaves out the least needed fields of
    each (the pool titles repeat the block counts). The third: what just happened
    (blockviz.model.narration), cut with an ellipsis. `deterministic` hides tokens/s (snapshots never
    show a clock)."""

    DEFAULT_CSS = """
    StatusBar {
        height: 3;
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
             memory: list[tuple[int, str]] = (), ledger: str = "") -> None:
        play = Text("▶ playing" if playing else "‖ paused", "bold green" if playing else "bold")
        play.append(f" {speed}")
        fields = [(0, play), (2, Text(f"step {state.step} {state.step_kind}".rstrip())),
                  (1, Text(f"event {position}/{total}" + (" live" if live else "")))]
        if note:
            fields.append((1, Text(note, "italic")))
        fields.append((4, Text(f"prefix hits {state.prefix_hit_rate():.0%}")))
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
        self.refresh()

    def render(self) -> RenderableType:
        width = max(1, self.content_size.width)
        what = Text("▸ ", "bold")
        what.append(self.narration or self.IDLE_HINT, "" if self.narration else "dim")
        what.truncate(width, overflow="ellipsis")
        return Group(_fit(self._fields, width, " │ "), _fit(self._memory, width, " · "), what)


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
