"""Benchmark: the memory planner's cost per decoded token, with and without an event subscriber
(a benchmark, not a test: it prints figures, it never fails on time), for both designs, and
nano-vllm's as the reference:
v0: `Sequence.append_token_id` + `BlockSpaceManager.append_slots`;
v1: `Sequence.append_token_id` + `KVCacheManager.allocate_slots(seq, 1)` (the scheduler's call for
one decode token, hashing and caching each block as it fills) + the computed-token count;
nano-vllm: its `Sequence.append_token` + `BlockManager.may_append`, rewritten below (nano-vllm is
not a dependency), with no events (it has none).

Workload: 256 sequences x 512 appended tokens, block size 16, and every sequence freed at the end;
v0 forks every 16th sequence (so copy-on-write happens), v1 and nano-vllm give it a second request
with the same prompt instead (neither forks), which shares the prompt's block through the prefix cache.

The five variants run in lockstep: managers with the same sequences take turns decode step by
decode step (the order rotating), so a machine that speeds up or slows down mid-run (shared hosts
do) weighs on all alike. Each round reports its own ratios; the summary gives the median round.

    python benchmarks/block_manager.py [--seqs 256] [--tokens 512] [--rounds 5]
    python benchmarks/block_manager.py --smoke    # a few sequences, seconds (tests/test_benchmarks.py)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import deque
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import BlockSpaceManager, EventBus, Sequence, SequenceGroup, SequenceStatus  # noqa: E402
from engine.v1 import KVCacheManager  # noqa: E402

try:  # nano-vllm's block hash (chain_hash)
    import numpy
    import xxhash
except ImportError:
    xxhash = None


def noop(event) -> None:
    """The subscriber: takes each event and does nothing with it."""


class Variant:
    """One manager and its sequences, prompts allocated and forks made."""

    def __init__(self, num_seqs: int, num_tokens: int, block_size: int, subscribe: bool) -> None:
        self.bus = EventBus()
        if subscribe:
            self.bus.subscribe(noop)
        blocks_needed = (num_seqs + num_seqs // 16) * ((16 + num_tokens) // block_size + 2)
        self.manager = BlockSpaceManager(block_size, blocks_needed, 0, watermark=0.0, events=self.bus)
        self.seqs: list[Sequence] = []
        self.elapsed = 0.0
        next_id = 0
        for i in range(num_seqs):
            seq = Sequence(next_id, list(range(i, i + 16)), block_size)
            next_id += 1
            group = SequenceGroup(f"r{i}", [seq])
            self.manager.allocate(group)
            seq.status = SequenceStatus.RUNNING
            self.seqs.append(seq)
            if i % 16 == 0:
                child = seq.fork(next_id)
                next_id += 1
                group.add(child)
                self.manager.fork(seq, child)
                self.seqs.append(child)

    def step(self, token_id: int) -> None:
        """One decode step's bookkeeping: each sequence takes its token and a slot for it."""
        append_slots = self.manager.append_slots
        start = time.perf_counter()
        for seq in self.seqs:
            seq.append_token_id(token_id)
            append_slots(seq)
        self.elapsed += time.perf_counter() - start

    def finish(self) -> int:
        """Free every sequence; returns how many events the run emitted (the bus numbers them
        0, 1, 2, ..., so the next number is the count)."""
        for seq in self.seqs:
            self.manager.free(seq)
        assert self.manager.get_num_free_gpu_blocks() == self.manager.num_total_gpu_blocks
        return next(self.bus.seq_nos) if self.bus.active else 0


class V1Variant:
    """The same workload on vLLM v1's KVCacheManager (prefix caching on, as v1 runs it)."""

    def __init__(self, num_seqs: int, num_tokens: int, block_size: int, subscribe: bool) -> None:
        self.bus = EventBus()
        if subscribe:
            self.bus.subscribe(noop)
        blocks_needed = (num_seqs + num_seqs // 16) * ((16 + num_tokens) // block_size + 2) + 1
        self.manager = KVCacheManager(block_size, blocks_needed, events=self.bus)
        self.seqs: list[Sequence] = []
        self.elapsed = 0.0
        for i in range(num_seqs):
            for _ in range(2 if i % 16 == 0 else 1):
                seq = Sequence(len(self.seqs), list(range(i, i + 16)), block_size)
                blocks, num_computed = self.manager.get_computed_blocks(seq)
                assert self.manager.allocate_slots(seq, 16 - num_computed, num_computed, blocks) is not None
                seq.num_computed_tokens = 16
                seq.status = SequenceStatus.RUNNING
                self.seqs.append(seq)

    def step(self, token_id: int) -> None:
        """One decode step's bookkeeping: each sequence takes its token, and the step after it
        gets the token's slot (allocate_slots for one new token) and counts it computed."""
        allocate_slots = self.manager.allocate_slots
        start = time.perf_counter()
        for seq in self.seqs:
            seq.append_token_id(token_id)
            allocate_slots(seq, 1)
            seq.num_computed_tokens += 1
        self.elapsed += time.perf_counter() - start

    def finish(self) -> int:
        for seq in self.seqs:
            self.manager.free(seq)
        assert self.manager.get_num_free_gpu_blocks() == self.manager.num_usable_blocks
        return next(self.bus.seq_nos) if self.bus.active else 0


def chain_hash(token_ids: list[int], prefix: int) -> int:
    """nano-vllm's block hash (`BlockManager.compute_hash`): xxh64 over the previous block's hash
    and the block's token ids as an int64 array; Python's hash of the pair where xxhash is absent."""
    if xxhash is None:
        return hash((prefix, tuple(token_ids)))
    hasher = xxhash.xxh64()
    if prefix != -1:
        hasher.update(prefix.to_bytes(8, "little"))
    hasher.update(numpy.array(token_ids).tobytes())
    return hasher.intdigest()


class NanoBlock:
    """nano-vllm's `Block`: an id, a ref count, the hash of a full block (-1 until full) and its tokens."""

    __slots__ = ("block_id", "ref_count", "hash", "token_ids")

    def __init__(self, block_id: int) -> None:
        self.block_id, self.ref_count, self.hash, self.token_ids = block_id, 0, -1, []


class NanoSequence:
    """nano-vllm's `Sequence` as far as the block manager reads it: a token list, its length and
    a block table; `append_token` is all a decode step does to it."""

    __slots__ = ("token_ids", "num_tokens", "block_table")

    def __init__(self, token_ids: list[int]) -> None:
        self.token_ids, self.num_tokens, self.block_table = list(token_ids), len(token_ids), []

    def append_token(self, token_id: int) -> None:
        self.token_ids.append(token_id)
        self.num_tokens += 1


class NanoVariant:
    """The same workload on a block manager that works as nano-vllm's `BlockManager` does (prefix
    caching always on): free ids in a deque, used ids in a set, a hash -> block map; `may_append`
    takes a new block when a sequence spills into one and hashes a block once it is full."""

    def __init__(self, num_seqs: int, num_tokens: int, block_size: int, subscribe: bool = False) -> None:
        assert not subscribe, "nano-vllm emits no events"
        self.block_size = block_size
        num_blocks = (num_seqs + num_seqs // 16) * ((16 + num_tokens) // block_size + 2)
        self.blocks = [NanoBlock(i) for i in range(num_blocks)]
        self.free_block_ids = deque(range(num_blocks))
        self.used_block_ids: set[int] = set()
        self.hash_to_block_id: dict[int, int] = {}
        self.seqs: list[NanoSequence] = []
        self.elapsed = 0.0
        for i in range(num_seqs):
            for _ in range(2 if i % 16 == 0 else 1):
                seq = NanoSequence(list(range(i, i + 16)))
                self.allocate(seq)
                self.seqs.append(seq)

    def _take_block(self, block_id: int) -> NanoBlock:
        block = self.blocks[block_id]
        block.ref_count, block.hash, block.token_ids = 1, -1, []
        self.free_block_ids.remove(block_id)
        self.used_block_ids.add(block_id)
        return block

    def allocate(self, seq: NanoSequence) -> None:
        """nano-vllm's `allocate`, for the full-block prompts this workload has: a cached block
        with the same chained hash and tokens is shared, else a free one is taken and registered."""
        prefix = -1
        for start in range(0, seq.num_tokens, self.block_size):
            token_ids = seq.token_ids[start:start + self.block_size]
            prefix = chain_hash(token_ids, prefix)
            block_id = self.hash_to_block_id.get(prefix, -1)
            if block_id in self.used_block_ids and self.blocks[block_id].token_ids == token_ids:
                block = self.blocks[block_id]
                block.ref_count += 1
            else:
                block = self._take_block(self.free_block_ids[0])
                block.hash, block.token_ids = prefix, token_ids
                self.hash_to_block_id[prefix] = block.block_id
            seq.block_table.append(block.block_id)

    def may_append(self, seq: NanoSequence) -> None:
        """nano-vllm's `may_append`, called once the sequence holds the token its step computes."""
        table = seq.block_table
        filled = seq.num_tokens % self.block_size
        if filled == 1:  # the token opened a new block
            table.append(self._take_block(self.free_block_ids[0]).block_id)
        elif filled == 0:  # the token filled the last block: hash it, chained to the one before
            last = self.blocks[table[-1]]
            prefix = self.blocks[table[-2]].hash if len(table) > 1 else -1
            last.token_ids = seq.token_ids[-self.block_size:]
            last.hash = chain_hash(last.token_ids, prefix)
            self.hash_to_block_id[last.hash] = last.block_id

    def step(self, token_id: int) -> None:
        """One decode step's bookkeeping, as Variant.step: nano-vllm's append_token, then may_append."""
        may_append = self.may_append
        start = time.perf_counter()
        for seq in self.seqs:
            seq.append_token(token_id)
            may_append(seq)
        self.elapsed += time.perf_counter() - start

    def finish(self) -> int:
        """nano-vllm's `deallocate` for every sequence; no events, so 0."""
        for seq in self.seqs:
            for block_id in reversed(seq.block_table):
                block = self.blocks[block_id]
                block.ref_count -= 1
                if block.ref_count == 0:
                    self.used_block_ids.remove(block_id)
                    self.free_block_ids.append(block_id)
            seq.block_table.clear()
        assert len(self.free_block_ids) == len(self.blocks)
        return 0


def one_round(num_seqs: int, num_tokens: int, block_size: int) -> tuple[list, list[int]]:
    """v0 bare, v0 watched, v1 bare, v1 watched, nano-vllm, in lockstep; returns them and their
    event counts."""
    variants = [cls(num_seqs, num_tokens, block_size, subscribe=watched)
                for cls in (Variant, V1Variant) for watched in (False, True)]
    variants.append(NanoVariant(num_seqs, num_tokens, block_size))
    for step in range(num_tokens):
        shift = step % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            variant.step(step % 1000)
    return variants, [variant.finish() for variant in variants]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--smoke", action="store_true", help="32 sequences x 64 tokens, 2 rounds: a check that it runs")
    args = parser.parse_args(argv)
    if args.smoke:
        args.seqs, args.tokens, args.rounds = 32, 64, 2
    rows = []
    for _ in range(args.rounds):
        variants, num_events = one_round(args.seqs, args.tokens, args.block_size)
        per_token = [v.elapsed / (len(v.seqs) * args.tokens) for v in variants]
        rows.append((*per_token, *num_events))
        v0, v0w, v1, v1w, nano = per_token
        print(f"  round {len(rows)}: v0 {v0 * 1e6:6.3f} us bare, {v0w * 1e6:6.3f} us watched ({v0w / v0:4.2f}x); "
              f"v1 {v1 * 1e6:6.3f} us bare, {v1w * 1e6:6.3f} us watched ({v1w / v1:4.2f}x); v1/v0 {v1 / v0:4.2f}x; "
              f"nano-vllm {nano * 1e6:6.3f} us, v0/nano {v0 / nano:4.2f}x")
    ratios = sorted(r[1] / r[0] for r in rows)
    median = rows[[r[1] / r[0] for r in rows].index(statistics.median_low(ratios))]
    v0, v0w, v1, v1w, nano, _, v0_events, _, v1_events, _ = median
    v1_ratios = sorted(r[2] / r[0] for r in rows)
    nano_ratios = sorted(r[0] / r[4] for r in rows)
    v1_nano_ratios = sorted(r[2] / r[4] for r in rows)
    print(f"workload: {args.seqs} seqs (v0 +{args.seqs // 16} forks, v1 and nano-vllm +{args.seqs // 16} requests "
          f"sharing a prompt) x {args.tokens} tokens, block size {args.block_size}, {args.rounds} rounds in lockstep "
          f"(median round below, by v0's subscriber overhead)")
    print(f"v0 append_token_id + append_slots, no subscriber:        {v0 * 1e6:6.3f} us/token   (target <= 0.6 us)")
    print(f"v0 append_token_id + append_slots, no-op subscriber:     {v0w * 1e6:6.3f} us/token   ({v0_events:,} events)")
    print(f"v0 subscriber overhead:                                  {v0w / v0:6.2f}x       (target <= 1.50x; "
          f"rounds ranged {ratios[0]:.2f}x-{ratios[-1]:.2f}x)")
    print(f"v1 append_token_id + allocate_slots, no subscriber:      {v1 * 1e6:6.3f} us/token")
    print(f"v1 append_token_id + allocate_slots, no-op subscriber:   {v1w * 1e6:6.3f} us/token   ({v1_events:,} events)")
    print(f"v1 / v0 per token, no subscriber:                        {statistics.median(v1_ratios):6.2f}x       "
          f"(median of the rounds; they ranged {v1_ratios[0]:.2f}x-{v1_ratios[-1]:.2f}x)")
    print(f"nano-vllm-style append_token + may_append:               {nano * 1e6:6.3f} us/token   "
          f"(block hash: {'xxh64, as nano-vllm' if xxhash else 'Python hash: xxhash is not installed'})")
    print(f"v0 / nano-vllm, v1 / nano-vllm per token:                {statistics.median(nano_ratios):6.2f}x, "
          f"{statistics.median(v1_nano_ratios):.2f}x (medians of the rounds; v0 ranged "
          f"{nano_ratios[0]:.2f}x-{nano_ratios[-1]:.2f}x)")
    figures = {"v0 us/token": v0 * 1e6, "v0 watched us/token": v0w * 1e6, "v0 subscriber overhead": v0w / v0,
               "v1 us/token": v1 * 1e6, "v1 watched us/token": v1w * 1e6, "v1 / v0": statistics.median(v1_ratios),
               "nano-vllm us/token": nano * 1e6, "v0 / nano-vllm": statistics.median(nano_ratios),
               "v1 / nano-vllm": statistics.median(v1_nano_ratios)}
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
