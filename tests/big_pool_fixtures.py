"""A trace of a pool the size a GPU's memory gives (200,000 blocks), made of real events for the
real reducer, with no engine: the engine's K/V tensors for 200,000 blocks of the bundled model do
not fit this machine's memory (and FakeEngine's block manager takes seconds to build that pool).

Its blocks are spread over the pool so that a zoomed-out cell is all used, part used, mixed with
cached and free, or the pool's last, partial cell: blocks 0-299 used (seq 0), 100,000-100,015
hashed and 100,000-100,007 freed but cached (seq 1), and the pool's last block used (seq 2).
"""

from __future__ import annotations

from pathlib import Path

from blockviz.model.reducer import USED
from blockviz.model.trace import Trace, make_header, write_trace
from blockviz.model.view import block_state
from engine import events as ev

NUM_GPU_BLOCKS = 200_000
BLOCK_SIZE = 4
SEQ_BLOCKS = {0: range(0, 300), 1: range(100_000, 100_016), 2: range(NUM_GPU_BLOCKS - 1, NUM_GPU_BLOCKS)}
TRACE_GPU_BLOCKS = 131_000  # a trace file this small may declare at most trace.MIN_POOL_BLOCKS blocks
CACHED_BLOCKS = range(100_000, 100_008)


def big_pool_events(num_gpu_blocks: int = NUM_GPU_BLOCKS) -> list[ev.Event]:
    seq_no = iter(range(10**9))
    seq_blocks = {**{seq_id: list(blocks) for seq_id, blocks in SEQ_BLOCKS.items()}, 2: [num_gpu_blocks - 1]}
    prompts = {seq_id: tuple((seq_id * 13 + i) % 200 for i in range(len(blocks) * BLOCK_SIZE))
               for seq_id, blocks in seq_blocks.items()}
    events: list[ev.Event] = [ev.RequestAdded(next(seq_no), str(seq_id), (seq_id,), "", tokens, ("x",) * len(tokens), 1, 8)
                              for seq_id, tokens in prompts.items()]
    events.append(ev.StepStarted(next(seq_no), 1, "prefill", tuple(prompts), sum(map(len, prompts.values()))))
    for seq_id, blocks in seq_blocks.items():
        tokens = prompts[seq_id]
        for index, block in enumerate(blocks):
            events.append(ev.BlockAllocated(next(seq_no), "gpu", block, (seq_id,), index, 1, None,
                                            tokens[index * BLOCK_SIZE:(index + 1) * BLOCK_SIZE]))
    parent = None
    for index, block in enumerate(SEQ_BLOCKS[1]):
        block_hash = 1_000 + block
        events.append(ev.BlockHashed(next(seq_no), "gpu", block, block_hash, parent,
                                     tuple(range(BLOCK_SIZE)), (index + 1) * BLOCK_SIZE, True))
        parent = block_hash
    for block in CACHED_BLOCKS:
        events.append(ev.BlockFreed(next(seq_no), "gpu", block, 1, 0, True))
    events.append(ev.StepFinished(next(seq_no), 1, "prefill", 4, 0.0))
    return events


def big_pool_header(num_gpu_blocks: int = NUM_GPU_BLOCKS) -> dict:
    return make_header({"model": "synthetic", "block_size": BLOCK_SIZE, "num_gpu_blocks": num_gpu_blocks,
                        "num_cpu_blocks": 8})


def big_pool_trace(num_gpu_blocks: int = NUM_GPU_BLOCKS) -> Trace:
    return Trace(big_pool_header(num_gpu_blocks), big_pool_events(num_gpu_blocks))


def write_big_pool_trace(path: Path, num_gpu_blocks: int = NUM_GPU_BLOCKS) -> Path:
    write_trace(path, big_pool_header(num_gpu_blocks), big_pool_events(num_gpu_blocks))
    return path


def reducer_counts(pool, blocks) -> tuple[int, int, int, int]:
    """(used, cached, free, null) among `blocks` of a reducer pool, by view.block_state, block by block."""
    states = [block_state(pool[number]) for number in blocks]
    return states.count("used"), states.count("cached"), states.count("free"), states.count("null")


def used_share_eighths(pool, blocks) -> int:
    """The eighths of `blocks` in use, as a zoomed-out cell's bar draws them (pool_zoom.ZoomCells.look)."""
    used = sum(pool[number].state == USED for number in blocks)
    total = len(blocks)
    eighths = round(8 * used / total)
    return max(1, eighths if used == total else min(7, eighths)) if used else 0
