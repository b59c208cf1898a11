"""A small `kv_manager="sglang"` trace recorded through the command line (SGLang's RadixCache at
page_size 2 in a pool of 16 pages): prompts sharing an opening, so a node splits, paths lock, and
finished requests' leaves are evicted for the next. Shared by the radix tree's record, TUI, SVG and
browser tests."""

from __future__ import annotations

import importlib.util

import pytest

_RECORDED: dict = {}  # checkpoint dir -> the trace: recorded once per process, whichever module asks first
PROMPTS = ("All the world's a stage, and all", "All the world's a stage, the quick",
           "Once upon a time there was", "All the world's a stage, and all the men")


@pytest.fixture(scope="module")
def sglang_trace(tiny_gpt2_dir, tmp_path_factory):
    """The trace (blockviz.model.trace.Trace, its file at `.path`); tests only read it."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    from blockviz.cli import main
    from blockviz.model.trace import read_trace

    if tiny_gpt2_dir in _RECORDED:
        return _RECORDED[tiny_gpt2_dir]
    out = tmp_path_factory.mktemp("sglang-trace") / "radix.jsonl"
    args = ["record", "--out", str(out), "--model", str(tiny_gpt2_dir), "--kv-manager", "sglang",
            "--sglang-option", "page_size=2", "--num-gpu-blocks", "16", "--max-tokens", "4", "--temperature", "0"]
    for prompt in PROMPTS:
        args += ["--prompt", prompt]
    assert main(args) == 0
    _RECORDED[tiny_gpt2_dir] = read_trace(out)
    return _RECORDED[tiny_gpt2_dir]
