"""SVG snapshots of the main screen (pytest-textual-snapshot): 80x24 with `blockviz run`'s default
pool (64 GPU / 32 CPU blocks) and a block selected, 200x60, the same app resized 200x60 -> 80x24 ->
200x60 (the pools re-laid in the frame after each resize), and projector mode.

Deterministic: FakeEngine traces (fixed events), `deterministic=True` (no tokens/s), no clock, no
focused text input (so no blinking cursor). Update with `pytest --snapshot-update` after a
deliberate change to the look, and review the SVGs in the diff.
"""

from __future__ import annotations

from test_tui_app import fork_trace, n2_trace, replay_app, run_pool_trace


def test_main_screen_80x24(snap_compare):
    """Every panel in 80x24: the whole 64-block GPU pool and the CPU pool, the inspector of the
    selected block, a two-line status bar ending in what just happened, a footer that fits."""
    assert snap_compare(replay_app(run_pool_trace()), press=["s", "s", "s", "right"], terminal_size=(80, 24))


def test_main_screen_200x60_after_copy_on_write(snap_compare):
    app = replay_app(fork_trace())

    async def run_before(pilot) -> None:
        cow = next(i for i, e in enumerate(app.trace.events) if e.type == "copy_on_write")
        app.player.timeline.seek(cow + 1)
        app.render_views()

    assert snap_compare(app, run_before=run_before, terminal_size=(200, 60))


def _resized(*sizes):
    async def run_before(pilot) -> None:
        await pilot.press("s", "s", "s", "right")
        for size in sizes:
            await pilot.resize_terminal(*size)
            await pilot.pause()

    return run_before


def test_resized_from_200x60_to_80x24(snap_compare):
    """Small cells and 8 columns at once, as if the app had started at 80x24."""
    assert snap_compare(replay_app(run_pool_trace()), run_before=_resized((80, 24)), terminal_size=(200, 60))


def test_resized_200x60_to_80x24_and_back(snap_compare):
    """Big cells again, every block shown (none hidden by the previous size's cell mode)."""
    assert snap_compare(replay_app(run_pool_trace()), run_before=_resized((80, 24), (200, 60)),
                        terminal_size=(200, 60))


def test_projector_100x30(snap_compare):
    assert snap_compare(replay_app(n2_trace(), projector=True), press=["s", "s", "s"], terminal_size=(100, 30))
