"""Every bad input of run, generate, record and replay: one line on stderr, exit 2, no traceback,
before any UI opens or any model loads (run in subprocesses: a check that let `run` through would
open the app, and the timeout fails the test instead of hanging it)."""

from __future__ import annotations

import subprocess
import sys

import pytest

LONG_PROMPT = "ROMEO: " + "and " * 300  # over the bundled model's context of 256 tokens

CASES = [
    ("empty prompt", ["--prompt", ""], "--prompt is empty"),
    ("over-long prompt", ["--prompt", LONG_PROMPT], "the model's context is 256"),
    ("no CUDA here", ["--device", "cuda"], "no CUDA device"),
    ("unknown device", ["--device", "tpu"], "--device must be cpu, cuda or cuda:N"),
    ("temperature nan", ["--temperature", "nan"], "--temperature must be a finite number"),
    ("negative seed", ["--seed", "-1"], "--seed must be at least 0"),
    ("zero blocks", ["--num-gpu-blocks", "0"], "--num-gpu-blocks must be at least 1"),
    ("unknown model", ["--model", "./no/such/dir"], "does not exist"),
]


def _blockviz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", *args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize("command", ["run", "generate", "record"])
@pytest.mark.parametrize(("case", "args", "expected"), CASES, ids=[c[0] for c in CASES])
def test_bad_engine_options_are_one_line_exit_2(tmp_path, command, case, args, expected):
    if command == "run" and sys.platform != "linux":
        pytest.skip("run's checks are the same code; only linux runs them here")
    extra = ["--out", str(tmp_path / "t.jsonl")] if command == "record" else []
    result = _blockviz(command, *extra, *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""
    assert not (tmp_path / "t.jsonl").exists()


@pytest.mark.parametrize(("args", "expected"), [
    (["no-such-trace"], "does not exist"),
    (["--projector"], "the following arguments are required"),
])
def test_bad_replay_input_is_one_line_exit_2(args, expected):
    result = _blockviz("replay", *args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr
