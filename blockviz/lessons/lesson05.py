"""Lesson 05 (lessons/05_prefix_caching.ipynb): the chained block hash and the prompt's last block
(nano-vllm `BlockManager.compute_hash` / `allocate`; here engine.block_allocator)."""

from __future__ import annotations

from array import array
from functools import cache

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import fresh

FIRST = "HAMLET: To be, or not to be, that is the question"
SHARED = "HAMLET: To be, or not to be,"
OPTIONS = {"block_size": 4, "num_gpu_blocks": 24, "num_cpu_blocks": 0, "enable_prefix_caching": True}


@cache
def _blocks_of_first() -> list[tuple[int, ...]]:
    """The token ids of the first prompt's first three blocks, from a fresh engine's tokenizer."""
    with fresh(OPTIONS) as viz:
        ids = viz.llm.engine.encode(FIRST)
    return [tuple(ids[i:i + 4]) for i in range(0, 12, 4)]


def _xxh64(parent: int | None, token_ids: tuple[int, ...]) -> int:
    import xxhash

    h = xxhash.xxh64()
    if parent is not None:
        h.update(parent.to_bytes(8, "little"))
    h.update(array("q", token_ids).tobytes())
    return h.intdigest()


def _hash_without_parent() -> int:
    return _xxh64(None, _blocks_of_first()[2])


def _hash_after_block0() -> int:
    blocks = _blocks_of_first()
    return _xxh64(_xxh64(None, blocks[0]), blocks[2])


@exercise("05", "my_hash", "feed the parent's hash (8 little-endian bytes) first, then the block's tokens as "
                           "64-bit integers.",
          slips=[Slip(_hash_without_parent, "the parent of block 2 is block 1, and its hash goes in first."),
                 Slip(_hash_after_block0, "the parent is the block just before: block 1, whose hash already "
                                          "covers block 0.")])
def check_hash():
    """Block 2's hash in a fresh engine's table for the first prompt (the engine computes it)."""
    from engine.sequence import SamplingParams

    with fresh(OPTIONS, prompts=FIRST, sampling_params=SamplingParams(max_tokens=4)) as viz:
        viz.step()
        return viz.state.pools["gpu"][viz.state.table_blocks(0)[2]].block_hash


@exercise("05", "my_hits", "count the full blocks that match, then remember which block must be computed.",
          slips=[Slip(3, "3 full blocks match: is every one of them served? Think of the prompt's last block."),
                 Slip(0, "the first requests finished, but their full blocks stay in the hash map.")],
          unit="blocks", other_unit=("tokens", lambda: check_hits.truth() * OPTIONS["block_size"]))
def check_hits():
    """Hits of the 12-token prompt after both lesson prompts ran to the end."""
    from engine.sequence import SamplingParams

    second = "HAMLET: To be, or not to be, whether 'tis nobler"
    with fresh(OPTIONS, prompts=[FIRST, second], sampling_params=SamplingParams(max_tokens=4)) as viz:
        viz.run_to_completion()
        before = viz.state.num_prefix_hits
        viz.add_request(SHARED, SamplingParams(max_tokens=4))
        viz.step()
        return viz.state.num_prefix_hits - before
