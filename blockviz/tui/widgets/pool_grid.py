"""A device's block pool as a grid of cells, drawn line by line (Textual's Line API).

One cell per physical block (vLLM v0's PhysicalTokenBlock): its block number; its colour is
the owning sequence's (a shared block shows the first owner's colour on the number and the second's
on the rest, with the ref count as a superscript); the glyph at the right is the fill, slots holding tokens
over block_size (▁ … █); a free block is grey, a free-but-cached block (nano-vllm's cache: still in the hash
map, a prefix-cache hit can revive it) is slate with a 'c'. In a vLLM v1 run, block 0 is the null block
(dark amber, '∅': never allocated, freed or counted) and the head of the free queue (the block
get_new_blocks takes next) has an orange number; `FreeQueueRow` lists the queue's first blocks, and
an empty pool (v1 has no CPU pool) says why in a line (view.v1_notes). The block the last event
touched is underlined; the selected block is reversed. In a run with several KV-cache groups (a
hybrid model's) a used or cached block's mark is a notch in its group's colour holding the group's
number as a subscript (₀, ₁: palette.group_mark), or its ref count where it is shared; free blocks
and the null block belong to no group.

Only the visible lines are rendered, each a Strip cached until the state changes, so a 4,096-block
pool costs what fits on screen, not 4,096 widgets.

A pool of more than pool_zoom.MAX_BLOCK_CELLS blocks (a GPU's, sized from its memory) is drawn
zoomed out (blockviz.model.pool_zoom): a character per N blocks, its bar (▁ … █, green) the share
of them in use on the ground of the state most of the rest are in (slate: cached, dark: free); the
subtitle says N. `z` zooms into the selected block's cell (a range of at most MAX_BLOCK_CELLS
blocks is drawn one cell per block, numbered as in the pool), `Z` back out to the whole pool.
Selection stays a block: in a zoomed-out pool a cell selects its first block, so the inspector
and the tables name exact blocks.

While a guide card is up in a small terminal, a pool can be drawn focused (`focus_on`): only the
rows that hold the card's blocks, in one-line cells when `compact`, so the card and every block it
names fit on one screen; every row when the whole pool fits in the room its column leaves it; the subtitle says how many blocks the hidden rows hold ("card's rows ·
24 blocks hidden").
"""

from __future__ import annotations

import textwrap

from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual.binding import Binding
from textual.events import Click
from textual.geometry import Region, Size
from textual.reactive import reactive
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Static

from blockviz.model.palette import (BLOCK_COLOURS, FILL_GLYPHS, WIDE_EMPTY, WIDE_FILL, fill_glyph, group_mark,
                                    legend_line, ref_mark, seq_colour)
from blockviz.model.pool_zoom import ZoomCells, cell_label, check_range, zoom_cells, zoom_level
from blockviz.model.reducer import BlockState, ReducerState
from blockviz.model.view import BlockCell, block_cell, block_group, free_queue, has_groups
from blockviz.tui.messages import BlockSelected
from blockviz.tui.styles import (CACHED_STYLE, FREE_STYLE, NULL_STYLE, QUEUE_HEAD_STYLE, SELECTED_STYLE,
                                 TOUCHED_STYLE, group_style)

GAP = Segment(" ")
FILL_GROUND = BLOCK_COLOURS["bar"]["used"]  # the ground a fill glyph is drawn on
EMPTY_SLOTS_STYLE = Style(color="#4a4a4a", bgcolor=FILL_GROUND)
LEGEND = legend_line(wide=False)
LEGEND_BIG = legend_line(wide=True)
GROUP_LEGEND = " · ₀₁ grp"  # after the legend in a run with several KV-cache groups (KV-cache group; fits 80x24)
NULL_MARK = "∅"
ZOOM_GROUNDS = {"free": FILL_GROUND, "cached": BLOCK_COLOURS["cached"], "null": BLOCK_COLOURS["null"]}
ZOOM_LEGEND = "▁…█ share used · slate cached · z in · Z out"


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
        Binding("z", "zoom_in", "Zoom in", show=False, tooltip="Zoom into the selected block's cell (a big pool)"),
        Binding("Z", "zoom_out", "Zoom out", show=False, tooltip="Zoom out to the whole pool"),
    ]

    selected: reactive[int | None] = reactive(None)
    projector: reactive[bool] = reactive(False)  # strong colours, big cells
    big: reactive[bool] = reactive(False)  # big cells (two lines each)
    compact: reactive[bool] = reactive(False)  # one-line cells whatever `big` and `projector` say

    def __init__(self, device: str, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.device = device
        self.state: ReducerState | None = None
        self.touched: frozenset[int] = frozenset()
        self.head: int | None = None  # v1: the free queue's head
        self.note = ""  # what an empty pool says instead (view.v1_notes)
        self.zoom: tuple[int, int] | None = None  # the blocks (start, stop) zoomed into; None: the whole pool
        self._start, self._stop, self._per_cell = 0, 0, 1  # the range drawn, blocks per cell
        self._cells: ZoomCells | None = None  # the range's cells while zoomed out
        self._rows: dict[int, tuple[tuple, list[Strip]]] = {}  # row -> (look key, its lines)
        self._in_view: frozenset[int] = frozenset()  # the blocks bring_into_view last scrolled to
        self.focused: frozenset[int] | None = None  # focus_on's blocks: only their rows are drawn
        self._focus_rows: list[int] = []  # the rows drawn while focused, in order
        self._look_styles: dict[tuple, Style] = {}
        self._base = Style()
        self._gap = GAP
        self._digits = 1
        self._columns = 1
        self._groups = False  # the run has several KV-cache groups: blocks carry their group's mark
        self.border_title = f"{device.upper()} pool"
        self.border_subtitle = LEGEND

    # ------------------------------------------------------------------ geometry

    @property
    def num_blocks(self) -> int:
        return len(self.state.pools[self.device]) if self.state is not None else 0

    @property
    def digits(self) -> int:
        return len(str(max(self._stop - 1, self.num_blocks - 1 if self.zoom is None else 0, 0)))

    @property
    def zoomed_out(self) -> bool:
        """Whether a cell stands for several blocks (per_cell > 1)."""
        return self._per_cell > 1

    @property
    def per_cell(self) -> int:
        return self._per_cell

    @property
    def block_range(self) -> tuple[int, int]:
        """The blocks drawn: (start, stop)."""
        return self._start, self._stop

    @property
    def cells(self) -> ZoomCells | None:
        """The zoomed-out cells (pool_zoom.zoom_cells) drawn, None when drawn one cell per block."""
        return self._cells

    @property
    def num_positions(self) -> int:
        """Cells drawn: blocks in the range, or zoomed-out cells."""
        return self._cells.num_cells if self._cells is not None else self._stop - self._start

    def _set_range(self) -> None:
        """The range to draw (the zoom, clipped to the pool; the whole pool when it no longer
        holds it) and its blocks per cell; the cells counted when zoomed out."""
        n = self.num_blocks
        try:
            self._start, self._stop = check_range(*self.zoom, n) if self.zoom is not None else (0, n)
        except ValueError:
            self.zoom = None
            self._start, self._stop = 0, n
        self._per_cell = zoom_level(self._stop - self._start)
        self._count_cells()

    def _count_cells(self) -> None:
        self._cells = (zoom_cells(self.state, self.device, self._start, self._stop, self._per_cell)
                       if self._per_cell > 1 and self.state is not None else None)

    def _position(self, number: int) -> int | None:
        """The cell drawing block `number`, None outside the range."""
        if not self._start <= number < self._stop:
            return None
        return (number - self._start) // self._per_cell

    @property
    def big_cells(self) -> bool:
        return (self.big or self.projector) and not self.compact

    @property
    def cell_height(self) -> int:
        return 2 if self.big_cells and not self.zoomed_out else 1

    @property
    def cell_width(self) -> int:
        """Characters per cell, without the gap."""
        return 1 if self.zoomed_out else self.digits + (4 if self.big_cells else 2)

    @property
    def pitch(self) -> int:
        """Characters from one cell to the next: zoomed-out cells have no gap."""
        return self.cell_width + (0 if self.zoomed_out else 1)

    @property
    def columns(self) -> int:
        return self._columns

    def _relayout(self) -> None:
        self._set_range()
        self._digits = self.digits
        self._invalidate()
        width = self.scrollable_content_region.width or self.size.width or 80
        gap = self.pitch - self.cell_width
        self._columns = max(1, (width + gap) // self.pitch)
        total_rows = -(-self.num_positions // self._columns)
        if self.focused is not None and self._room() >= total_rows * self.cell_height:
            self._focus_rows = list(range(total_rows))  # the whole pool fits beside the card: every row
        else:
            self._focus_rows = sorted({p // self._columns for p in map(self._position, self.focused or ())
                                       if p is not None})
        rows = total_rows if self.num_blocks else len(self._note_lines())
        if self.focused is not None and self.num_blocks:
            rows = len(self._focus_rows)
        size = Size(self._columns * self.pitch, rows * self.cell_height)
        grew = self.focused is not None and size.height != self.virtual_size.height
        self.virtual_size = size
        if grew:  # a focused pool's box is as tall as its rows
            self.refresh(layout=True)
        self._show_page()

    def _room(self) -> int:
        """The lines of content this pool may take in its column: the column's height less its other
        shown children's and this pool's border (0 before a layout)."""
        column = self.parent
        if column is None or not column.size.height:
            return 0
        others = sum(child.outer_size.height for child in column.children if child is not self and child.display)
        return column.size.height - others - self.styles.gutter.height

    def _show_page(self) -> None:
        """The legend under the grid; when the pool does not fit, which blocks are in view."""
        visible_rows = self.scrollable_content_region.height // self.cell_height
        total_rows = -(-self.num_positions // self._columns)
        ranged = self.zoom is not None or self.zoomed_out
        where = (f"blocks {self._start}-{self._stop - 1} of {self.num_blocks} · "
                 if (self._start, self._stop) != (0, self.num_blocks) else "")
        hidden = sum(len(self._row_positions(row)) for row in range(total_rows) if row not in self._focus_rows) \
            if self.focused is not None and self.num_blocks else 0
        if hidden:
            self.border_subtitle = f"card's rows · {hidden} {'cells' if self.zoomed_out else 'blocks'} hidden"
        elif self.num_blocks and visible_rows and total_rows > visible_rows and not self.zoomed_out:
            first_row = min(int(self.scroll_offset.y) // self.cell_height, total_rows - visible_rows)
            last = min(self._stop, self._start + (first_row + visible_rows) * self._columns) - 1
            of = f"{self._start}-{self._stop - 1} · Z whole pool" if self.zoom is not None else str(self.num_blocks)
            self.border_subtitle = f"blocks {self._start + first_row * self._columns}-{last} of {of} · ↑↓ scrolls"
        elif self.zoomed_out:
            self.border_subtitle = f"{where}{cell_label(self._per_cell)} · {ZOOM_LEGEND}"
        elif ranged:
            self.border_subtitle = f"{where}{cell_label(1)} · Z whole pool"
        elif self.num_blocks or not self.note:
            self.border_subtitle = (LEGEND_BIG if self.big_cells else LEGEND) + (GROUP_LEGEND if self._groups else "")
        else:  # an empty pool saying why: no legend to read
            self.border_subtitle = ""

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._show_page()

    def on_resize(self) -> None:
        self._relayout()
        self.refresh()

    def watch_projector(self) -> None:
        self._resize_cells()

    def watch_big(self) -> None:
        self._resize_cells()

    def watch_compact(self) -> None:
        self._resize_cells()

    def focus_on(self, numbers: frozenset[int] | None) -> None:
        """Draw only the rows that hold `numbers` (a guide card's blocks, in a small terminal), or
        every row where the whole pool fits in its column's room; None: every row again."""
        if numbers == self.focused:
            return
        self.focused = numbers
        if numbers is not None:
            self.scroll_to(y=0, animate=False, immediate=True)
            self.call_after_refresh(self._relayout)  # again in the column's new room (a card's height)
        self._relayout()
        self.refresh(layout=True)

    def _row_of_line(self, y: int) -> tuple[int, int] | None:
        """(row, line within its cells) that content line `y` (scroll included) draws; None past
        the focused rows."""
        row, sub = divmod(y, self.cell_height)
        if self.focused is not None:
            if row >= len(self._focus_rows):
                return None
            row = self._focus_rows[row]
        return row, sub

    def _resize_cells(self) -> None:
        self._relayout()
        self.refresh(layout=True)

    def watch_selected(self, old: int | None, new: int | None) -> None:
        self._rows.clear()
        self.refresh()
        if new is not None and self.num_blocks and self._position(new) is not None:
            self._scroll_to_block(new)

    # ------------------------------------------------------------------ data down

    def show(self, state: ReducerState, touched: frozenset[int] = frozenset(), title: str | None = None,
             note: str = "") -> None:
        """Draw `state`'s pool for this device; `touched` are block numbers the last event changed;
        `note` is what the pool says when it has no blocks (a v1 run's CPU pool).

        Only rows whose cells look different from what is on screen are refreshed (a cell's look is
        a small key: state, first two owners, ref count, fill, selected, touched, queue head)."""
        size_changed = (self.state is None or len(state.pools[self.device]) != self.num_blocks
                        or note != self.note)
        self.state = state
        self.touched = touched
        self.note = note
        if has_groups(state) != self._groups:
            self._groups = has_groups(state)
            self._show_page()
        queue = state.free_queue if self.device == "gpu" else ()
        self.head = queue[0] if queue else None
        if title is not None and title != self.border_title:
            self.border_title = title
        if size_changed:
            self._relayout()
            self.refresh(layout=True)
            return
        self._count_cells()
        base = self.rich_style
        if base != self._base:
            self._invalidate()
            self.refresh()
            return
        if self.focused is not None:
            self.refresh()  # a few rows
            return
        height = self.cell_height
        first_row = int(self.scroll_offset.y) // height
        last_row = (int(self.scroll_offset.y) + self.size.height) // height
        for row in range(first_row, last_row + 1):
            cached = self._rows.get(row)
            if cached is not None and cached[0] != self._row_key(row):
                self.refresh_lines(row * height, height)

    def _invalidate(self) -> None:
        self._rows.clear()
        self._look_styles.clear()
        self._base = self.rich_style
        self._gap = Segment(" ", self._base)

    # ------------------------------------------------------------------ rendering

    def _note_lines(self) -> list[str]:
        if not self.note or self.num_blocks:
            return []
        width = self.scrollable_content_region.width or self.size.width or 80
        return [line for paragraph in self.note.splitlines() for line in textwrap.wrap(paragraph, max(8, width))]

    def render_line(self, y: int) -> Strip:
        if not self.num_blocks and self.note:
            lines = self._note_lines()
            line = lines[y] if y < len(lines) else ""
            return Strip([Segment(line, self._base + Style(dim=True, italic=True))]).extend_cell_length(
                self.scrollable_content_region.width, self._base)
        where = self._row_of_line(y + int(self.scroll_offset.y))
        if where is None:
            return Strip.blank(self.scrollable_content_region.width, self._base)
        row, sub = where
        key = self._row_key(row)
        cached = self._rows.get(row)
        if cached is None or cached[0] != key:
            cached = (key, self._build_row(row))
            self._rows[row] = cached
        return cached[1][sub]

    def _cell_key(self, block: BlockState) -> tuple:
        number = block.number
        return (block_cell(block), block.group, number == self.selected, number in self.touched, number == self.head)

    def _row_key(self, row: int) -> tuple:
        if self.state is None:
            return ()
        if self._cells is not None:
            return tuple(self._zoom_key(cell) for cell in self._row_positions(row))
        blocks = self.state.pools[self.device]
        return tuple(self._cell_key(blocks[n]) for n in self._row_numbers(row))

    def _row_numbers(self, row: int) -> range:
        """The blocks of one row, drawn one cell per block."""
        start = self._start + row * self._columns
        return range(start, min(start + self._columns, self._stop))

    def _row_positions(self, row: int) -> range:
        start = row * self._columns
        return range(start, min(start + self._columns, self.num_positions))

    def _zoom_key(self, cell: int) -> tuple:
        """A zoomed-out cell's look: its eighths used and ground, whether it holds the selected
        block or a touched one."""
        cells = self._cells
        blocks = cells.blocks_of(cell)
        selected = self.selected is not None and self.selected in blocks
        touched = any(number in blocks for number in self.touched) if self.touched else False
        return (*cells.look(cell), selected, touched)

    def _build_row(self, row: int) -> list[Strip]:
        """Every line of one row of cells, each padded to the content width."""
        width = self.scrollable_content_region.width
        blank = Strip.blank(width, self._base)
        if self.state is None:
            return [blank] * self.cell_height
        if self._cells is not None:
            return [self._zoom_line(row, width, blank)]
        blocks = self.state.pools[self.device]
        numbers = self._row_numbers(row)
        if not numbers:
            return [blank] * self.cell_height
        cell = self._cell_big if self.big_cells else self._cell
        gap = self._gap
        lines = []
        for sub in range(self.cell_height):
            segments: list[Segment] = []
            for number in numbers:
                segments.extend(cell(blocks[number], sub))
                segments.append(gap)
            length = len(numbers) * (self.cell_width + 1)
            if length < width:
                segments.append(Segment(" " * (width - length), self._base))
            lines.append(Strip(segments, max(length, width)).crop(0, width))
        return lines

    def _zoom_line(self, row: int, width: int, blank: Strip) -> Strip:
        """One row of zoomed-out cells: per cell the glyph of its eighths used on its ground."""
        positions = self._row_positions(row)
        if not positions:
            return blank
        segments = [self._zoom_segment(cell) for cell in positions]
        if len(positions) < width:
            segments.append(Segment(" " * (width - len(positions)), self._base))
        return Strip(segments, max(len(positions), width)).crop(0, width)

    def _zoom_segment(self, cell: int) -> Segment:
        eighths, ground, selected, touched = self._zoom_key(cell)
        key = ("zoom", ground, selected, touched)
        style = self._look_styles.get(key)
        if style is None:
            style = self._base + Style(color=BLOCK_COLOURS["used"], bgcolor=ZOOM_GROUNDS[ground])
            if selected:
                style += SELECTED_STYLE
            if touched:
                style += TOUCHED_STYLE
            self._look_styles[key] = style
        return Segment(FILL_GLYPHS[eighths], style)

    def _style(self, key: tuple) -> Style:
        """Styles by (role, kind, owner, projector, selected, touched), built once."""
        style = self._look_styles.get(key)
        if style is None:
            role, kind, owner, selected, touched = key
            if kind == 1:
                colour = seq_colour(owner, self.projector) if owner is not None else "#a0a0a0"
                if role == "fill":
                    style = Style(color=colour, bgcolor=FILL_GROUND)
                else:
                    style = Style(color=BLOCK_COLOURS["text"]["used"], bgcolor=colour, bold=self.projector or role == "mark")
            elif kind == 2:
                style = CACHED_STYLE if role != "fill" else Style(color=BLOCK_COLOURS["bar"]["cached"], bgcolor=FILL_GROUND)
            elif kind == 3:
                style = NULL_STYLE
            else:
                style = EMPTY_SLOTS_STYLE if role == "fill" else FREE_STYLE
            style = self._base + style
            if selected:
                style += SELECTED_STYLE
            if touched:
                style += TOUCHED_STYLE
            if role == "head":
                style += QUEUE_HEAD_STYLE
            self._look_styles[key] = style
        return style

    def _looks(self, block: BlockState) -> tuple[BlockCell, int, int | None, int | None, str, bool, bool]:
        """(the view model's cell, kind, first owner, second owner, mark, selected, touched): kind 1
        used, 2 cached-free, 3 v1's null block, 0 free; a block with one owner shows its colour on
        both parts."""
        number = block.number
        selected, touched = number == self.selected, number in self.touched
        cell = block_cell(block)
        if cell.state == "used":
            first = cell.owner if cell.owner >= 0 else None
            second = cell.owner2 if cell.owner2 >= 0 else first
            mark = ref_mark(cell.ref) or " "
            return cell, 1, first, second, mark, selected, touched
        if cell.state == "cached":
            return cell, 2, None, None, "c", selected, touched
        if cell.state == "null":
            return cell, 3, None, None, NULL_MARK, selected, touched
        return cell, 0, None, None, " ", selected, touched

    def _group_segment(self, block: BlockState, cell: BlockCell, selected: bool, touched: bool,
                       width: int = 1, refs_shown: bool = False) -> Segment | None:
        """A used or cached block's group notch (a run with several groups): the ref count where it
        is shared and nothing else shows it, else the group's subscript, on the group's colour;
        None otherwise."""
        group = block_group(block) if self._groups else -1
        if group < 0:
            return None
        key = ("group", group, selected, touched)
        style = self._look_styles.get(key)
        if style is None:
            style = self._base + group_style(group)
            if selected:
                style += SELECTED_STYLE
            if touched:
                style += TOUCHED_STYLE
            self._look_styles[key] = style
        mark = group_mark(group) if cell.ref < 2 or width > 1 or refs_shown else ref_mark(cell.ref)
        return Segment(mark.rjust(width)[:width], style)

    def _number_role(self, block: BlockState) -> str:
        """The free queue's head draws its number in QUEUE_HEAD_STYLE ("next to go")."""
        return "head" if block.number == self.head else "number"

    def _cell(self, block: BlockState, sub: int) -> list[Segment]:
        cell, kind, first, second, mark, selected, touched = self._looks(block)
        glyph = fill_glyph(cell.fill, self.state.block_size) if kind in (1, 2) else " "
        style = self._style
        notch = self._group_segment(block, cell, selected, touched) if kind in (1, 2) else None
        return [
            Segment(f"{block.number:>{self._digits}}", style((self._number_role(block), kind, first, selected, touched))),
            notch or Segment(mark, style(("mark", kind, second, selected, touched))),
            Segment(glyph, style(("fill" if kind else "mark", kind, second, selected, touched))),
        ]

    def _cell_big(self, block: BlockState, sub: int) -> list[Segment]:
        cell, kind, first, second, mark, selected, touched = self._looks(block)
        width = self.cell_width
        style = self._style
        if sub == 0:
            ref = ref_mark(cell.ref, wide=True) or (f" {mark}" if kind in (2, 3) else "  ")
            number = f" {block.number:>{self._digits}}"
            notch = self._group_segment(block, cell, selected, touched, refs_shown=True) if kind in (1, 2) else None
            rest = width - len(number) - (1 if notch else 0)
            return [Segment(number, style((self._number_role(block), kind, first, selected, touched))),
                    Segment(ref.ljust(rest)[:rest], style(("mark", kind, second, selected, touched))),
                    *([notch] if notch else [])]
        if kind == 3:
            return [Segment("null".ljust(width)[:width], style(("mark", kind, None, selected, touched)))]
        filled = max(1, round(width * cell.fill / self.state.block_size)) if cell.fill else 0
        segments = []
        if filled:
            segments.append(Segment(WIDE_FILL * filled, style(("fill", kind, second, selected, touched))))
        if width - filled:
            segments.append(Segment(WIDE_EMPTY * (width - filled), style(("fill", 0, None, selected, touched))))
        return segments

    # ------------------------------------------------------------------ selection

    def block_at(self, x: int, y: int) -> int | None:
        """The block under content offset (x, y), scroll included, if any (a zoomed-out cell's first)."""
        column, within = divmod(x, self.pitch)
        if within >= self.cell_width or column >= self._columns:
            return None
        where = self._row_of_line(y)
        if where is None:
            return None
        position = where[0] * self._columns + column
        if not 0 <= position < self.num_positions:
            return None
        return self._start + position * self._per_cell

    def select(self, number: int) -> None:
        if not self.num_blocks:
            return
        number = max(self._start, min(number, self._stop - 1))
        self.selected = number
        self.post_message(BlockSelected(self.device, number))

    def action_move(self, dx: int, dy: int) -> None:
        """Move the selection by cells: blocks, or a zoomed-out cell's first block."""
        if self.selected is None or self._position(self.selected) is None:
            self.select(self._start)
            return
        position = self._position(self.selected) + dx + dy * self._columns
        position = max(0, min(position, self.num_positions - 1))
        self.select(self._start + position * self._per_cell)

    def action_jump(self, number: int) -> None:
        self.select(self._start if number >= 0 else self._stop - 1)

    def zoom_to(self, start: int | None = None, stop: int | None = None) -> None:
        """Draw blocks `start` to `stop` (one cell per block when they are at most
        pool_zoom.MAX_BLOCK_CELLS, else zoomed out); no range: the whole pool."""
        self.zoom = None if start is None else (start, self.num_blocks if stop is None else stop)
        self.scroll_to(y=0, animate=False, immediate=True)
        self._relayout()
        self.refresh(layout=True)
        if self.selected is not None and self._position(self.selected) is not None:
            self.call_after_refresh(self._scroll_to_block, self.selected)

    def action_zoom_in(self) -> None:
        """Zoom into the cell of the selected block (the first cell when none is selected)."""
        if self._cells is None:
            return
        cell = self._position(self.selected) if self.selected is not None else None
        blocks = self._cells.blocks_of(cell or 0)
        self.zoom_to(blocks.start, blocks.stop)

    def action_zoom_out(self) -> None:
        self.zoom_to()

    def on_click(self, event: Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:
            return
        number = self.block_at(offset.x + self.scroll_offset.x, offset.y + self.scroll_offset.y)
        if number is not None:
            self.focus()
            self.select(number)

    @property
    def brought_into_view(self) -> frozenset[int]:
        """The blocks bring_into_view was last asked to show (its scroll runs after the next refresh)."""
        return self._in_view

    def bring_into_view(self, numbers: frozenset[int]) -> None:
        """Scroll so that the blocks a guide card names are on screen: all of them when their rows
        fit, else as many as fit. Done once per set of blocks, so the user's own scrolling stays."""
        if numbers == self._in_view or not numbers or not self.num_blocks or self.focused is not None:
            self._in_view = numbers
            return
        self._in_view = numbers

        def scroll() -> None:
            visible = max(1, self.scrollable_content_region.height // self.cell_height)
            first, last = min(numbers) // self._columns, max(numbers) // self._columns
            top = self.scroll_offset.y // self.cell_height
            if first >= top and last < top + visible:
                return  # already in view
            rows = [n // self._columns for n in numbers]  # the start that shows the most of them
            row = max(range(first, max(first, last - visible + 1) + 1),
                      key=lambda start: (sum(start <= r < start + visible for r in rows), -start))
            self.scroll_to(y=row * self.cell_height, animate=False, immediate=True)
            self._show_page()

        if self.zoom is not None or self.zoomed_out:  # a range or zoomed out: the cells of the blocks named
            numbers = frozenset(p for p in map(self._position, numbers) if p is not None)
            if not numbers:
                return
        self.call_after_refresh(scroll)

    def _scroll_to_block(self, number: int) -> None:
        position = self._position(number)
        if position is None:
            return
        row, column = divmod(position, self._columns)
        if self.focused is not None:
            return  # every focused row is drawn
        region = Region(column * self.pitch, row * self.cell_height, self.cell_width, self.cell_height)
        self.scroll_to_region(region, animate=False, immediate=True)

    def cell_region(self, number: int) -> Region | None:
        """Where on the screen the cell drawing block `number` is, when it is wholly inside this
        pool's visible content (scroll and focus taken into account); None otherwise."""
        position = self._position(number) if self.num_blocks and self.display else None
        if position is None:
            return None
        row, column = divmod(position, self._columns)
        if self.focused is not None:
            if row not in self._focus_rows:
                return None
            line = self._focus_rows.index(row) * self.cell_height
        else:
            line = row * self.cell_height - int(self.scroll_offset.y)
        content = self.scrollable_content_region
        x = column * self.pitch
        if line < 0 or line + self.cell_height > content.height or x + self.cell_width > content.width:
            return None
        return Region(content.x + x, content.y + line, self.cell_width, self.cell_height)

    # ------------------------------------------------------------------ text for tests and screen readers

    def cell_text(self, number: int) -> str:
        """What the cell of block `number` shows (one line per cell row)."""
        block = self.state.pools[self.device][number]
        self._digits = self.digits
        cell = self._cell_big if self.big_cells else self._cell
        return "\n".join("".join(s.text for s in cell(block, sub)) for sub in range(self.cell_height))


class FreeQueueRow(Static):
    """vLLM v1's free queue in one line, head first: the blocks get_new_blocks takes next
    (view.free_queue); a cached one ('c', slate) loses its hash when taken. Hidden in a v0 run."""

    DEFAULT_CSS = """
    FreeQueueRow {
        height: 1;
        padding: 0 1;
        display: none;
    }
    """

    def show(self, state: ReducerState) -> None:
        queue = free_queue(state)
        self.display = queue is not None
        if queue is None:
            return
        text = Text("free queue ▸ ", "bold", no_wrap=True, overflow="ellipsis")
        if not queue.blocks:
            text.append("empty: every block is in use", "dim")
        for index, (number, cached) in enumerate(queue.blocks):
            style = CACHED_STYLE if cached else FREE_STYLE
            text.append(f"{number}{'c' if cached else ''}", style + QUEUE_HEAD_STYLE if index == 0 else style)
            text.append(" ")
        more = queue.num_free - len(queue.blocks)
        if more > 0:
            text.append(f"… +{more}", "dim")
        self.update(text)
