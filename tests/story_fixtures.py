"""The default story, recorded once per test session through the same code as `blockviz record`
(the story's arrivals and settings, on the bundled model `blockviz run` plays it on, on the CPU):
what the story tests replay."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def story_trace_path(tmp_path_factory) -> Path:
    from blockviz.commands.record import record_trace
    from blockviz.session.spec import EngineSpec

    out = tmp_path_factory.mktemp("story") / "story.jsonl"
    record_trace(EngineSpec.for_scenario("story", device="cpu"), out)
    return out
