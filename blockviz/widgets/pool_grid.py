"""A device's block pool as a grid of cells, drawn line by line (Textual's Line API).

One cell per physical block (vLLM's PhysicalTokenBlock, seed 000): its block number; its colour is
the owning sequence's (a shared block shows the first owner's colour on the number and the second's
on the rest, with the ref count as a superscript); the glyph at the right is the fill, slots holding tokens
over block_size (▁ … █); a free block is grey, a free-but-cached block (seed 002: still in the hash
map, a prefix-cache hit can revive it) is slate with a 'c'. The block the last event touched is
underlined; the selected block is reversed.

Only the visible lines are rendered, each a Strip cached until the state changes, so a 4,096-block
pool costs what fits on screen, not 4,096 widgets.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip

from blockviz.messages import BlockSelected
from blockviz.widgets.palette import (
    CACHED_STYLE,
    FREE_STYLE,
    SELECTED_STYLE,
    TOUCHED_STYLE,
    fill_glyph,
    is_cached_free,
    seq_style,
)
from engine.reducer import USED, BlockState, ReducerState

GAP = Segment(" ")
SUPERSCRIPTS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
FILL_GROUND = "#101010"
EMPTY_SLOTS_STYLE = Style(color="#4a4a4a", bgcolor=FILL_GROUND)


class PoolGrid(ScrollView, can_focus=True):
    """The GPU or CPU block pool. Set `state` (and `touched`) from above; arrow keys or a click
    select a block and post BlockSelected."""

    DEFAULT_CSS = """
    PoolGrid {
        height: auto;
        max-height: 100%;
        width: 1fr;
        overflow-x: hidden;
        border: round $secondary;
        border-title-color: $text;
        border-subtitle-color: $text-muted;
    }
    PoolGrid:focus {
        border: round $accent;
    }
    """

    BINDINGS = [
        Binding("left", "move(-1, 0)", "Previous block", show=False),
        Binding("right", "move(1, 0)", "Next block", show=False),
        Binding("up", "move(0, -1)", "Block above", show=False),
        Binding("down", "move(0, 1)", "Block below", show=False),
        Binding("home", "jump(0)", "First block", show=False),
        Binding("end", "jump(-1)", "Last block", show=False),
    ]

    selected: reactive[int | None] = reactive(None)
    projector: reactive[bool] = reactive(False)  # strong colours, big cells
    big: reactive[bool] = reactive(False)  # big cells (two lines each)

    def __init__(self, device: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.device = device
        self.state: ReducerState | None = None
        self.touched: frozenset[int] = frozenset()
        self._strips: dict[tuple[int, int], Strip] = {}
        self._columns = 1
        self.border_title = f"{device.upper()} pool"
        self.border_subtitle = "█ fill · ² refs · c cached"

    # ------------------------------------------------------------------ geometry

    @property
    def num_blocks(self) -> int:
        return len(self.state.pools[self.device]) if self.state is not None else 0

    @property
    def digits(self) -> int:
        return len(str(max(self.num_blocks - 1, 0)))

    @property
    def big_cells(self) -> bool:
        return self.big or self.projector

    @property
    def cell_height(self) -> int:
        return 2 if self.big_cells else 1

    @property
    def cell_width(self) -> int:
        """Characters per cell, without the gap."""
        return self.digits + (4 if self.big_cells else 2)

    @property
    def columns(self) -> int:
        return self._columns

    def _relayout(self) -> None:
        width = self.scrollable_content_region.width or self.size.width or 80
        self._columns = max(1, (width + 1) // (self.cell_width + 1))
        rows = -(-self.num_blocks // self._columns) if self.num_blocks else 0
        self.virtual_size = Size(self._columns * (self.cell_width + 1), rows * self.cell_height)
        self._strips.clear()

    def on_resize(self) -> None:
        self._relayout()
        self.refresh()

    def watch_projector(self) -> None:
        self._resize_cells()

    def watch_big(self) -> None:
        self._resize_cells()

    def _resize_cells(self) -> None:
        self.border_subtitle = "█ fill · ×2 refs · c cached" if self.big_cells else "█ fill · ² refs · c cached"
        self._relayout()
        self.refresh(layout=True)

    def watch_selected(self, old: int | None, new: int | None) -> None:
        self._strips.clear()
        self.refresh()
        if new is not None and self.num_blocks:
            self._scroll_to_block(new)

    # ------------------------------------------------------------------ data down

    def show(self, state: ReducerState, touched: frozenset[int] = frozenset(), title: str | None = None) -> None:
        """Draw `state`'s pool for this device; `touched` are block numbers the last event changed."""
        size_changed = self.state is None or len(state.pools[self.device]) != self.num_blocks
        self.state = state
        self.touched = touched
        if title is not None:
            self.border_title = title
        if size_changed:
            self._relayout()
            self.refresh(layout=True)
        else:
            self._strips.clear()
            self.refresh()

    # ------------------------------------------------------------------ rendering

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        row, sub = divmod(y + scroll_y, self.cell_height)
        key = (row, sub)
        strip = self._strips.get(key)
        if strip is None:
            strip = self._build_line(row, sub).apply_style(self.rich_style)
            self._strips[key] = strip
        return strip.crop_extend(scroll_x, scroll_x + self.scrollable_content_region.width, self.rich_style)

    def _build_line(self, row: int, sub: int) -> Strip:
        if self.state is None:
            return Strip.blank(0)
        blocks = self.state.pools[self.device]
        start = row * self._columns
        segments: list[Segment] = []
        cell = self._cell_big if self.big_cells else self._cell
        for number in range(start, min(start + self._columns, len(blocks))):
            segments.extend(cell(blocks[number], sub))
            segments.append(GAP)
        return Strip(segments)

    def _decorate(self, block: BlockState, style: Style) -> Style:
        if block.number == self.selected:
            style = style + SELECTED_STYLE
        if block.number in self.touched:
            style = style + TOUCHED_STYLE
        return style

    def _styles(self, block: BlockState) -> tuple[Style, Style, str]:
        """(style of the number, style of the rest, mark) for one block."""
        if block.state == USED:
            owners = sorted(block.owners)
            projector = self.projector
            first = seq_style(owners[0], projector) if owners else Style(color="#000000", bgcolor="#a0a0a0")
            second = seq_style(owners[1], projector) if len(owners) > 1 else first
            mark = " "
            if block.ref_count > 1:
                mark = SUPERSCRIPTS[block.ref_count] if block.ref_count < 10 else "⁺"
                second = second + Style(bold=True)
            return first, second, mark
        if is_cached_free(block):
            return CACHED_STYLE, CACHED_STYLE, "c"
        return FREE_STYLE, FREE_STYLE, " "

    def _fill_style(self, block: BlockState, rest: Style) -> Style:
        """The fill glyph: the owner's colour rising on a dark ground."""
        colour = rest.bgcolor
        return Style(color=colour, bgcolor=FILL_GROUND) if colour is not None else rest

    def _cell(self, block: BlockState, sub: int) -> list[Segment]:
        first, second, mark = self._styles(block)
        shows_fill = block.state == USED or mark == "c"
        glyph = fill_glyph(len(block.token_ids), self.state.block_size) if shows_fill else " "
        return [
            Segment(f"{block.number:>{self.digits}}", self._decorate(block, first)),
            Segment(mark, self._decorate(block, second)),
            Segment(glyph, self._decorate(block, self._fill_style(block, second) if shows_fill else second)),
        ]

    def _cell_big(self, block: BlockState, sub: int) -> list[Segment]:
        first, second, mark = self._styles(block)
        width = self.cell_width
        if sub == 0:
            ref = f"×{block.ref_count}" if block.ref_count > 1 else (" c" if mark == "c" else "  ")
            number = f" {block.number:>{self.digits}}"
            return [Segment(number, self._decorate(block, first)),
                    Segment(ref.ljust(width - len(number)), self._decorate(block, second))]
        num_tokens = len(block.token_ids) if block.state == USED or mark == "c" else 0
        filled = round(width * num_tokens / self.state.block_size) if num_tokens else 0
        if num_tokens and not filled:
            filled = 1
        segments = []
        if filled:
            colour = second.bgcolor
            segments.append(Segment("█" * filled, self._decorate(block, Style(color=colour, bgcolor=FILL_GROUND))))
        if width - filled:
            segments.append(Segment("░" * (width - filled), self._decorate(block, EMPTY_SLOTS_STYLE)))
        return segments

    # ------------------------------------------------------------------ selection

    def block_at(self, x: int, y: int) -> int | None:
        """The block under content offset (x, y), scroll included, if any."""
        column, within = divmod(x, self.cell_width + 1)
        if within >= self.cell_width or column >= self._columns:
            return None
        number = (y // self.cell_height) * self._columns + column
        return number if 0 <= number < self.num_blocks else None

    def select(self, number: int) -> None:
        if not self.num_blocks:
            return
        number = max(0, min(number, self.num_blocks - 1))
        self.selected = number
        self.post_message(BlockSelected(self.device, number))

    def action_move(self, dx: int, dy: int) -> None:
        current = self.selected if self.selected is not None else 0
        self.select(current + dx + dy * self._columns if self.selected is not None else 0)

    def action_jump(self, number: int) -> None:
        self.select(number if number >= 0 else self.num_blocks - 1)

    def on_click(self, event: Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        number = self.block_at(offset.x + self.scroll_offset.x, offset.y + self.scroll_offset.y)
        if number is not None:
            self.focus()
            self.select(number)

    def _scroll_to_block(self, number: int) -> None:
        row, column = divmod(number, self._columns)
        region = Region(column * (self.cell_width + 1), row * self.cell_height, self.cell_width, self.cell_height)
        self.scroll_to_region(region, animate=False, immediate=True)

    # ------------------------------------------------------------------ text for tests and screen readers

    def cell_text(self, number: int) -> str:
        """What the cell of block `number` shows (one line per cell row)."""
        block = self.state.pools[self.device][number]
        cell = self._cell_big if self.big_cells else self._cell
        return "\n".join("".join(s.text for s in cell(block, sub)) for sub in range(self.cell_height))
