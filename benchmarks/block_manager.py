"""Benchmark: the memory planner's cost per decoded token, with and without an event subscriber
(a benchmark, not a test: it prints figures, it never fails on time), for both designs:
v0: `Sequence.append_token_id` + `BlockSpaceManager.append_slots`;
v1: `Sequence.append_token_id` + `KVCacheManager.allocate_slots(seq, 1)` (the scheduler's call for
one decode token, hashing and caching each block as it fills) + the computed-token count.

Workload: 256 sequences x 512 appended tokens, block size 16, and every sequence freed at the end;
v0 forks every 16th sequence (so copy-on-write happens), v1 gives it a second request with the
same prompt instead (n > 1 in v1), which shares the prompt's block through the prefix cache.

The four variants run in lockstep: managers with the same sequences take turns decode step by
decode step (the order rotating), so a machine that speeds up or slows down mid-run (shared hosts
do) weighs on all alike. Each round reports its own ratios; the summary gives the median round.

    python benchmarks/block_manager.py [--seqs 256] [--tokens 512] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engine import BlockSpaceManager, EventBus, Sequence, SequenceGroup, SequenceStatus  # noqa: E402
from engine.v1 import KVCacheManager  # noqa: E402


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


def one_round(num_seqs: int, num_tokens: int, block_size: int) -> tuple[list, list[int]]:
    """v0 bare, v0 watched, v1 bare, v1 watched, in lockstep; returns them and their event counts."""
    variants = [cls(num_seqs, num_tokens, block_size, subscribe=watched)
                for cls in (Variant, V1Variant) for watched in (False, True)]
    for step in range(num_tokens):
        shift = step % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            variant.step(step % 1000)
    return variants, [variant.finish() for variant in variants]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        variants, num_events = one_round(args.seqs, args.tokens, args.block_size)
        per_token = [v.elapsed / (len(v.seqs) * args.tokens) for v in variants]
        rows.append((*per_token, *num_events))
        v0, v0w, v1, v1w = per_token
        print(f"  round {len(rows)}: v0 {v0 * 1e6:6.3f} us bare, {v0w * 1e6:6.3f} us watched ({v0w / v0:4.2f}x); "
              f"v1 {v1 * 1e6:6.3f} us bare, {v1w * 1e6:6.3f} us watched ({v1w / v1:4.2f}x); v1/v0 {v1 / v0:4.2f}x")
    ratios = sorted(r[1] / r[0] for r in rows)
    median = rows[[r[1] / r[0] for r in rows].index(statistics.median_low(ratios))]
    v0, v0w, v1, v1w, _, v0_events, _, v1_events = median
    v1_ratios = sorted(r[2] / r[0] for r in rows)
    print(f"workload: {args.seqs} seqs (v0 +{args.seqs // 16} forks, v1 +{args.seqs // 16} requests sharing a "
          f"prompt) x {args.tokens} tokens, block size {args.block_size}, {args.rounds} rounds in lockstep "
          f"(median round below, by v0's subscriber overhead)")
    print(f"v0 append_token_id + append_slots, no subscriber:        {v0 * 1e6:6.3f} us/token   (target <= 0.6 us)")
    print(f"v0 append_token_id + append_slots, no-op subscriber:     {v0w * 1e6:6.3f} us/token   ({v0_events:,} events)")
    print(f"v0 subscriber overhead:                                  {v0w / v0:6.2f}x       (target <= 1.50x; "
          f"rounds ranged {ratios[0]:.2f}x-{ratios[-1]:.2f}x)")
    print(f"v1 append_token_id + allocate_slots, no subscriber:      {v1 * 1e6:6.3f} us/token")
    print(f"v1 append_token_id + allocate_slots, no-op subscriber:   {v1w * 1e6:6.3f} us/token   ({v1_events:,} events)")
    print(f"v1 / v0 per token, no subscriber:                        {statistics.median(v1_ratios):6.2f}x       "
          f"(median of the rounds; they ranged {v1_ratios[0]:.2f}x-{v1_ratios[-1]:.2f}x)")


if __name__ == "__main__":
    main()
