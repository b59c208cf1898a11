"""Errors in the words the user typed: an engine option named by its flag, and "did you mean" for
a near miss of an option's value, a model or a trace (one line on stderr, exit 2, no traceback, as
tests/test_cli_errors.py checks every bad input)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from blockviz.errors import did_you_mean, in_flags


def _blockviz(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("case", "args", "expected"), [
    ("vllm option on v1", ["record", "--out", "{tmp}/t.jsonl", "--kv-manager", "v1", "--vllm-option", "watermark=0.1"],
     "--vllm-option applies to --kv-manager vllm only"),
    ("mistyped kv manager", ["record", "--out", "{tmp}/t.jsonl", "--kv-manager", "vlm"], "(did you mean 'vllm'?)"),
    ("mistyped preemption mode", ["generate", "--preemption-mode", "swapp"], "(did you mean 'swap'?)"),
    ("mistyped model", ["generate", "--model", "tiny-shakespear"], "(did you mean 'tiny-shakespeare'?)"),
    ("mistyped trace", ["replay", "v1-stry"], "(did you mean 'v1-story'?)"),
], ids=lambda v: v if isinstance(v, str) and " " in v else None)
def test_errors_name_flags_and_near_misses(tmp_path, case, args, expected):
    result = _blockviz(*(a.format(tmp=tmp_path) for a in args))
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert expected in lines[0] and "vllm_options" not in lines[0] and "kv_manager" not in lines[0], lines[0]


def test_flags_replace_option_names_and_only_close_names_are_offered():
    assert in_flags("vllm_options apply to kv_manager 'vllm' only") == "--vllm-option applies to --kv-manager vllm only"
    assert in_flags("kv_manager 'v0' cannot run this model") == "--kv-manager v0 cannot run this model"
    assert in_flags("num_gpu_blocks must be at least 1, got 0") == "--num-gpu-blocks must be at least 1, got 0"
    assert did_you_mean("v1-stry", ["swap", "v1-story"]) == " (did you mean 'v1-story'?)"
    assert did_you_mean("qqq", ["swap", "v1-story"]) == ""
