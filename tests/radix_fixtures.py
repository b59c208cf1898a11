"""A small `kv_manager="sglang"` trace recorded through the command line (SGLang's RadixCache at
page_size 2 in a pool of 16 pages): prompts sharing an opening, so a node splits, paths lock, and
finished requests' leaves are evicted for the next. Shared by the radix tree's record, TUI, SVG and
browser tests."""

from __future__ import annotations

import importlib.util

import pytest

PROMPTS = ("All the world's a stage, and all", "All the world's a stage, the quick",
           "Once upon a time there was", "All the world's a stage, and all the men")


@pytest.fixture(scope="module")
def sglang_trace(tiny_gpt2_dir, tmp_path_factory):
    """The trace (blockviz.model.trace.Trace, its file at `.path`)."""
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")
    from blockviz.cli import main
    from blockviz.model.trace import read_trace

    out = tmp_path_factory.mktemp("sglang-trace") / "radix.jsonl"
    args = ["record", "--out", str(out), "--model", str(tiny_gpt2_dir), "--kv-manager", "sglang",
            "--sglang-option", "page_size=2", "--num-gpu-blocks", "16", "--max-tokens", "4", "--temperature", "0"]
    for prompt in PROMPTS:
        args += ["--prompt", prompt]
    assert main(args) == 0
    return read_trace(out)
