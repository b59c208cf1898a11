"""engine/attention.py: each CPU fast path of `paged_attention` gives the reference's result.

The reference (`reference_paged_attention`) gathers every sequence's keys and values through its
block table and calls SDPA; the engine's path skips the gather for a prefill from scratch, batches
decodes in length groups, and gathers K and V in one call when they share a tensor (CacheEngine's
layout). Each is run here against the reference on the same random caches and queries.
"""

from __future__ import annotations

import random

import pytest
import torch

from engine.attention import (
    AttentionMetadata,
    gather_blocks,
    head_major,
    length_groups,
    paged_attention,
    reference_paged_attention,
    stacked_kv,
)
from engine.cache_engine import CacheEngine

BLOCK_SIZE = 4
NUM_BLOCKS = 96
NUM_HEADS = 4
HEAD_DIM = 16
SCALE = HEAD_DIM ** -0.5
ATOL = 1e-5


def cache_engine_layer(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer 0 of a CacheEngine (K and V views of one tensor), filled with random values."""
    cache = CacheEngine(1, NUM_HEADS, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS, 0, "cpu", torch.float32)
    torch.manual_seed(seed)
    cache._gpu_kv.copy_(torch.randn_like(cache._gpu_kv))
    return cache.gpu_cache[0]


def plain_layer(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Two separately allocated, block-major caches."""
    torch.manual_seed(seed)
    shape = (NUM_BLOCKS, BLOCK_SIZE, NUM_HEADS, HEAD_DIM)
    return torch.randn(shape), torch.randn(shape)


def random_step(query_lens: list[int], context_lens: list[int], seed: int):
    """Metadata over random, distinct blocks, and random (query, key, value) for the new tokens."""
    rng = random.Random(seed)
    free = list(range(NUM_BLOCKS))
    rng.shuffle(free)
    tables = [[free.pop() for _ in range(-(-ctx // BLOCK_SIZE))] for ctx in context_lens]
    meta = AttentionMetadata.build(tables, query_lens, context_lens, BLOCK_SIZE)
    torch.manual_seed(seed)
    qkv = [torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM) for _ in range(3)]
    return meta, qkv


def both_paths(layout, meta, qkv):
    """Run the engine's path and the reference on equal caches of one layout; returns the two
    outputs and the two pairs of caches after the writes."""
    results = []
    for attention in (paged_attention, reference_paged_attention):
        k_cache, v_cache = layout(seed=3)
        out = attention(*qkv, k_cache, v_cache, meta, SCALE)
        results.append((out, k_cache, v_cache))
    return results


STEPS = {
    # decodes of very different lengths: several length groups
    "decodes-in-length-groups": ([1] * 8, [3, 5, 6, 40, 44, 70, 71, 75]),
    # decodes of similar lengths: one group, no padding to speak of
    "decodes-in-one-group": ([1] * 4, [9, 10, 11, 12]),
    # prefills from scratch only: attended over their fresh K/V
    "fresh-prefills": ([7, 12, 1], [7, 12, 1]),
    # a suffix after cached blocks (gathered), fresh prefills and decodes in one step
    "mixed": ([5, 9, 1, 1, 3], [13, 9, 30, 4, 3]),
}


@pytest.mark.parametrize("layout", [cache_engine_layer, plain_layer], ids=["cache-engine", "plain"])
@pytest.mark.parametrize("name", STEPS)
def test_paged_attention_matches_the_reference(layout, name):
    query_lens, context_lens = STEPS[name]
    meta, qkv = random_step(query_lens, context_lens, seed=len(name))
    if name == "decodes-in-length-groups":
        assert meta.decode_only and len(meta.decode_groups) > 1
    if name == "decodes-in-one-group":
        assert meta.decode_only and len(meta.decode_groups) == 1
    if layout is cache_engine_layer:
        assert stacked_kv(*layout(seed=3)) is not None  # K and V gathered in one call
    (fast, fast_k, fast_v), (ref, ref_k, ref_v) = both_paths(layout, meta, qkv)
    torch.testing.assert_close(fast, ref, atol=ATOL, rtol=0)
    assert torch.equal(fast_k, ref_k) and torch.equal(fast_v, ref_v)


def test_the_reference_is_causal_over_the_whole_context():
    """A query at position p sees exactly the keys 0..p, cached or new: a new key at the last
    position changes only the last query's output, a cached key at position 2 changes them all."""
    meta, (query, key, value) = random_step([3], [10], seed=5)  # queries at positions 7, 8, 9
    k_cache, v_cache = plain_layer(seed=6)

    def attend(key, k_cache):
        return reference_paged_attention(query, key, value, k_cache.clone(), v_cache.clone(), meta, SCALE)

    before = attend(key, k_cache)
    last_key = key.clone()
    last_key[2] += 1
    after = attend(last_key, k_cache)
    torch.testing.assert_close(after[:2], before[:2])
    assert not torch.allclose(after[2], before[2])
    earlier = k_cache.clone()
    earlier[meta.block_tables[0][0], 2] += 1
    changed = attend(key, earlier)
    assert all(not torch.allclose(changed[i], before[i]) for i in range(3))


def test_stacked_kv_is_one_view_of_cache_engine_layers_only():
    k_cache, v_cache = cache_engine_layer(seed=1)
    kv = stacked_kv(k_cache, v_cache)
    assert kv is not None and kv.data_ptr() == head_major(k_cache).data_ptr()
    assert torch.equal(kv, torch.stack([head_major(k_cache), head_major(v_cache)]))
    assert stacked_kv(*plain_layer(seed=1)) is None


@pytest.mark.parametrize("layout", [cache_engine_layer, plain_layer])
def test_gather_blocks_selects_blocks_in_order(layout):
    """Whole-block rows of a viewable cache (CacheEngine's), or a select along the block
    dimension (a permuted block-major cache): the same blocks either way."""
    k_cache, v_cache = layout(seed=2)
    blocks = torch.tensor([5, 0, 5, 17])
    for cache in (head_major(k_cache), stacked_kv(k_cache, v_cache)):
        if cache is None:
            continue
        expected = torch.stack([cache[..., b, :, :] for b in blocks.tolist()], dim=-3)
        assert torch.equal(gather_blocks(cache, blocks), expected)


def test_length_groups_cut_where_padding_is_saved():
    assert length_groups([3, 3, 3], 4, 1) == [[0, 1, 2]]  # nothing to save: one group, in order
    groups = length_groups([1, 20, 2, 21], 4, 8)
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3]
    assert groups == [[0, 2], [1, 3]]  # the short pair no longer pads to the long pair's blocks
    assert len(length_groups(list(range(1, 200)), 3, 1)) == 3
