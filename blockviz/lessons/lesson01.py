"""Lesson 01 (lessons/01_block_size.ipynb): bytes per block and blocks per budget, from
`engine.cache_engine.CacheEngine.get_cache_block_size` (vLLM v0's)."""

from __future__ import annotations

from blockviz.lessons.checks import Slip, exercise

GiB = 2**30


def block_bytes(block_size: int, num_layers: int, num_kv_heads: int, head_size: int, dtype_bytes: int) -> int:
    import torch

    from engine.cache_engine import CacheEngine

    dtype = {2: torch.float16, 4: torch.float32}[dtype_bytes]
    return CacheEngine.get_cache_block_size(block_size, num_layers, num_kv_heads, head_size, dtype)


@exercise("01", "my_bytes", "count the factors. Every token stores a key AND a value, in every layer, for every head.",
          slips=[Slip(32_768, "that is the worked example's figure: it forgets the factor 2 for K and V.")],
          praise="the worked example forgets the factor 2 for K and V.")
def check_bytes():
    """A 4-token block of a 4-layer model with 8 heads of 128 numbers in float16."""
    return block_bytes(4, 4, 8, 128, 2)


@exercise("01", "my_blocks", "how many whole GPT-2 blocks (their bytes computed above) fit in 2**30 bytes?",
          slips=[Slip(910, "float16 takes 2 bytes a number, not 4."),
                 Slip(3640, "every token stores a key AND a value: the factor 2."),
                 Slip(GiB / (16 * 12 * 2 * 12 * 64 * 2), "can a pool hold part of a block?")])
def check_blocks():
    """16-token float16 blocks of GPT-2 small (12 layers, 12 heads of 64) in exactly 1 GiB."""
    return GiB // block_bytes(16, 12, 12, 64, 2)


@exercise("01", "my_gqa_bytes", "the factors of the first exercise, with this model's layers, heads and head_dim: "
                                "which heads does the cache hold?",
          slips=[Slip(8_388_608, "which heads does the cache hold: the 32 query heads, or the K/V heads?")],
          praise="8 K/V heads, a quarter of what counting the 32 query heads gives.")
def check_gqa_bytes():
    """One 16-token float16 block of a Llama-3-8B-sized model (32 layers, 8 K/V heads of 128)."""
    return block_bytes(16, 32, 8, 128, 2)
