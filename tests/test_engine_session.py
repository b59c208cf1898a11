"""The engine session (blockviz/session/engine_session.py): the one driver of an engine in blockviz/.
Its commands under vLLM's names, a scenario's arrivals, the K/V digest policy, the buffered event
stream, refusals as one line; a recording through it equals the shipped traces' events; the
notebook plays the default story through it; and no other module of blockviz/ steps an engine."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from blockviz.commands.record import record_trace
from blockviz.model.reducer import ReducerState
from blockviz.model.trace import load_trace, read_trace
from blockviz.session.engine_session import CommandRefused, EngineSession
from blockviz.session.scenario import DEFAULT_SCENARIO, Arrival
from blockviz.session.spec import EngineSpec
from engine import events as ev
from test_tui_fake_engine import FakeEngine

ROOT = Path(__file__).resolve().parent.parent


def _fake_session(**spec_options) -> EngineSession:
    spec = EngineSpec.of(model="fake", **{"prompts": ("ROMEO: hi",), "max_tokens": 6, **spec_options})
    return EngineSession(spec, engine=FakeEngine(block_size=4, num_gpu_blocks=24, num_cpu_blocks=8))


def _kinds(events) -> list[type]:
    return [type(e) for e in events]


def test_only_the_session_calls_engine_step():
    steppers = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "blockviz").rglob("*.py")
                      if re.search(r"\bengine\.step\(", path.read_text(encoding="utf-8")))
    assert steppers == ["blockviz/session/engine_session.py"]


def test_the_session_layer_imports_only_the_model_layer_and_the_engine():
    imports = re.compile(r"^\s*(?:from|import)\s+(blockviz\.\w+|blockviz\b)", re.MULTILINE)
    seen = set()
    for path in (ROOT / "blockviz" / "session").glob("*.py"):
        for name in imports.findall(path.read_text(encoding="utf-8")):
            assert name in ("blockviz.session", "blockviz.model", "blockviz.errors"), (path.name, name)
            seen.add(name)
    assert {"blockviz.session", "blockviz.model"} <= seen


def test_the_session_buffers_the_events_until_taken_and_close_unsubscribes():
    session = _fake_session()
    engine = session.engine
    assert engine.events.num_subscribers == 1 and session.num_buffered == 0
    (request_id,) = session.start()
    first = session.take_events()
    assert _kinds(first)[0] is ev.RequestAdded and first[0].request_id == request_id
    assert session.take_events() == [] and session.num_buffered == 0
    session.step()
    batch = session.take_events()
    assert ev.StepFinished in _kinds(batch) and batch[0].seq_no == first[-1].seq_no + 1  # nothing lost
    session.close()
    assert engine.events.num_subscribers == 0


def test_run_to_completion_delivers_every_event_and_keeps_each_finished_output():
    session = _fake_session(prompts=("ROMEO: hi", "JULIET: so"), n=2)
    request_ids = session.start()
    batches: list = []
    steps_seen: list[int] = []
    taken = session.run_to_completion(on_events=batches.append, progress=steps_seen.append)
    events = [e for batch in batches for e in batch]
    assert [e.seq_no for e in events] == list(range(len(events)))  # the prompts' events, then each step's
    assert taken == session.num_steps == steps_seen[-1] and steps_seen == list(range(1, taken + 1))
    assert not session.has_unfinished_requests()
    header = session.header
    state = ReducerState(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"]).apply_all(events)
    assert state.num_used("gpu") == 0 and {s.status for s in state.seqs.values()} == {"finished"}
    assert sorted(state.requests) == sorted(request_ids)


def test_run_to_completion_stops_at_max_steps_with_work_left():
    session = _fake_session(max_tokens=30)
    session.start()
    assert session.run_to_completion(3) == 3 and session.has_unfinished_requests()


def test_arrivals_join_as_the_engine_steps_or_at_once_when_it_is_idle():
    arrivals = (Arrival(0, "ROMEO: a"), Arrival(2, "JULIET: b", n=2), Arrival(500, "HAMLET: c"))
    session = _fake_session(prompts=(), arrivals=arrivals, max_tokens=4)
    assert session.start() == ["0"]  # only the one due before the first step
    added_at: dict[str, int] = {}

    def note(batch) -> None:
        for event in batch:
            if isinstance(event, ev.RequestAdded):
                added_at[event.prompt] = session.num_steps

    session.run_to_completion(on_events=note)
    assert added_at["JULIET: b"] == 2  # after two steps
    assert 2 < added_at["HAMLET: c"] < 500  # the engine went idle long before step 500
    assert session.engine.groups["1"].sampling_params.n == 2


def test_live_commands_have_vllms_names_and_act_between_steps():
    session = _fake_session(max_tokens=8)
    session.start()
    session.step()
    session.take_events()
    child = session.fork(0)
    assert _kinds(session.take_events()) == [ev.Forked] and child == 1
    session.preempt("0")
    moved = session.take_events()
    assert _kinds(moved)[:2] == [ev.Preempted, ev.SwappedOut]
    request_id = session.add_request("JULIET: more", n=2)
    (added,) = session.take_events()
    assert isinstance(added, ev.RequestAdded) and added.request_id == request_id and added.n == 2


@pytest.mark.parametrize("command, args, says", [
    ("fork", (99,), "fork sequence 99: sequence 99 is not running"),
    ("preempt", ("7",), "swap out request 7: request 7 is not running"),
    ("add_request", ("",), "add a request: "),
])
def test_a_refused_command_is_one_line_saying_what_then_why(command, args, says):
    session = _fake_session()
    session.start()
    with pytest.raises(CommandRefused) as refused:
        getattr(session, command)(*args)
    assert str(refused.value).startswith(says) and "\n" not in str(refused.value)
    assert isinstance(refused.value, ValueError)


def test_start_refuses_a_bad_prompt_before_queueing_any():
    session = _fake_session(prompts=("ROMEO: hi", ""))
    with pytest.raises(ValueError, match="the prompt is empty"):
        session.start()
    assert session.take_events() == [] and not session.engine.has_unfinished_requests()


# ---------------------------------------------------------------------------- on the real engine


@pytest.fixture(scope="module")
def loaded(tiny_gpt2_dir):
    from engine.model_loader import load_model

    return load_model(str(tiny_gpt2_dir), "cpu")


def _real_session(tiny_gpt2_dir, loaded, **options) -> EngineSession:
    from engine import LLMEngine

    spec = EngineSpec.of(**{"model": str(tiny_gpt2_dir), "prompts": ("To be, or not to be", "The quick brown fox"),
                            "max_tokens": 8, "block_size": 4, "num_gpu_blocks": 32, "num_cpu_blocks": 16,
                            "device": "cpu", **options})
    return EngineSession(spec, engine=LLMEngine(spec.config, loaded=loaded))


def _digests(events) -> list[ev.KVDigest]:
    return [e for e in events if isinstance(e, ev.KVDigest)]


def test_held_back_digests_come_with_each_batch_taken_and_per_step_again_when_turned_on(tiny_gpt2_dir, loaded):
    session = _real_session(tiny_gpt2_dir, loaded)
    engine = session.engine
    session.start()
    session.take_events()
    session.digest_per_step(False)
    assert engine.kv_digests_per_step is False
    for _ in range(3):
        session.step()
    held = session._buffer[:]
    assert held and _digests(held) == []  # three steps, nothing hashed yet
    batch = session.take_events()
    digests = _digests(batch)
    assert batch[:len(held)] == held and batch[len(held):] == digests  # the batch ends with them
    blocks = [d.block for d in digests]
    assert len(blocks) == len(set(blocks))  # each block written hashed once, as it is now
    assert [d.digest for d in digests] == engine.cache_engine.kv_digests("gpu", blocks)
    session.step()
    session.digest_per_step(True)  # what was held back goes out now
    assert engine.kv_digests_per_step is True and _digests(session.take_events())
    session.step()
    last = session.take_events()
    assert isinstance(last[-1], ev.StepFinished) and _digests(last)  # per step: within the step


def test_the_session_header_is_the_engines_settings_and_pools(tiny_gpt2_dir, loaded):
    header = _real_session(tiny_gpt2_dir, loaded, enable_prefix_caching=True, preemption_mode="swap").header
    assert header["model"] == str(tiny_gpt2_dir) and header["block_size"] == 4
    assert (header["num_gpu_blocks"], header["num_cpu_blocks"]) == (32, 16)
    assert header["enable_prefix_caching"] is True and header["preemption_mode"] == "swap"
    assert header["budget_source"] == "explicit" and header["block_bytes"] > 0 and header["device"] == "cpu"


def test_the_session_fills_in_the_prompt_token_texts_the_engine_leaves_out():
    """The engine emits a request's prompt token ids only; what the views show (and a trace keeps)
    comes through the session with each token's text, BPE space markers decoded."""
    from engine import LLMEngine
    from engine.config import EngineConfig

    engine = LLMEngine(EngineConfig(model="tiny-shakespeare", block_size=16, num_gpu_blocks=16, device="cpu"))
    raw: list = []
    engine.events.subscribe(raw.append)
    session = EngineSession(EngineSpec(engine.config, prompts=("JULIET:\nO Romeo, Romeo, wherefore art thou",)),
                            engine=engine)
    session.start()
    (added,) = [e for e in session.take_events() if isinstance(e, ev.RequestAdded)]
    assert raw[0].prompt_tokens_text == () and raw[0].prompt_token_ids == added.prompt_token_ids
    assert len(added.prompt_tokens_text) == len(added.prompt_token_ids) > 5
    assert "".join(added.prompt_tokens_text) == added.prompt
    assert not any("Ġ" in piece or "Ċ" in piece for piece in added.prompt_tokens_text)
    assert added.seq_no == raw[0].seq_no  # the same event, its texts filled in


def _make_traces():
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import make_traces
    finally:
        sys.path.pop(0)
    return make_traces


def _comparable(event: ev.Event) -> dict:
    """An event less what differs between two machines by nature: a step's wall time, and a K/V
    digest's value (floating-point sums round differently on another CPU or thread count)."""
    fields = event.to_dict()
    fields.pop("duration_s", None)
    fields.pop("digest", None)
    return fields


@pytest.mark.parametrize("name", ["prefix-hit", "eviction"])
def test_a_recording_through_the_session_equals_the_shipped_trace(name, tmp_path):
    make_traces = _make_traces()
    (scenario,) = [s for s in make_traces.SCENARIOS if s.name == name]
    spec = EngineSpec.of(model="tiny-shakespeare", device="cpu", seed=0, **scenario.spec)

    def between_steps(session, steps_done: int) -> None:
        if steps_done in scenario.later_prompts:
            session.add_request(scenario.later_prompts[steps_done])

    recording = record_trace(spec, tmp_path / f"{name}.jsonl", between_steps=between_steps)
    recorded, shipped = read_trace(tmp_path / f"{name}.jsonl"), load_trace(name)
    assert recording.num_events == len(shipped.events)
    assert [_comparable(e) for e in recorded.events] == [_comparable(e) for e in shipped.events]
    assert {k: v for k, v in recorded.header.items() if k not in ("scenario", "description", "later_prompts")} \
        == {k: v for k, v in shipped.header.items() if k not in ("scenario", "description", "later_prompts")}


def test_the_notebook_plays_the_default_story_as_a_recording_of_it_does(tiny_gpt2_dir, tmp_path):
    pytest.importorskip("ipywidgets")
    from blockviz.jupyter import Visualizer

    viz = Visualizer.live({"model": str(tiny_gpt2_dir), "device": "cpu"}, scenario="story")
    try:
        added = [e for e in viz.events if isinstance(e, ev.RequestAdded)]
        assert [e.prompt for e in added] == [DEFAULT_SCENARIO[0].prompt]  # the rest arrive as it steps
        assert viz.header["block_size"] == 4 and viz.header["num_gpu_blocks"] == 48  # the story's pool
        outputs = viz.run_to_completion()
        assert len(outputs) == len(DEFAULT_SCENARIO) and viz.finished
        assert [len(o.outputs) for o in outputs] == [a.n for a in DEFAULT_SCENARIO]
        recorded = read_trace(_record_story(tiny_gpt2_dir, tmp_path))
        assert [_comparable(e) for e in viz.events] == [_comparable(e) for e in recorded.events]
    finally:
        viz.close()


def _record_story(tiny_gpt2_dir, tmp_path) -> Path:
    out = tmp_path / "story.jsonl"
    record_trace(EngineSpec.for_scenario("story", model=str(tiny_gpt2_dir), device="cpu"), out)
    return out


def test_an_unknown_scenario_is_named_with_the_known_ones():
    with pytest.raises(ValueError, match="unknown scenario 'saga': the scenarios are story"):
        EngineSpec.for_scenario("saga")
