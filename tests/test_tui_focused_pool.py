"""Issue 45: below CARD_FOCUS_ROWS a guide card focuses the pools on the rows holding its blocks;
where the whole pool fits in the room its column leaves it, the pool is drawn whole (no block
hidden for nothing), and only where it does not fit are the other rows hidden."""

from __future__ import annotations

import pytest

from blockviz.model.trace import load_trace
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.pool_grid import PoolGrid
from test_tui_app import anyio_backend  # noqa: F401 (the fixture)

pytestmark = pytest.mark.anyio


async def _focused_cards(name: str, size: tuple[int, int], projector: bool):
    """(card, grid, whole pool fits) for every focused pool at every card of shipped trace `name`."""
    app = BlockvizApp(trace=load_trace(name), deterministic=True, play=False, guided=True, projector=projector)
    found = []
    async with app.run_test(size=size) as pilot:
        timeline = app.player.timeline
        for card in app.player.scan_guide().cards:
            timeline.seek(card.position)
            app.render_views()
            await pilot.pause()
            await pilot.pause()
            for grid in app.query(PoolGrid):
                if not grid.display or grid.focused is None:
                    continue
                rows = -(-grid.num_positions // grid.columns)
                fits = rows * grid.cell_height <= grid._room()
                shown = {n for n in range(grid.num_blocks) if grid.cell_region(n) is not None}
                found.append((card, grid.device, fits, shown, grid.num_blocks, str(grid.border_subtitle)))
    return found


@pytest.mark.parametrize("size", [(80, 24), (100, 30)], ids=["80x24", "100x30"])
@pytest.mark.parametrize("projector", [False, True], ids=["plain", "projector"])
async def test_a_focused_pool_is_drawn_whole_where_the_whole_pool_fits(size, projector):
    whole = cut = 0
    for name in ("v1-story", "hybrid"):
        for card, device, fits, shown, num_blocks, subtitle in await _focused_cards(name, size, projector):
            assert card.blocks_on(device) <= shown, (name, card.idea, device)  # the card's blocks, always
            if fits:
                assert shown == set(range(num_blocks)) and "hidden" not in subtitle, (name, card.idea, subtitle)
                whole += 1
            else:
                assert len(shown) < num_blocks and "blocks hidden" in subtitle, (name, card.idea, subtitle)
                cut += 1
    assert whole >= 3  # v1's 48 blocks fit beside each of its cards that names blocks, at 80x24 too
    if size == (80, 24):
        assert cut >= 2  # the hybrid story's tall cards leave too little room: the card's rows only
