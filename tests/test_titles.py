"""A title names the model, never the directory its checkpoint sits in (a cache, or a temporary
directory that changes every run: lesson 11's hybrid checkpoint, a live tiny-hybrid run)."""

from __future__ import annotations

import pytest

from blockviz.model.design import model_name
from blockviz.model.trace import engine_title, load_trace


@pytest.mark.parametrize(("model", "name"), [
    ("tiny-shakespeare", "tiny-shakespeare"), ("gpt2", "gpt2"), ("HuggingFaceTB/SmolLM2-135M", "HuggingFaceTB/SmolLM2-135M"),
    ("/tmp/blockviz-lesson11-k2j4/lesson11-hybrid", "lesson11-hybrid"), ("/root/.cache/blockviz/tiny-hybrid-v3", "tiny-hybrid"),
    ("./checkpoints/mine/", "mine"),
])
def test_model_name(model, name):
    assert model_name({"model": model}) == name


def test_the_hybrid_title_names_the_model_and_what_a_block_holds():
    header = dict(load_trace("hybrid").header, model="/tmp/blockviz-run-x81/tiny-hybrid-v1")
    title = engine_title(header)
    assert title.startswith("tiny-hybrid · ") and "/tmp" not in title
    assert f"= {header['block_bytes']:,} B" in title  # the bytes of one block


def test_a_v1_title_names_the_null_block_beside_the_pools_count():
    """The header's "48 GPU blocks" and the pool's "/47": both named (v1's block 0 is the null block)."""
    from blockviz.model.view import pool_counts

    v1 = load_trace("v1-story")
    n = v1.header["num_gpu_blocks"]
    assert f"{n} GPU / " in engine_title(v1.header)
    assert f" · {n - 1} GPU blocks usable + the null block" in engine_title(v1.header)
    from blockviz.model.reducer import ReducerState

    state = ReducerState.from_header(v1.header)
    assert sum(pool_counts(state)["gpu"]) == n - 1  # what the pool's "/N" counts
    assert "null block" not in engine_title(load_trace("swap").header)
