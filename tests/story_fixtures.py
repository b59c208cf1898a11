"""The default story, recorded once per test session through the same code as `blockviz record`
(the story's arrivals and settings, on the bundled model `blockviz run` plays it on, on the CPU):
what the story tests replay; and `run_live`, a story as `blockviz run ARGS` plays it, with no UI."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def story_trace_path(tmp_path_factory, worker_id) -> Path:
    """The default story recorded live on the bundled model, once for the whole run: under
    pytest-xdist the first worker to need it records it (under a file lock) into the run's temp
    folder that every worker shares, and the others read that file."""
    from filelock import FileLock

    from blockviz.commands.record import record_trace
    from blockviz.session.spec import EngineSpec

    shared = tmp_path_factory.getbasetemp() if worker_id == "master" else tmp_path_factory.getbasetemp().parent
    out = shared / "live-story" / "story.jsonl"
    out.parent.mkdir(exist_ok=True)
    with FileLock(str(out) + ".lock"):
        if not out.is_file():  # record_trace renames the file into place only once it is whole
            record_trace(EngineSpec.for_scenario("story", device="cpu"), out)
    return out


def run_live(args: list[str]):
    """The spec `blockviz run ARGS` checks (blockviz/commands/run.py), run to completion in an
    engine session with no UI: (the session's header, every event)."""
    from blockviz.cli import build_parser
    from blockviz.commands.run import check
    from blockviz.session.engine_session import EngineSession

    session = EngineSession(check(build_parser().parse_args(["run", *args]), device=False))
    events: list = []
    try:
        session.start()
        session.run_to_completion(1000, on_events=events.extend)
    finally:
        session.close()
    return session.header, events


async def play_card_to_card(app, pilot, on_card=None) -> list:
    """Play a guided app (BlockvizApp, under `pilot`) with space at its fastest speed, card to card,
    to the end of its stream: the cards it stopped at, in order. At each stop the cursor is the
    card's position; `on_card(card)` checks the screen there (and returns True to stop early)."""
    from blockviz.model.player import SPEEDS
    from test_tui_app import _until

    app.player.speed_index = len(SPEEDS) - 1  # no waiting: the stops are what is under test
    timeline = app.player.timeline
    seen = []
    while not timeline.at_end:
        await pilot.press("space")
        await _until(pilot, lambda: not app.player.playing, timeout=30)
        await pilot.pause()
        card = app.player.card
        if card is None:
            break
        seen.append(card)
        assert timeline.position == card.position
        if on_card is not None and on_card(card):
            break
    return seen
