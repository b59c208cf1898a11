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
from engine.designs import get_design
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
