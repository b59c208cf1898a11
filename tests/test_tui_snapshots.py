"""SVG snapshots of the main screen (pytest-textual-snapshot), normal and projector mode.

Deterministic: a FakeEngine trace (fixed events), `deterministic=True` (no tokens/s), no clock, no
focused text input (so no blinking cursor). Update with `pytest --snapshot-update` after a
deliberate change to the look, and review the SVGs in the diff.
"""

from __future__ import annotations

from test_tui_app import fork_trace, n2_trace, replay_app


def test_main_screen_80x24(snap_compare):
    assert snap_compare(replay_app(n2_trace()), press=["s", "s", "s", "right"], terminal_size=(80, 24))


def test_main_screen_200x60_after_copy_on_write(snap_compare):
    app = replay_app(fork_trace())

    async def run_before(pilot) -> None:
        cow = next(i for i, e in enumerate(app.trace.events) if e.type == "copy_on_write")
        app.player.timeline.seek(cow + 1)
        app.render_views()

    assert snap_compare(app, run_before=run_before, terminal_size=(200, 60))


def test_projector_100x30(snap_compare):
    assert snap_compare(replay_app(n2_trace(), projector=True), press=["s", "s", "s"], terminal_size=(100, 30))
