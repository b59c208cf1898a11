"""Trace files: header, round trip, replay == recording, and one-line errors through the CLI."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from blockviz.cli import main
from blockviz.commands.record import record_trace
from blockviz.model.timeline import Timeline, state_equal
from blockviz.session.spec import EngineSpec
from blockviz.model.trace import FORMAT_NAME, FORMAT_VERSION, TraceError, read_trace, write_trace
from blockviz.session.engine_session import trace_header
from test_tui_fake_engine import FakeEngine, run_scenario


def fake_recording(tmp_path: Path, **engine_kwargs):
    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi", "JULIET:"), n=2, max_tokens=6, seed=7)
    out = tmp_path / "run.jsonl"
    recording = record_trace(spec, out, engine=FakeEngine(**engine_kwargs))
    return out, recording


def test_record_writes_a_header_then_one_event_per_line(tmp_path):
    out, recording = fake_recording(tmp_path)
    lines = out.read_text().splitlines()
    header = json.loads(lines[0])
    assert header["format"] == FORMAT_NAME and header["version"] == 1  # one KV-cache group: version 1, as ever
    for key in ("blockviz_version", "model", "block_size", "num_gpu_blocks", "num_cpu_blocks",
                "enable_prefix_caching", "prompts", "n", "max_tokens", "seed"):
        assert key in header, key
    assert header["prompts"] == ["ROMEO: hi", "JULIET:"] and header["n"] == 2 and header["seed"] == 7
    assert len(lines) == 1 + recording.num_events
    assert all(json.loads(line)["type"] for line in lines[1:])
    assert not (tmp_path / "run.jsonl.part").exists()


def test_replaying_a_trace_to_its_end_equals_the_recorded_runs_state(tmp_path):
    out, recording = fake_recording(tmp_path, block_size=2, num_gpu_blocks=12, num_cpu_blocks=12)
    trace = read_trace(out)
    assert {"swap_out", "swap_in", "copy_on_write"} <= {e.type for e in trace.events}  # a rich run
    assert recording.num_steps < 60
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(timeline))
    assert state_equal(timeline.state, recording.state)


def test_round_trip_keeps_every_event(tmp_path):
    engine = FakeEngine(enable_prefix_caching=True)
    events = run_scenario(engine, ["abcdefgh1"], max_tokens=3)
    engine.add_request("abcdefgh2")  # after the first ran: its full blocks are computed, so they hit
    while engine.has_unfinished_requests():
        engine.step()
    path = tmp_path / "t.jsonl"
    write_trace(path, {"format": FORMAT_NAME, "version": 1, **trace_header(engine)}, events)
    trace = read_trace(path)
    assert trace.events == events
    assert "prefix_cache_hit" in {e.type for e in events}


# ---------------------------------------------------------------------------- bad input


def _bad(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _good_header(**override) -> str:
    header = {"format": FORMAT_NAME, "version": 1, "model": "fake", "block_size": 4, "num_gpu_blocks": 8,
              "num_cpu_blocks": 4}
    header.update(override)
    return json.dumps(header)


GOOD_EVENT = json.dumps({"type": "request_added", "seq_no": 0, "request_id": "0", "seq_ids": [0], "prompt": "hi",
                         "prompt_token_ids": [1, 2], "prompt_tokens_text": ["h", "i"], "n": 1, "max_tokens": 4})


@pytest.mark.parametrize("case, text, expected", ids=lambda v: v if isinstance(v, str) and len(v) < 20 else "", argvalues=[
    ("corrupted", _good_header() + "\n" + GOOD_EVENT + "\n{\"type\": \"block_allocated\", oops\n", "line 3"),
    ("unknown-event", _good_header() + "\n" + json.dumps({"type": "teleport", "seq_no": 0}) + "\n", "line 2"),
    ("block-outside-pool", _good_header() + "\n" + json.dumps(
        {"type": "block_evicted", "seq_no": 0, "device": "gpu", "block": 99, "block_hash": 1}) + "\n", "line 2"),
    ("newer", _good_header(version=FORMAT_VERSION + 1) + "\n", "upgrade blockviz"),
    ("not-a-trace", "hello world\n", "is not a blockviz trace"),
    ("json-not-a-trace", json.dumps({"format": "something-else"}) + "\n", "is not a blockviz trace"),
    ("empty", "", "is not a blockviz trace"),
    ("bad-header", _good_header(block_size="big") + "\n", "block_size"),
])
def test_bad_traces_fail_in_one_line_with_exit_2(tmp_path, capsys, case, text, expected):
    path = _bad(tmp_path, f"{case}.jsonl", text)
    with pytest.raises(TraceError, match=expected.replace("(", r"\(")):
        read_trace(path)
    assert main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and expected in err and "Traceback" not in err
    assert err.startswith("blockviz: error: ")


def test_missing_trace_file_fails_in_one_line(tmp_path, capsys):
    assert main(["replay", str(tmp_path / "nope.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err and "Traceback" not in err


def test_record_refuses_an_output_directory_that_does_not_exist(tmp_path, capsys):
    assert main(["record", "--out", str(tmp_path / "no" / "such" / "t.jsonl")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err


@pytest.mark.parametrize("fields, expected", [
    ({"kv_manager": "vllm", "async_scheduling": True}, True),
    ({"kv_manager": "vllm", "async_scheduling": False}, False),
    ({"kv_manager": "vllm"}, False),  # recorded before the field: the synchronous order it ran
    ({"kv_manager": "v1", "async_scheduling": True}, True),  # engine/v1 runs vLLM's asynchronous order too
    ({"kv_manager": "v1"}, False),  # recorded before engine/v1 had it: the synchronous order it ran
    ({"kv_manager": "v0", "async_scheduling": True}, False),  # a design without vLLM's asynchronous order
])
def test_the_header_says_which_scheduling_order_ran(tmp_path, fields, expected):
    path = _bad(tmp_path, "order.jsonl", _good_header(**fields) + "\n" + GOOD_EVENT + "\n")
    assert read_trace(path).async_scheduling is expected
