"""Pools of any size: which blocks a zoomed-out cell covers, and the states of the blocks it holds.

The views were drawn one cell per block, for the 16-64 blocks of a lesson; vLLM sizes a GPU's pool
to hundreds of thousands of blocks (vLLM v1 `gpu_worker.determine_available_memory` and
`kv_cache_utils.get_num_blocks`), and `blockviz attach` meets pools that size too. A pool, or a
range of it (`start` to `stop`, the blocks a view is zoomed into), of at most MAX_BLOCK_CELLS
blocks is still drawn one cell per block; a bigger one is drawn zoomed out: a cell per
`per_cell` blocks (a power of two, at most MAX_ZOOM_CELLS cells), and each cell shows the mix
of states of the blocks it covers (`ZoomCells`):

- the bar, bottom up, is the share of its blocks in use (eighths; at least one eighth when any is
  used, at most seven when not all are);
- the ground under it is the state most of the other blocks are in: slate when cached-free (a
  prefix-cache hit can still revive them), empty when free, the null block's when only vLLM v1's
  null block is left.

The TUI (blockviz/tui/widgets/pool_grid.py), the notebook (the pool records of view.snapshot,
drawn by blockviz/jupyter/static/pool_canvas.js) and the SVG export (blockviz/model/svg.py) all
draw these records. Pure Python, no UI import; the states are view.block_state's rule.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from blockviz.model.reducer import CACHED_CODE, NULL_CODE, USED_CODE, ReducerState

MAX_BLOCK_CELLS = 4096  # a pool or range of at most this many blocks: one cell per block
MAX_ZOOM_CELLS = 1024  # a zoomed-out pool: at most this many cells, the whole pool on one screen
LEGEND = "bar: share of its blocks in use · ground: slate most of the rest cached, empty free"


def zoom_level(num_blocks: int, max_exact: int = MAX_BLOCK_CELLS, max_cells: int = MAX_ZOOM_CELLS) -> int:
    """Blocks per cell for a range of `num_blocks`: 1 when it has at most `max_exact`, else the
    smallest power of two that draws it in at most `max_cells` cells."""
    if num_blocks <= max_exact:
        return 1
    per_cell = 2
    while -(-num_blocks // per_cell) > max_cells:
        per_cell *= 2
    return per_cell


def cell_label(per_cell: int) -> str:
    """"1 cell = 256 blocks" ("1 cell = 1 block" drawn exactly)."""
    return f"1 cell = {per_cell:,} block{'s' if per_cell != 1 else ''}"


@dataclass(slots=True)
class ZoomCells:
    """A zoomed-out range of a pool: cell i covers blocks start + i * per_cell to the next cell's
    first (the last cell may cover fewer) and holds `used[i]`, `cached[i]`, `free[i]` and
    `null[i]` of them (each cell's four add up to the blocks it covers)."""

    start: int
    stop: int
    per_cell: int
    used: list[int]
    cached: list[int]
    free: list[int]
    null: list[int]

    @property
    def num_cells(self) -> int:
        return len(self.used)

    def blocks_of(self, cell: int) -> range:
        """The block numbers cell `cell` covers."""
        first = self.start + cell * self.per_cell
        return range(first, min(first + self.per_cell, self.stop))

    def cell_of(self, number: int) -> int | None:
        """The cell covering block `number`, None when it is outside the range."""
        return (number - self.start) // self.per_cell if self.start <= number < self.stop else None

    def look(self, cell: int) -> tuple[int, str]:
        """What cell `cell` draws: (eighths of its blocks in use, 0-8: at least 1 when any is, at
        most 7 when not all are; the ground: "cached" when more of the rest are cached than free,
        "null" when the rest is the null block alone, else "free")."""
        used, cached, free, null = self.used[cell], self.cached[cell], self.free[cell], self.null[cell]
        total = used + cached + free + null
        eighths = round(8 * used / total) if total else 0
        if used:
            eighths = max(1, eighths if used == total else min(7, eighths))
        ground = "cached" if cached > free else "null" if null and not (cached or free) else "free"
        return eighths, ground

    def codes(self) -> str:
        """One character per cell, the state most of its blocks are in (ties: used, cached, free,
        null): the pool's `data-states` when it is drawn zoomed out."""
        out = []
        for counts in zip(self.used, self.cached, self.free, self.null):
            out.append("ucfn"[counts.index(max(counts))])
        return "".join(out)

    def to_json(self) -> dict[str, Any]:
        """The counts per cell, and what each cell draws (look): `bars` a digit per cell (eighths
        in use), `grounds` a character per cell (c cached, n null, f free)."""
        looks = [self.look(cell) for cell in range(self.num_cells)]
        return {"used": self.used, "cached": self.cached, "free": self.free, "null": self.null,
                "bars": "".join(str(eighths) for eighths, _ in looks),
                "grounds": "".join(ground[0] for _, ground in looks)}


def cell_counts(codes: str, start: int, per_cell: int) -> ZoomCells:
    """Per cell of `per_cell` blocks, the blocks of each state in `codes` (the state codes of the
    blocks from `start`: ReducerState.block_codes): the one aggregation every front end draws."""
    used, cached, free, null = [], [], [], []
    for first in range(0, len(codes), per_cell):
        last = first + per_cell
        num_used, num_cached, num_null = (codes.count(USED_CODE, first, last), codes.count(CACHED_CODE, first, last),
                                          codes.count(NULL_CODE, first, last))
        used.append(num_used)
        cached.append(num_cached)
        null.append(num_null)
        free.append(min(last, len(codes)) - first - num_used - num_cached - num_null)
    return ZoomCells(start, start + len(codes), per_cell, used, cached, free, null)


def zoom_cells(state: ReducerState, device: str, start: int = 0, stop: int | None = None,
               per_cell: int | None = None) -> ZoomCells:
    """The cells of `device`'s pool from `start` to `stop` (default: the whole pool), `per_cell`
    blocks each (default: zoom_level of the range), from the reducer's state codes."""
    stop = len(state.pools[device]) if stop is None else stop
    per_cell = per_cell or zoom_level(stop - start)
    return cell_counts(state.block_codes(device, start, stop), start, per_cell)


def check_range(start: int, stop: int, num_blocks: int) -> tuple[int, int]:
    """(start, stop) clipped to a pool of `num_blocks`, at least one block; ValueError when the
    range holds no block of the pool."""
    if not 0 <= start < num_blocks or stop <= start:
        raise ValueError(f"blocks {start}-{stop - 1} are not in a pool of {num_blocks:,} blocks (0-{num_blocks - 1})")
    return start, min(stop, num_blocks)


def parse_block_range(text: str, num_blocks: int) -> tuple[int, int]:
    """"START-END" (both included, as a pool names its blocks) as (start, stop) in a pool of
    `num_blocks`, or ValueError in one line."""
    first, _, last = text.partition("-")
    try:
        start, end = int(first), int(last)
    except ValueError:
        raise ValueError(f"a block range is START-END (block numbers, both included), got {text!r}") from None
    if end < start:
        raise ValueError(f"block range {text!r}: the end comes before the start")
    return check_range(start, end + 1, num_blocks)


def used_extent(timeline: Any, device: str = "gpu", multiple: int = 8) -> int:
    """How many of a run's blocks a side-by-side view needs (`blockviz compare`): one past the
    highest-numbered block in use or cached at the end of any of its steps, rounded up to `multiple`,
    at most the whole pool. A compare on a big default pool then draws the 11 blocks its runs use,
    not 2,048 empty cells. The timeline's cursor is put back."""
    position = timeline.position
    top = -1
    for end in sorted(set(timeline.step_ends) | {len(timeline)}):
        timeline.seek(end)
        codes = timeline.state.block_codes(device)
        top = max(top, max(codes.rfind(USED_CODE), codes.rfind(CACHED_CODE)))
    timeline.seek(position)
    size = len(timeline.state.pools[device])
    return min(size, max(multiple, -(-(top + 1) // multiple) * multiple))
