"""`blockviz generate`: completions and summary through the CLI, and one-line errors (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from blockviz.cli import main


def test_generate_json_reports_completions_tables_and_events(tiny_gpt2_dir, capsys):
    code = main(["generate", "--model", str(tiny_gpt2_dir), "--prompt", "To be, or not", "--prompt", "The quick",
                 "--n", "2", "--max-tokens", "6", "--block-size", "4", "--num-gpu-blocks", "32", "--json"])
    assert code == 0
    doc = json.loads(capsys.readouterr().out)
    requests, summary = doc["requests"], doc["summary"]
    assert [r["prompt"] for r in requests] == ["To be, or not", "The quick"]
    for request in requests:
        assert len(request["completions"]) == 2
        for completion in request["completions"]:
            assert len(completion["token_ids"]) == 6 and completion["finish_reason"] == "length"
            assert len(completion["block_table"]) == -(-(request["num_prompt_tokens"] + 6 - 1) // 4)
    assert summary["num_gpu_blocks"] == 32 and summary["gpu_blocks"]["used"] == 0
    assert summary["events"]["fork"] == 2 and summary["events"]["copy_on_write"] >= 1
    assert summary["tokens_generated"] == 24


def test_generate_text_output(tiny_gpt2_dir, capsys):
    assert main(["generate", "--model", str(tiny_gpt2_dir), "--prompt", "KV", "--max-tokens", "3"]) == 0
    out = capsys.readouterr().out
    assert "request 0" in out and "block table" in out and "events:" in out


def _cli(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, **(env_extra or {})}
    return subprocess.run([sys.executable, "-m", "blockviz", *args], capture_output=True, text=True, env=env,
                          timeout=120)


def test_unknown_model_offline_is_one_line_exit_2(tmp_path):
    result = _cli("generate", "--model", "gpt2", "--prompt", "hi",
                  env_extra={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "gpt2" in lines[0] and "Traceback" not in result.stderr


def test_bad_arguments_are_one_line_exit_2(tiny_gpt2_dir):
    for args in (["--max-tokens", "0"], ["--n", "0"], ["--block-size", "-3"], ["--prompt", ""]):
        result = _cli("generate", "--model", str(tiny_gpt2_dir), *args)
        assert result.returncode == 2, args
        assert "Traceback" not in result.stderr
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(("blockviz: error:", "blockviz generate: error:"))


def test_generate_peak_is_the_most_blocks_in_use_at_any_event(tiny_gpt2_dir, tmp_path, capsys):
    """Blocks freed inside a step (a sequence finishing) must not hide the peak reached earlier in it."""
    from blockviz.model.trace import read_trace
    from blockviz.model.reducer import ReducerState

    options = ["--model", str(tiny_gpt2_dir), "--prompt", "To be, or not to be", "--prompt", "KV",
               "--n", "2", "--max-tokens", "5", "--block-size", "2", "--num-gpu-blocks", "40"]
    assert main(["record", "--out", str(tmp_path / "t.jsonl"), *options]) == 0
    assert main(["generate", *options, "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    trace = read_trace(tmp_path / "t.jsonl")
    state = ReducerState(trace.block_size, trace.num_gpu_blocks, trace.num_cpu_blocks)
    peak = at_step_ends = 0
    for event in trace.events:
        state.apply(event)
        peak = max(peak, state.num_used("gpu"))
        if event.type == "step_finished":
            at_step_ends = max(at_step_ends, state.num_used("gpu"))
    assert summary["gpu_blocks"]["peak_used"] == peak
    assert peak > at_step_ends  # the case the old step-end sampling got wrong


def test_no_library_progress_bars_from_the_api_or_record(tiny_gpt2_dir, tmp_path, capfd):
    from engine import LLM

    LLM(str(tiny_gpt2_dir), num_gpu_blocks=8)
    assert main(["record", "--out", str(tmp_path / "t.jsonl"), "--model", str(tiny_gpt2_dir),
                 "--prompt", "KV", "--max-tokens", "2"]) == 0
    err = capfd.readouterr().err
    assert "Loading weights" not in err and "it/s" not in err and "%|" not in err
    assert "recorded" in err
