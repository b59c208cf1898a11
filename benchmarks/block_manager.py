"""Benchmark: the memory planner's cost per decoded token, `Sequence.append_token_id` +
`BlockSpaceManager.append_slots`, with and without an event subscriber (a benchmark, not a test:
it prints figures, it never fails on time).

Workload: 256 sequences x 512 appended tokens, block size 16, a fork every 16 sequences (so
copy-on-write happens) and every sequence freed at the end.

The two variants run in lockstep: two managers with the same sequences, one with a no-op
subscriber, take turns decode step by decode step (the order alternating), so a machine that
speeds up or slows down mid-run (shared hosts do) weighs on both alike. Each round reports its
own ratio; the summary gives the median round.

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


def one_round(num_seqs: int, num_tokens: int, block_size: int) -> tuple[Variant, Variant, int]:
    bare = Variant(num_seqs, num_tokens, block_size, subscribe=False)
    watched = Variant(num_seqs, num_tokens, block_size, subscribe=True)
    for step in range(num_tokens):
        pair = (bare, watched) if step % 2 == 0 else (watched, bare)
        for variant in pair:
            variant.step(step % 1000)
    bare.finish()
    return bare, watched, watched.finish()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seqs", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=512)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    rows = []
    for _ in range(args.rounds):
        bare, watched, num_events = one_round(args.seqs, args.tokens, args.block_size)
        appended = len(bare.seqs) * args.tokens
        rows.append((bare.elapsed / appended, watched.elapsed / appended, num_events))
        print(f"  round {len(rows)}: {rows[-1][0] * 1e6:6.3f} us bare, {rows[-1][1] * 1e6:6.3f} us watched, "
              f"{rows[-1][1] / rows[-1][0]:5.2f}x")
    ratios = sorted(w / b for b, w, _ in rows)
    median = rows[[w / b for b, w, _ in rows].index(statistics.median_low(ratios))]
    bare_us, watched_us, events = median
    print(f"workload: {args.seqs} seqs (+{args.seqs // 16} forks) x {args.tokens} tokens, "
          f"block size {args.block_size}: {appended:,} tokens per variant, "
          f"{args.rounds} rounds in lockstep (median round below)")
    print(f"append_token_id + append_slots, no subscriber:     {bare_us * 1e6:6.3f} us/token   (target <= 0.6 us)")
    print(f"append_token_id + append_slots, no-op subscriber:  {watched_us * 1e6:6.3f} us/token   ({events:,} events)")
    print(f"subscriber overhead:                               {watched_us / bare_us:6.2f}x       (target <= 1.50x; "
          f"rounds ranged {ratios[0]:.2f}x-{ratios[-1]:.2f}x)")


if __name__ == "__main__":
    main()
