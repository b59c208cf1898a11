"""The story `blockviz run` tells by default, recorded on the bundled model: a fork, a copy-on-write,
prefix-cache hits and a swap preemption; every request finished, every block free at the end."""

from __future__ import annotations

import argparse

from blockviz.commands.record import record_trace
from blockviz.commands.run import add_parser
from blockviz.session.spec import EngineSpec
from blockviz.session.scenario import DEFAULT_SCENARIO
from blockviz.model.trace import read_trace


def _run_spec(*argv: str) -> EngineSpec:
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers(dest="command"))
    return EngineSpec.from_args(parser.parse_args(["run", *argv]), default_arrivals=DEFAULT_SCENARIO)


def test_run_defaults_play_the_scenario_and_every_flag_overrides():
    spec = _run_spec()
    assert spec.arrivals == DEFAULT_SCENARIO and spec.prompts == ()
    assert spec.config.enable_prefix_caching and spec.temperature == 0.8 and spec.config.block_size == 4
    spec = _run_spec("--prompt", "KV", "--no-prefix-caching", "--temperature", "0", "--block-size", "16")
    assert spec.arrivals == () and spec.prompts == ("KV",)
    assert not spec.config.enable_prefix_caching and spec.temperature == 0.0 and spec.config.block_size == 16


def test_the_default_scenario_shows_every_idea_and_ends_clean(tmp_path):
    spec = _run_spec()
    recording = record_trace(spec, tmp_path / "scenario.jsonl")
    trace = read_trace(tmp_path / "scenario.jsonl")  # passes the load-time checks too
    kinds = [e.type for e in trace.events]
    for kind in ("fork", "copy_on_write", "prefix_cache_hit", "preempted", "swap_out", "swap_in"):
        assert kind in kinds, kind
    assert kinds.count("preempted") == 1  # the pool runs out once
    added = [e for e in trace.events if e.type == "request_added"]
    assert [e.prompt for e in added] == [a.prompt for a in DEFAULT_SCENARIO]
    # requests really arrive over time: the later ones after the first steps
    first_step = kinds.index("step_started")
    assert kinds.index("request_added") < first_step < trace.events.index(added[-1])
    state = recording.state
    finished = {e.seq_id for e in trace.events if e.type == "sequence_finished"}
    assert finished == set(state.seqs)
    assert all(s.finish_reason.split(":")[0] in ("length", "stop") for s in state.seqs.values())
    assert state.num_used("gpu") == 0 and state.num_used("cpu") == 0 and state.tables == {}
    # sampled at 0.8: the two samples of the n=2 request differ
    fork = next(e for e in trace.events if e.type == "fork")
    texts = ["".join(state.seqs[s].token_texts) for s in (fork.parent_seq_id, fork.child_seq_id)]
    assert texts[0] != texts[1]
