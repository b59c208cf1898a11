"""Hostile input, round three (issue 50, items 2-5): every trace the engine records loads (the vLLM
adapter emits each lifecycle event once; `record` reads its trace back through the checker before
it publishes it; a seeded fuzz of the v1 and vllm designs), and the trace checker refuses, in one
line each, what no engine emits. The limits are in docs/traces.md."""

from __future__ import annotations

import importlib.util
import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from blockviz.model.trace import TraceError, read_trace, resolve_trace_path
from engine.designs import VLLM, get_design
from test_hostile_inputs import _lines, _write

ROOT = Path(__file__).resolve().parents[1]
HYBRID = resolve_trace_path("hybrid")
CPU_TIER = resolve_trace_path("cpu-tier")
V1_STORY = resolve_trace_path("v1-story")
V0_PREFIX = resolve_trace_path("prefix-hit")


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


# ---------------------------------------------------------------- item 2: record publishes only what loads

def test_record_reads_its_trace_back_and_keeps_a_refused_one_aside(tmp_path, tiny_gpt2_dir, monkeypatch, capsys):
    """A checker that refuses the run's first sequence_finished (as it refused N1's second
    sequence_freed): `record` says which line fails in one line, exits 1, publishes nothing at --out
    and keeps the file as NAME.rejected.jsonl, which read_trace refuses the same way."""
    from blockviz.cli import main
    from blockviz.model import trace_check
    from engine import events as ev

    def refuse(checker, event):
        raise ValueError(f"seq {event.seq_id} is refused here")

    monkeypatch.setitem(trace_check._RULES, ev.SequenceFinished, refuse)
    out = tmp_path / "run.jsonl"
    code = main(["record", "--out", str(out), "--model", str(tiny_gpt2_dir), "--prompt", "ROMEO:", "--max-tokens", "3"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("blockviz: error")]
    assert code == 1 and len(err) == 1, err
    rejected = tmp_path / "run.rejected.jsonl"
    assert "is corrupted: seq 0 is refused here" in err[0] and repr(str(rejected)) in err[0], err[0]
    assert not out.exists() and rejected.is_file()
    assert [p.name for p in tmp_path.iterdir()] == [rejected.name]  # no .part left behind
    _refused(rejected, "seq 0 is refused here")


def test_record_publishes_a_trace_that_passes_its_check(tmp_path, tiny_gpt2_dir, capsys):
    from blockviz.cli import main

    out = tmp_path / "run.jsonl"
    assert main(["record", "--out", str(out), "--model", str(tiny_gpt2_dir), "--prompt", "ROMEO:",
                 "--max-tokens", "3"]) == 0
    assert "recorded" in capsys.readouterr().err and read_trace(out).events
    assert [p.name for p in tmp_path.iterdir()] == [out.name]


# ---------------------------------------------------------------- item 2: lifecycle events once, the fuzz

def _fuzz_traces():
    spec = importlib.util.spec_from_file_location("fuzz_traces", ROOT / "scripts" / "fuzz_traces.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fuzz_traces():
    pytest.importorskip("vllm", reason="vLLM 0.33 is not installed")
    return _fuzz_traces()


def test_a_waiting_request_left_an_empty_table_by_vllm_is_aborted_without_a_second_free(fuzz_traces, tmp_path):
    """vLLM's req_to_blocks is a defaultdict: SlidingWindowManager.remove_skipped_blocks, reached by
    allocate_slots for a preempted request that hits the cache past its window and still does not
    fit, leaves an empty entry. Aborting (or refusing) that waiting request ends no table: the tap
    emits no sequence_freed for it (N1 emitted one, and its trace failed to load)."""
    from blockviz.model.reducer import ReducerState
    from blockviz.model.trace import make_header, write_trace
    from blockviz.session.engine_session import trace_header
    from engine import SamplingParams
    from engine import events as ev
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    path, loaded = fuzz_traces.tiny_hybrid()
    engine = LLMEngine(EngineConfig(model=path, device="cpu", kv_manager="vllm", block_size=4, num_gpu_blocks=33,
                                    max_num_seqs=1), loaded=loaded)
    header = make_header(trace_header(engine))
    events: list = []
    engine.events.subscribe(events.append)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    engine.add_request("To be, or not to be", params)
    waiting = engine.add_request("that is the question", params)
    engine.step()
    (seq_id,) = engine._groups[waiting].seq_ids
    managers = engine.scheduler.vllm.kv_cache_manager.coordinator.single_type_managers
    for manager in managers:
        assert manager.req_to_blocks[str(seq_id)] == []  # the defaultdict's lookup, as vLLM's own
    engine.abort_request(waiting)
    while engine.has_unfinished_requests():
        engine.step()
    assert not [e for e in events if isinstance(e, ev.SequenceFreed) and e.seq_id == seq_id]
    assert [e.seq_id for e in events if isinstance(e, ev.SequenceFinished)].count(seq_id) == 1
    out = tmp_path / "aborted.jsonl"
    write_trace(out, header, events)
    assert read_trace(out).events[-1] == events[-1]
    assert ReducerState.from_header(header).apply_all(events).tables == {}


def _lifecycle_run(fuzz, tmp_path: Path, kv_manager: str, drive, max_num_seqs: int = 2) -> list:
    """tiny-hybrid under `kv_manager` with a pool of 4 blocks per group and a budget of 8 tokens, driven
    by `drive(engine, events)` (which adds requests and steps), the reducer checked against the
    engine after every step; then each lifecycle event once (fuzz_traces.check_lifecycle, one
    sequence_finished and one request_added each) and the trace written loads to the same state."""
    if get_design(kv_manager).requires:
        pytest.importorskip(get_design(kv_manager).requires)
    from blockviz.model.reducer import ReducerState
    from blockviz.model.safe_text import safe_struct
    from blockviz.model.trace import make_header, write_trace
    from blockviz.session.engine_session import trace_header
    from engine import events as ev
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine
    from reducer_checks import check_reducer_matches_v1

    path, loaded = fuzz.tiny_hybrid()
    engine = LLMEngine(EngineConfig(model=path, device="cpu", kv_manager=kv_manager, block_size=4, num_gpu_blocks=9,
                                    max_num_seqs=max_num_seqs, max_num_batched_tokens=8), loaded=loaded)
    header = make_header(trace_header(engine))
    reducer = ReducerState.from_header(header)
    events: list = []
    engine.events.subscribe(lambda event: events.append(safe_struct(event)))
    engine.events.subscribe(lambda event: reducer.apply(events[-1]))
    real_step = engine.step

    def step():
        real_step()
        if get_design(kv_manager) is VLLM:
            fuzz.check_reducer_matches_vllm(reducer, engine.scheduler.vllm)
        else:
            check_reducer_matches_v1(reducer, engine.kv_manager)

    engine.step = step
    drive(engine, events)
    assert not engine.has_unfinished_requests() and not engine.events.errors, engine.events.errors
    fuzz.check_lifecycle(events)
    added = Counter(e.request_id for e in events if isinstance(e, ev.RequestAdded))
    finished = Counter(e.seq_id for e in events if isinstance(e, ev.SequenceFinished))
    assert set(added.values()) == {1} and set(finished.values()) == {1}
    assert sorted(finished) == sorted(s for e in events if isinstance(e, ev.RequestAdded) for s in e.seq_ids)
    out = tmp_path / f"{kv_manager}.jsonl"
    write_trace(out, header, events)
    trace = read_trace(out)
    assert ReducerState.from_header(trace.header).apply_all(trace.events).freeze() == reducer.freeze()
    return events


def _finishes(events) -> dict[int, str]:
    from engine import events as ev

    return {e.seq_id: e.reason for e in events if isinstance(e, ev.SequenceFinished)}


def _preempted(events) -> list[int]:
    from engine import events as ev

    return [seq_id for e in events if isinstance(e, ev.Preempted) for seq_id in e.seq_ids]


def _params(max_tokens: int):
    from engine import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)


def _to_the_end(engine) -> None:
    for _ in range(500):
        if not engine.has_unfinished_requests():
            return
        engine.step()
    raise AssertionError("the run did not finish in 500 steps")


@pytest.mark.parametrize("kv_manager", ["v1", "vllm"])
def test_a_request_refused_after_it_was_preempted_finishes_and_is_freed_once(tmp_path, kv_manager):
    """N1's path: two requests outgrow a pool of 4 blocks per group while decoding; each is
    preempted and, once it cannot be admitted even into an empty pool, refused."""
    def drive(engine, events):
        for prompt in ("ROMEO: But soft", "JULIET: O Romeo"):
            engine.add_request(prompt, _params(40))
        _to_the_end(engine)

    events = _lifecycle_run(_fuzz_traces(), tmp_path, kv_manager, drive)
    refused = {seq_id for seq_id, reason in _finishes(events).items() if reason == "ignored"}
    assert refused & set(_preempted(events)), (_finishes(events), _preempted(events))


@pytest.mark.parametrize("kv_manager", ["v1", "vllm"])
def test_an_abort_of_a_preempted_request_finishes_it_once_and_frees_nothing_twice(tmp_path, kv_manager):
    def drive(engine, events):
        from engine import events as ev

        request_of = {}
        for prompt in ("ROMEO: But soft", "JULIET: O Romeo"):
            request_id = engine.add_request(prompt, _params(40))
            request_of.update({seq_id: request_id for seq_id in engine._groups[request_id].seq_ids})
        for _ in range(500):
            engine.step()
            preempted = [seq_id for e in events if isinstance(e, ev.Preempted) for seq_id in e.seq_ids]
            if preempted:
                engine.abort_request(request_of[preempted[0]])
                break
        _to_the_end(engine)

    events = _lifecycle_run(_fuzz_traces(), tmp_path, kv_manager, drive)
    first = _preempted(events)[0]
    assert _finishes(events)[first] == "abort"


@pytest.mark.parametrize("kv_manager", ["v1", "vllm"])
def test_requests_that_finish_while_waiting_emit_each_event_once(tmp_path, kv_manager):
    """One request runs; one waits behind it and is aborted before it is ever scheduled; one
    whose prompt no pool of this size holds is refused at the head of the queue."""
    def drive(engine, events):
        engine.add_request("ROMEO: But soft", _params(4))
        waiting = engine.add_request("JULIET: O Romeo", _params(4))
        engine.add_request("ROMEO: " * 12, _params(4))
        engine.step()
        assert engine.is_unfinished(waiting)
        engine.abort_request(waiting)
        _to_the_end(engine)

    events = _lifecycle_run(_fuzz_traces(), tmp_path, kv_manager, drive, max_num_seqs=1)
    assert sorted(_finishes(events).values()) == ["abort", "ignored", "length"], _finishes(events)
    assert not _preempted(events)


# Seeds whose drawn configurations cover both designs, tiny-hybrid's groups, chunked prefill and
# preemption (test_the_suites_seeds_cover_what_the_fuzz_is_for checks what they drew).
SUITE_SEEDS = (3, 7, 10, 11)


def test_the_suites_seeds_cover_what_the_fuzz_is_for(fuzz_traces):
    drawn = [fuzz_traces.draw(seed) for seed in SUITE_SEEDS]
    assert {c.kv_manager for c in drawn} == {"v1", "vllm"}
    assert any(c.max_num_batched_tokens for c in drawn) and any(c.n > 1 for c in drawn)
    assert [fuzz_traces.draw(seed) for seed in SUITE_SEEDS] == drawn  # seeded: the same draw each time


def test_fuzzed_runs_record_traces_that_load_with_the_reducer_equal_to_the_engine(fuzz_traces, tmp_path):
    """Each suite seed's run passes every check of fuzz_one; together they preempt, prefill in
    chunks, let window blocks go, abort and refuse requests (the paths N1 and its siblings took)."""
    covered = Counter()
    for seed in SUITE_SEEDS:
        config = fuzz_traces.draw(seed)
        config.max_tokens = min(config.max_tokens, 24)  # bounded in time: each run stays a few dozen steps
        done = fuzz_traces.fuzz_one(config, tmp_path)
        assert done["steps"] > 0
        covered.update({what for what, number in done.items() if number})
    assert {"preemptions", "chunked_prefills", "skipped_blocks", "aborts", "refusals"} <= set(covered), covered


# ---------------------------------------------------------------- item 3: a pool past memory is one line

@pytest.fixture(scope="module")
def loaded(tiny_gpt2_dir):
    from engine.model_loader import load_model

    return load_model(str(tiny_gpt2_dir), "cpu", None)


def _engine(loaded, path, **options):
    from engine.config import EngineConfig
    from engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(path), device="cpu", **options), loaded=loaded)


@pytest.mark.parametrize("kv_manager", ["v0", "v1", "vllm"])
def test_a_device_pool_past_memory_is_one_line_under_every_design(loaded, tiny_gpt2_dir, kv_manager):
    if get_design(kv_manager).requires:
        pytest.importorskip(get_design(kv_manager).requires)
    with pytest.raises(ValueError) as caught:
        _engine(loaded, tiny_gpt2_dir, kv_manager=kv_manager, num_gpu_blocks=10**9, max_num_seqs=8)
    text = str(caught.value)
    assert "\n" not in text and "device pool of 1,000,000,000 blocks" in text and "--num-gpu-blocks" in text, text


def test_a_swap_pool_past_memory_is_one_line(loaded, tiny_gpt2_dir):
    with pytest.raises(ValueError, match=r"CPU pool of 1,000,000,000,000 blocks needs .* lower --num-cpu-blocks"):
        _engine(loaded, tiny_gpt2_dir, kv_manager="v0", num_gpu_blocks=8, num_cpu_blocks=10**12)


def test_a_cpu_pool_past_an_address_space_limit_is_one_line(monkeypatch):
    """`ulimit -v` counts: what is left under RLIMIT_AS bounds the CPU pool."""
    import resource

    import torch

    from engine import mem_utils

    monkeypatch.setattr(resource, "getrlimit", lambda which: (1 << 30, resource.RLIM_INFINITY)
                        if which == resource.RLIMIT_AS else (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert mem_utils.available_bytes(torch.device("cpu")) < 1 << 30
    with pytest.raises(ValueError, match="more than the .* free on cpu"):
        mem_utils.check_pool_fits("CPU pool", 2048, 1 << 20, torch.device("cpu"), "--num-cpu-blocks")


@pytest.mark.parametrize("size, expected", [(1e12, "CPU pool of"), (1e-12, "holds 0 blocks")])
def test_a_cpu_tier_past_memory_or_of_no_block_is_refused_at_start(loaded, tiny_gpt2_dir, size, expected):
    pytest.importorskip("vllm")
    with pytest.raises(ValueError) as caught:
        _engine(loaded, tiny_gpt2_dir, kv_manager="vllm", num_gpu_blocks=16, max_num_seqs=8,
                vllm_options={"kv_offloading_size": size})
    text = str(caught.value)
    assert "\n" not in text and expected in text, text


@pytest.mark.parametrize("command", ["generate", "record"])
def test_generate_and_record_say_a_pool_past_memory_in_one_line_exit_2(tmp_path, tiny_gpt2_dir, capsys, command):
    from blockviz.cli import main

    argv = [command, "--model", str(tiny_gpt2_dir), "--num-gpu-blocks", "1000000000", "--prompt", "ROMEO:",
            "--max-tokens", "2"]
    code = main(argv + (["--out", str(tmp_path / "run.jsonl")] if command == "record" else []))
    err = [line for line in capsys.readouterr().err.splitlines() if "error" in line]
    assert code == 2 and len(err) == 1 and "device pool of 1,000,000,000 blocks" in err[0], err
    assert not list(tmp_path.iterdir())


# ---------------------------------------------------------------- item 3: --vllm-option

def test_a_budget_option_alone_caps_the_engines_max_num_seqs(loaded, tiny_gpt2_dir):
    """docs/vllm-core.md: max_num_seqs is capped at the token budget, the option's too."""
    pytest.importorskip("vllm")
    engine = _engine(loaded, tiny_gpt2_dir, kv_manager="vllm", num_gpu_blocks=16,
                     vllm_options={"max_num_batched_tokens": 16})
    scheduler_config = engine.vllm_config.scheduler_config
    assert (scheduler_config.max_num_batched_tokens, scheduler_config.max_num_seqs) == (16, 16)


@pytest.mark.parametrize("options, named", [
    ({"max_num_seqs": 64, "max_num_batched_tokens": 16}, ("max_num_seqs=64", "max_num_batched_tokens=16")),
    ({"enable_chunked_prefill": False, "max_num_batched_tokens": 16}, ("max_model_len=128", "enable_chunked_prefill=False")),
])
def test_a_cross_field_refusal_names_the_values_in_force(loaded, tiny_gpt2_dir, options, named):
    pytest.importorskip("vllm")
    from engine.vllm_core.config import check_options

    check_options(options)  # no model yet: only each field alone
    with pytest.raises(ValueError) as caught:
        _engine(loaded, tiny_gpt2_dir, kv_manager="vllm", num_gpu_blocks=16, vllm_options=options)
    text = str(caught.value)
    assert "\n" not in text and "?" not in text and "1048576" not in text, text
    assert text.startswith("vLLM refused the options together") and all(part in text for part in named), text


@pytest.mark.parametrize("text, expected", [
    ("watermark=" + "[" * 5000 + "]" * 5000, "characters long"),
    ("watermark=" + "[" * 2000 + "]" * 2000, "more than 64 lists or objects"),
    ("policy=" + "x" * 100_000, "characters long"),
    ("k" * 100_000, "takes KEY=VALUE"),
], ids=["5000-deep", "2000-deep", "100-KB-value", "100-KB-key"])
def test_a_vllm_option_is_bounded_before_it_is_parsed(capsys, text, expected):
    from blockviz.cli import main

    with pytest.raises(SystemExit) as caught:  # argparse's one line, exit 2
        main(["generate", "--kv-manager", "vllm", "--vllm-option", text])
    err = capsys.readouterr().err.strip().splitlines()
    assert caught.value.code == 2 and len(err[-1]) < 400 and expected in err[-1], err[-1][:500]
    assert "Traceback" not in "\n".join(err)


def test_a_long_unknown_option_name_is_cut_in_its_line():
    pytest.importorskip("vllm")
    from engine.vllm_core.config import check_options

    with pytest.raises(ValueError) as caught:
        check_options({"k" * 100_000: 1})
    assert "unknown vllm option" in str(caught.value) and len(str(caught.value)) < 300


# ---------------------------------------------------------------- item 3: config.json checked before transformers

def _checkpoint(tmp_path: Path, **changes) -> Path:
    """tiny-hybrid's checkpoint copied, its config.json changed (a value None removes nothing: it is written)."""
    import shutil

    from blockviz.session.tiny_hybrid import tiny_hybrid_checkpoint

    path = tmp_path / "model"
    shutil.copytree(tiny_hybrid_checkpoint(), path)
    config = json.loads((path / "config.json").read_text())
    config.update(changes)
    (path / "config.json").write_text(json.dumps(config))
    return path


def _config_refused(path: Path, *expected: str) -> str:
    from engine.model_source import check_model

    with pytest.raises(ValueError) as caught:
        check_model(str(path), "v1")
    text = str(caught.value)
    assert "\n" not in text and len(text) < 400, text
    for part in expected:
        assert part in text, text
    return text


def _numeric_fields() -> list[str]:
    from blockviz.session.tiny_hybrid import CONFIG

    return sorted(name for name, value in CONFIG.items()  # the window: test_sliding_window.py's refusals
                  if isinstance(value, (int, float)) and not isinstance(value, bool) and name != "sliding_window")


def test_the_checkpoint_these_cases_change_is_accepted(tmp_path):
    from engine.model_source import check_model

    check_model(str(_checkpoint(tmp_path)), "v1")
    assert len(_numeric_fields()) >= 10


@pytest.mark.parametrize("bad", ["4", 2.5, [], {}, True, -1, 10**30, float("nan")], ids=repr)
def test_every_numeric_config_field_of_a_bad_type_or_range_is_one_line(tmp_path, bad):
    """Every numeric field of tiny-hybrid's config.json, each given each bad value in turn."""
    from blockviz.session.tiny_hybrid import CONFIG
    from engine.model_source import check_config_values

    config = json.loads((_checkpoint(tmp_path) / "config.json").read_text())
    for name in _numeric_fields():
        real = isinstance(CONFIG[name], float)
        if name.endswith("token_id") and bad == [] or real and bad in (2.5, 10**30):
            continue  # a list of token ids is transformers' own form; 2.5 and 1e30 are real numbers
        with pytest.raises(ValueError, match=f"config.json field '{name}'") as caught:
            check_config_values({**config, name: bad})
        assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


@pytest.mark.parametrize("name, value, expected", [
    ("num_hidden_layers", "4", "a whole number in 1.."),
    ("num_hidden_layers", 2.0, "a whole number in 1.."),
    ("num_hidden_layers", None, "a whole number in 1.."),
    ("num_hidden_layers", 10**9, "at most 4096 layers"),
    ("max_position_embeddings", "256", "a whole number in 1.."),
    ("use_sliding_window", "yes", "true or false"),
    ("num_attention_heads", 0, "a whole number in 1.."),
    ("num_key_value_heads", 0, "a whole number in 1.."),
    ("head_dim", -16, "a whole number in 1.."),
    ("rms_norm_eps", 0, "a finite number > 0"),
])
def test_the_probes_config_values_are_one_line(tmp_path, name, value, expected):
    _config_refused(_checkpoint(tmp_path, **{name: value}), name, expected)


@pytest.mark.parametrize("text, expected", [
    ("[1, 2]", "holds a JSON list"),
    ("not json", "is not valid JSON"),
    ("[" * 100_000 + "]" * 100_000, "nests too deep"),
    ('"model"', "holds a JSON str"),
])
def test_an_unreadable_or_non_object_config_is_one_line(tmp_path, text, expected):
    path = _checkpoint(tmp_path)
    (path / "config.json").write_text(text)
    assert "model_type None" not in _config_refused(path, expected)


def test_a_config_naming_more_layers_than_the_weights_hold_is_refused(tmp_path):
    layer_types = ["sliding_attention", "full_attention"] * 4
    path = _checkpoint(tmp_path, num_hidden_layers=8, layer_types=layer_types)
    _config_refused(path, "names 8 layers but the weights", "hold 4")
    from engine.model_loader import load_model

    with pytest.raises(ValueError, match="names 8 layers but the weights"):  # the loader checks it too
        load_model(str(path), "cpu", None)


def test_generate_refuses_a_bad_config_in_one_line_exit_2(tmp_path, capsys):
    from blockviz.cli import main

    path = _checkpoint(tmp_path, num_attention_heads=0)
    assert main(["generate", "--model", str(path), "--kv-manager", "v1", "--prompt", "hi", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "num_attention_heads" in err[0], err


# ---------------------------------------------------------------- item 4: groups a header declares, capped

@pytest.mark.parametrize("num_groups", [65, 84_001])
def test_a_header_declaring_more_kv_cache_groups_than_any_model_has_is_refused(tmp_path, capsys, num_groups):
    """The probe's 84,001 groups (a 4 MB header) cost export 1.3 GB: the header is refused in one
    line before any view builds a table per group, in the reader and at the CLI (exit 2)."""
    from blockviz.cli import main
    from blockviz.model.trace import MAX_KV_CACHE_GROUPS

    lines = _lines(HYBRID)
    header = json.loads(lines[0])
    header["kv_cache_groups"] += [{"kind": "full_attention", "layer_names": []}] * (num_groups - 2)
    path = _write(tmp_path / "groups.jsonl", [json.dumps(header), *lines[1:]])
    _refused(path, "kv_cache_groups", f"at most {MAX_KV_CACHE_GROUPS}")
    assert main(["export", str(path), "--out", str(tmp_path / "out.svg")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "kv_cache_groups" in err[0] and len(err[0]) < 600, err[0][:600]
    assert not (tmp_path / "out.svg").exists()


def _declaring(tmp_path: Path, num_groups: int, num_lines: int | None = None) -> Path:
    """The hybrid trace (2 groups used) with a header declaring `num_groups`, its first `num_lines` lines."""
    lines = _lines(HYBRID)[:num_lines]
    header = json.loads(lines[0])
    header["kv_cache_groups"] += [{"kind": "full_attention", "layer_names": []}] * (num_groups - 2)
    return _write(tmp_path / f"groups-{num_groups}.jsonl", [json.dumps(header), *lines[1:]])


def test_views_build_tables_only_for_the_groups_that_hold_blocks(tmp_path):
    """A header at the cap with the events using 2 groups: at every 25th cursor the view model's
    frame (the records every front end draws) is the 2-group trace's, row for row."""
    from blockviz.model.export import trace_frame
    from blockviz.model.trace import MAX_KV_CACHE_GROUPS
    from blockviz.model.timeline import Timeline
    from blockviz.model.view import summary_text, tables

    declared, used = read_trace(_declaring(tmp_path, MAX_KV_CACHE_GROUPS)), read_trace(HYBRID)
    timelines = [Timeline.for_trace(trace) for trace in (declared, used)]
    assert timelines[0].state.num_kv_cache_groups == MAX_KV_CACHE_GROUPS
    num_rows = 0
    for position in range(0, len(used.events) + 1, 25):
        frames = []
        for timeline in timelines:
            timeline.seek(position)
            frames.append(json.dumps(trace_frame(timeline, used.header, "t")))
            rows = tables(timeline.state)
            assert all(len(row.groups) <= 1 for row in rows)
            num_rows += len(rows)
            assert len(timeline.state.groups_holding_blocks()) <= 2
        assert frames[0] == frames[1], position
        assert summary_text(timelines[0].state) == summary_text(timelines[1].state)
    assert num_rows  # the cursors checked drew block tables


def test_export_and_the_notebook_cost_what_is_drawn_not_what_is_declared(tmp_path):
    """The SVG at one cursor, the page of every frame (the notebook's own front end, over the
    frames the notebook's Visualizer computes) and its frames: a header at the cap with 2 groups
    used comes out the size of the 2-group trace's (sizes, never times)."""
    from blockviz.jupyter.visualizer import Visualizer
    from blockviz.model.export import save_frame
    from blockviz.model.trace import MAX_KV_CACHE_GROUPS
    from blockviz.webpage.page import visualizer_page

    sizes = {}
    for num_groups in (2, MAX_KV_CACHE_GROUPS):
        viz = Visualizer.from_trace(_declaring(tmp_path, num_groups, 220))
        try:
            viz.timeline.seek(len(viz.timeline))
            frame = viz.frame()
            svg = save_frame(frame, tmp_path / f"{num_groups}.svg")
            sizes[num_groups] = (svg.stat().st_size, len(json.dumps(frame)), len(visualizer_page(viz)))
        finally:
            viz.close()
    assert all(sizes[MAX_KV_CACHE_GROUPS][part] <= 1.05 * sizes[2][part] for part in range(3)), sizes


def test_the_hostile_table_runs_the_probes_inputs_through_the_cli(capsys):
    """scripts/hostile_table.py (the closing note's table), on its two header cases: each a
    `python -m blockviz export` process, its exit code and line, no traceback."""
    spec = importlib.util.spec_from_file_location("hostile_table", ROOT / "scripts" / "hostile_table.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    assert module.main(["--only", "groups declared", "--markdown"]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("| item 6")]
    assert len(rows) == 2 and "| export | 2 | blockviz: error:" in rows[0] and "| export | 0 |" in rows[1], rows
    assert "2 inputs, 0 with a traceback or a raw ESC." in out
