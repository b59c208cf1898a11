"""Hostile input, round three (issue 50, items 2-5): every trace the engine records loads (the vLLM
adapter emits each lifecycle event once; `record` reads its trace back through the checker before
it publishes it; a seeded fuzz of the v1 and vllm designs), and the trace checker refuses, in one
line each, what no engine emits. The limits are in docs/traces.md."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from blockviz.model.trace import TraceError, read_trace, resolve_trace_path

ROOT = Path(__file__).resolve().parents[1]
HYBRID = resolve_trace_path("hybrid")
CPU_TIER = resolve_trace_path("cpu-tier")
V1_STORY = resolve_trace_path("v1-story")
V0_PREFIX = resolve_trace_path("prefix-hit")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _first(lines: list[str], kind: str) -> int:
    return next(i for i, line in enumerate(lines) if i and json.loads(line)["type"] == kind)


def _edited(tmp_path: Path, source: Path, kind: str, **fields) -> Path:
    """`source` with the first `kind` event's fields replaced."""
    lines = _lines(source)
    index = _first(lines, kind)
    event = json.loads(lines[index])
    event.update(fields)
    lines[index] = json.dumps(event)
    return _write(tmp_path / "bad.jsonl", lines)


def _refused(path: Path, *expected: str) -> str:
    with pytest.raises(TraceError) as caught:
        read_trace(path)
    text = str(caught.value)
    assert "\n" not in text and len(text) < 400, text
    for part in expected:
        assert part in text, text
    return text


# ---------------------------------------------------------------- item 5: what no engine emits

def test_the_traces_these_cases_edit_load_as_shipped():
    for path in (HYBRID, CPU_TIER, V1_STORY, V0_PREFIX):
        assert read_trace(path).events


def test_blocks_skipped_listing_a_block_twice_is_refused(tmp_path):
    lines = _lines(HYBRID)
    event = json.loads(lines[_first(lines, "blocks_skipped")])
    doubled = _edited(tmp_path, HYBRID, "blocks_skipped", blocks=event["blocks"] * 2,
                      logical_indices=event["logical_indices"] * 2)
    _refused(doubled, "twice")


@pytest.mark.parametrize("num_tokens", [1 << 62, 0])
def test_offload_load_with_a_token_count_its_blocks_cannot_hold_is_refused(tmp_path, num_tokens):
    _refused(_edited(tmp_path, CPU_TIER, "offload_load", num_tokens=num_tokens), f"{num_tokens} tokens")


def test_offload_load_naming_another_request_is_refused(tmp_path):
    _refused(_edited(tmp_path, CPU_TIER, "offload_load", request_id="someone-else"), "someone-else", "request")


@pytest.mark.parametrize("medium", ["DISK", "x" * 1_000_000, ""])
@pytest.mark.parametrize("kind", ["offload_store", "offload_load"])
def test_an_offload_medium_not_the_tiers_is_refused_and_quoted_short(tmp_path, kind, medium):
    text = _refused(_edited(tmp_path, CPU_TIER, kind, medium=medium), "medium", "'CPU'")
    assert len(text) < 300


@pytest.mark.parametrize("source", [V1_STORY, V0_PREFIX, HYBRID])
@pytest.mark.parametrize("kind", ["offload_store", "offload_load"])
def test_offload_events_outside_a_vllm_run_with_a_tier_are_refused(tmp_path, source, kind):
    """An offload event moved into a v0 or v1 trace (renumbered, after the first request)."""
    tier = _lines(CPU_TIER)
    offload = json.loads(tier[_first(tier, kind)])
    lines = _lines(source)
    events = [json.loads(line) for line in lines[1:]]
    events.insert(1, offload)
    for number, event in enumerate(events):
        event["seq_no"] = number
    path = _write(tmp_path / "moved.jsonl", [lines[0], *map(json.dumps, events)])
    _refused(path, kind, "without a CPU tier", "line 3")


def test_a_header_window_wider_than_the_events_let_go_is_refused(tmp_path):
    lines = _lines(HYBRID)
    header = json.loads(lines[0])
    header["kv_cache_groups"][0]["sliding_window"] = 4096
    path = _write(tmp_path / "window.jsonl", [json.dumps(header), *lines[1:]])
    _refused(path, "window of 4096 tokens", f"line {_first(lines, 'blocks_skipped') + 1}")


@pytest.mark.parametrize("kind", ["request_added", "tokens_scheduled", "sequence_freed", "sequence_finished",
                                  "preempted", "step_started", "kv_digest", "token_generated"])
def test_a_group_field_on_an_event_of_no_group_is_refused(tmp_path, kind):
    _refused(_edited(tmp_path, HYBRID, kind, group=1), f"{kind} has no field 'group'")


def test_an_unknown_field_is_quoted_short(tmp_path):
    text = _refused(_edited(tmp_path, HYBRID, "request_added", **{"k" * 100_000: 1}), "has no field")
    assert len(text) < 300
