"""`--kv-manager v0|v1` on the engine commands: v1 runs (generate, record) give v0's greedy text and
a trace that loads with its manager recorded; bad choices are one line on stderr, exit 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from blockviz.cli import main
from engine.designs import V1


def _blockviz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", ["run", "generate", "record", "explain", "publish"])
@pytest.mark.parametrize(("args", "expected"), [
    (["--kv-manager", "v2"], "--kv-manager: invalid choice: 'v2'"),
    (["--kv-manager", "v1", "--preemption-mode", "swap"], "recompute only"),
], ids=["v2", "v1-swap"])
def test_bad_kv_manager_is_one_line_exit_2(tmp_path, command, args, expected):
    extra = {"record": ["--out", str(tmp_path / "t.jsonl")], "explain": ["--prompt", "A", "--prompt", "B"],
             "publish": ["--live"]}
    result = _blockviz(command, *extra.get(command, []), *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "t.jsonl").exists()


def test_generate_v1_gives_v0s_greedy_text(tiny_gpt2_dir, capsys):
    options = ["generate", "--model", str(tiny_gpt2_dir), "--prompt", "To be, or not", "--prompt", "The quick",
               "--n", "2", "--max-tokens", "6", "--block-size", "4", "--num-gpu-blocks", "32", "--json",
               "--temperature", "0"]
    docs = {}
    for manager in ("v0", "v1"):
        assert main([*options, "--kv-manager", manager]) == 0
        docs[manager] = json.loads(capsys.readouterr().out)
    texts = {m: [[c["token_ids"] for c in r["completions"]] for r in doc["requests"]] for m, doc in docs.items()}
    assert texts["v0"] == texts["v1"]
    events = docs["v1"]["summary"]["events"]
    assert "fork" not in events and "copy_on_write" not in events and events["prefix_cache_hit"] >= 1


def test_record_v1_writes_a_trace_that_loads_as_v1(tiny_gpt2_dir, tmp_path):
    from blockviz.model.reducer import NULL, ReducerState
    from blockviz.model.trace import read_trace

    out = tmp_path / "v1.jsonl"
    assert main(["record", "--out", str(out), "--model", str(tiny_gpt2_dir), "--prompt", "To be, or not to be",
                 "--n", "2", "--max-tokens", "5", "--block-size", "2", "--num-gpu-blocks", "24",
                 "--kv-manager", "v1"]) == 0
    trace = read_trace(out)  # every event passes the v1 trace checker
    assert trace.header["kv_manager"] == "v1" and trace.header["prefix_caching_hash_algo"] == "sha256"
    assert trace.header["enable_prefix_caching"] is True and trace.num_cpu_blocks == 0
    state = ReducerState.from_header(trace.header).apply_all(trace.events)
    assert state.pools["gpu"][0].state == NULL and state.num_free("gpu") == 23
    assert any(e.type == "tokens_scheduled" for e in trace.events)


def test_the_story_scenario_runs_v1_by_recompute():
    from blockviz.session.spec import EngineSpec

    spec = EngineSpec.for_scenario("story", kv_manager=V1.name)
    assert spec.config.kv_manager == "v1" and spec.config.preemption_mode is None
    assert spec.config.enable_prefix_caching is True
    assert EngineSpec.for_scenario("story").config.preemption_mode.value == "swap"  # v0 keeps its story
    with pytest.raises(ValueError, match="recompute only"):
        EngineSpec.for_scenario("story", kv_manager=V1.name, preemption_mode="swap")


@pytest.mark.parametrize(("args", "gate", "vllm_options"), [
    ([], True, None),
    (["--no-scheduler-reserve-full-isl"], False, None),
    (["--kv-manager", "vllm", "--no-scheduler-reserve-full-isl"], False, {"scheduler_reserve_full_isl": False}),
    (["--kv-manager", "vllm", "--vllm-option", "scheduler_reserve_full_isl=false"], False,
     {"scheduler_reserve_full_isl": False}),
    (["--kv-manager", "vllm"], True, None),
])
def test_whole_prompt_admission_is_on_by_default_and_one_setting_under_vllm(args, gate, vllm_options):
    """EngineConfig.scheduler_reserve_full_isl: on, as vLLM 0.33's SchedulerConfig has it; the flag
    turns it off for v1, and under --kv-manager vllm the flag and vLLM's option are one setting."""
    import importlib.util

    from blockviz.cli import build_parser
    from blockviz.session.spec import EngineSpec

    if "vllm" in args and importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")
    spec = EngineSpec.from_args(build_parser().parse_args(["generate", "--kv-manager", "v1", *args]))
    assert spec.config.scheduler_reserve_full_isl is gate and spec.config.vllm_options == vllm_options
