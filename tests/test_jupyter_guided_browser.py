"""The notebook guides (issue 39 item 3), in a real browser: a guided Visualizer (a recorded story
is guided by default) played from the page stops on each card, draws the card under its controls
at the card's event, highlights the card's blocks on the pool canvases, and the "next idea ▸"
button goes from card to card. Fixtures: tests/jupyter_fixtures.py."""

from __future__ import annotations

import pytest

from jupyter_fixtures import UI_LIMIT_MS, kernel_json, open_notebook, run_all_cells, wait_for_visualizer
from story_fixtures import story_trace_path  # noqa: F401 (fixture)

CARD = ".bv-view-controls .bv-card"
STOPPED_ON_CARD = """() => {
    const controls = document.querySelector('.bv-view-controls');
    const card = document.querySelector('.bv-view-controls .bv-card');
    return controls.dataset.playing === 'false' && !card.hidden && card.dataset.position === controls.dataset.position;
}"""


def drawn_card(page) -> dict:
    """What the page shows of the card: its position, title line, the blocks it names, and the
    blocks each pool canvas outlines as touched."""
    return page.evaluate("""() => {
        const card = document.querySelector('.bv-view-controls .bv-card');
        const touched = {};
        for (const canvas of document.querySelectorAll('.bv-view-pool canvas.bv-pool-canvas'))
            touched[canvas.dataset.device] = (canvas.dataset.touched || '').split(',').filter((s) => s).map(Number);
        return { position: Number(card.dataset.position), title: card.querySelector('.bv-card-title').textContent,
                 blocks: card.dataset.blocks, touched,
                 at: Number(document.querySelector('.bv-view-controls').dataset.position) };
    }""")


@pytest.mark.parametrize("which", ["story", "v1-story"])
def test_the_page_plays_the_story_guided_stopping_on_each_card_with_its_blocks_outlined(
        which, jupyter_server, lab_page, story_trace_path):
    page = lab_page
    trace = str(story_trace_path) if which == "story" else "v1-story"
    path = jupyter_server.add_notebook(f"guided-{which}.ipynb", [
        f"from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace({trace!r})\nviz.set_speed('max')",
        "viz",
    ])
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page)
    cards = kernel_json(page, "[[c.position, c.title, [list(b) for b in c.blocks]] for c in viz.player.scan_guide().cards]")
    assert len(cards) >= 3
    assert page.is_visible(".bv-view-controls button[data-action='next_card']")
    page.wait_for_function(STOPPED_ON_CARD, timeout=UI_LIMIT_MS)  # it opens on what a KV cache is
    assert drawn_card(page)["title"].startswith(f"card 1 of {len(cards)}: What the cells are") and cards[0][0] == 0
    for number, (position, title, blocks) in enumerate(cards[1:], start=2):
        page.click(".bv-view-controls button[data-action='play']")
        page.wait_for_function(f"() => Number(document.querySelector('.bv-view-controls').dataset.position) >= {position}",
                               timeout=UI_LIMIT_MS)
        page.wait_for_function(STOPPED_ON_CARD, timeout=UI_LIMIT_MS)
        shown = drawn_card(page)
        assert shown["at"] == shown["position"] == position  # it stopped on the card's event, not past it
        assert shown["title"] == f"card {number} of {len(cards)}: {title}"
        for device, block in blocks:
            assert block in shown["touched"][device], (device, block, shown)
    page.click(".bv-view-controls button[data-action='start']")
    page.wait_for_function("() => document.querySelector('.bv-view-controls').dataset.position === '0'", timeout=UI_LIMIT_MS)
    for position, _, _ in cards[1:3]:  # the button goes card to card
        page.click(".bv-view-controls button[data-action='next_card']")
        page.wait_for_function(f"() => document.querySelector('.bv-view-controls').dataset.position === '{position}'",
                               timeout=UI_LIMIT_MS)
        page.wait_for_function(STOPPED_ON_CARD, timeout=UI_LIMIT_MS)
