"""Grouped-query attention through engine/attention.py: caches with fewer K/V heads than query
heads. The engine's path equals the reference on every kind of step, for CacheEngine's layout and
plain caches; and the reference equals attention written out densely with Hugging Face's
`repeat_kv` (query head h reads K/V head h // group)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_attention import BLOCK_SIZE, HEAD_DIM, NUM_BLOCKS, SCALE, STEPS, random_step

from engine.attention import paged_attention, reference_paged_attention
from engine.cache_engine import CacheEngine

NUM_HEADS = 6


def gqa_step(query_lens, context_lens, num_kv_heads: int, seed: int):
    """test_attention's random step, with query (num_tokens, 6, d), key and value (num_tokens, kv, d)."""
    meta, _ = random_step(query_lens, context_lens, seed)
    torch.manual_seed(seed)
    n = sum(query_lens)
    return meta, (torch.randn(n, NUM_HEADS, HEAD_DIM), torch.randn(n, num_kv_heads, HEAD_DIM),
                  torch.randn(n, num_kv_heads, HEAD_DIM))


def cache_engine_layer(num_kv_heads: int):
    cache = CacheEngine(1, num_kv_heads, HEAD_DIM, BLOCK_SIZE, NUM_BLOCKS, 0, "cpu", torch.float32)
    torch.manual_seed(3)
    cache._gpu_kv.copy_(torch.randn_like(cache._gpu_kv))
    return cache.gpu_cache[0]


def plain_layer(num_kv_heads: int):
    torch.manual_seed(3)
    shape = (NUM_BLOCKS, BLOCK_SIZE, num_kv_heads, HEAD_DIM)
    return torch.randn(shape), torch.randn(shape)


@pytest.mark.parametrize("num_kv_heads", [1, 2, 3])
@pytest.mark.parametrize("layout", [cache_engine_layer, plain_layer], ids=["cache-engine", "plain"])
@pytest.mark.parametrize("step", list(STEPS), ids=list(STEPS))
def test_engine_path_equals_reference_with_fewer_kv_heads(step, layout, num_kv_heads):
    meta, qkv = gqa_step(*STEPS[step], num_kv_heads, seed=len(step))
    outputs = []
    for attention in (paged_attention, reference_paged_attention):
        k_cache, v_cache = layout(num_kv_heads)
        outputs.append(attention(*qkv, k_cache, v_cache, meta, SCALE))
    assert outputs[0].shape == (sum(STEPS[step][0]), NUM_HEADS, HEAD_DIM)
    assert torch.allclose(outputs[0], outputs[1], atol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [1, 2])
def test_reference_equals_dense_attention_with_repeated_kv_heads(num_kv_heads):
    """Prefill from scratch: the reference over the paged cache equals causal attention over the
    fresh keys with each K/V head repeated for its group of query heads (HF `repeat_kv`)."""
    lens = [7, 12]
    meta, (q, k, v) = gqa_step(lens, lens, num_kv_heads, seed=1)
    k_cache, v_cache = plain_layer(num_kv_heads)
    out = reference_paged_attention(q, k, v, k_cache, v_cache, meta, SCALE)
    group = NUM_HEADS // num_kv_heads
    start = 0
    for n in lens:
        qs, ks, vs = (t[start:start + n].transpose(0, 1) for t in (q, k, v))  # (heads, n, d)
        ks, vs = ks.repeat_interleave(group, 0), vs.repeat_interleave(group, 0)  # (6, n, d)
        scores = (qs @ ks.transpose(1, 2)) * SCALE + torch.full((n, n), float("-inf")).triu(1)
        dense = (F.softmax(scores, -1) @ vs).transpose(0, 1)  # (n, 6, d)
        assert torch.allclose(out[start:start + n], dense, atol=1e-5)
        start += n
    # the cache holds the K/V heads as written, nothing repeated
    slot = meta.slot_mapping[0]
    assert torch.equal(k_cache.view(-1, num_kv_heads, HEAD_DIM)[slot], k[0])
