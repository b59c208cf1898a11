"""Regenerate the traces shipped in blockviz/traces/ with the real engine and the bundled model.

    python scripts/make_traces.py                 # all of them, bundled tiny-shakespeare on CPU
    python scripts/make_traces.py --only swap     # one
    python scripts/make_traces.py --model DIR     # another checkpoint (for trying things out)

"cpu-tier" plays `blockviz run --kv-manager vllm --kv-offloading-size`'s story (vLLM 0.33 installed:
docs/vllm-core.md); "sglang-story" `blockviz run --kv-manager sglang`'s (SGLang 0.5.23 installed: docs/sglang.md). "hybrid" plays `blockviz run --model tiny-hybrid`'s story on that model (blockviz/session/tiny_hybrid.py:
random weights built on first use; the header names it "tiny-hybrid"), unless --model names another.

Each scenario goes through the same code as `blockviz record` (blockviz.commands.record.record_trace)
and checks that the moment it exists to show really happened (a copy-on-write, a prefix-cache hit,
a swap...); otherwise it stops with an error naming the scenario. Runs are greedy and seeded, on
CPU, so the same model gives the same traces.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from blockviz.commands.record import record_trace  # noqa: E402
from blockviz.session.spec import EngineSpec  # noqa: E402

TRACES_DIR = ROOT / "blockviz" / "traces"


@dataclass
class Scenario:
    name: str
    description: str
    spec: dict[str, Any]
    expect: Callable[[Counter, list, dict], bool]  # (event counts by type, events, header)
    expect_text: str
    later_prompts: dict[int, str] = field(default_factory=dict)  # steps done -> prompt to add then
    story: str | None = None  # a named scenario (blockviz/session/scenario.py) played instead of `spec`


def _kinds(*kinds: str) -> Callable[[Counter, list, dict], bool]:
    return lambda counts, events, header: all(counts[k] for k in kinds)


def _recompute(counts: Counter, events: list, header: dict) -> bool:
    return any(e.type == "preempted" and e.mode == "recompute" for e in events)


def _swap(counts: Counter, events: list, header: dict) -> bool:
    return counts["swap_out"] > 0 and counts["swap_in"] > 0 and any(
        e.type == "preempted" and e.mode == "swap" for e in events)


def _eviction(counts: Counter, events: list, header: dict) -> bool:
    """Cached blocks evicted, and a later request with the first one's opening hits the blocks
    still cached, then misses on one the eviction took (the explainer's "evicted")."""
    from blockviz.model.explain import EVICTED, explain_requests

    last = explain_requests(events, 4, 18, 8)[-1]
    return counts["block_evicted"] > 0 and last.num_hit_blocks > 0 and last.first_miss.verdict == EVICTED


def _v1_story(counts: Counter, events: list, header: dict) -> bool:
    """vLLM v1's story: a chunked prefill, hits for n=2's second request, a recompute preemption, an eviction."""
    chunked = any(e.type == "tokens_scheduled" and any(c + n < t for c, n, t in
                  zip(e.num_computed_tokens, e.num_new_tokens, e.num_tokens)) for e in events)
    return chunked and all(counts[k] for k in ("prefix_cache_hit", "preempted", "block_evicted"))


def _hybrid_story(counts: Counter, events: list, header: dict) -> bool:
    """The hybrid story: a window group lets blocks go mid-request, and a later lookup is cut
    short by the window group while the full-attention group holds the prefix ("window tail freed")."""
    from blockviz.model.explain import WINDOW_TAIL, explain_requests
    from blockviz.model.design import kv_cache_groups_of

    explained = explain_requests(events, header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"],
                                 header["enable_prefix_caching"], header["kv_manager"],
                                 kv_cache_groups=kv_cache_groups_of(header))
    return counts["blocks_skipped"] > 0 and any(
        e.num_hit_blocks > 0 and e.first_miss is not None and e.first_miss.verdict == WINDOW_TAIL for e in explained)


def _cpu_tier_story(counts: Counter, events: list, header: dict) -> bool:
    """The CPU tier's story: stores to the CPU tier, a recompute preemption, and the preempted
    request's prefix loaded back from the tier."""
    preempted = {seq for e in events if e.type == "preempted" and e.mode == "recompute" for seq in e.seq_ids}
    return counts["offload_store"] > 0 and any(e.type == "offload_load" and e.seq_id in preempted for e in events)


def _sglang_story(counts: Counter, events: list, header: dict) -> bool:
    """SGLang's story: the guide finds each radix idea in it (a split, a lock along the path, the page
    floor, lpm's order), and an eviction that freed more slots than RadixCache.evict was asked for."""
    from blockviz.model.guide import Guide

    guide = Guide(header["kv_manager"], header=header)
    guide.scan(events)
    guide.settle()
    ideas = {idea for card in guide.cards for idea in card.ideas}
    more = any(e.type == "radix_evict" and e.num_tokens_evicted > e.num_tokens for e in events)
    return more and {"radix-split", "radix-lock", "page-floor", "lpm-order", "eviction"} <= ideas


ROMEO = "ROMEO: But soft, what light through yonder window breaks?"

SCENARIOS = [
    Scenario(
        "prefill", "prefill allocation: four prompts get their block tables in one step, then decode "
                   "appends slots and fresh blocks",
        dict(prompts=("ROMEO:", "JULIET:", "First Citizen:", "KING RICHARD III:"), max_tokens=20,
             block_size=4, num_gpu_blocks=48, num_cpu_blocks=16),
        _kinds("block_allocated", "slot_appended", "block_freed"), "allocations, slots and frees"),
    Scenario(
        "fork-cow", "n=2: after the prefill the sequence forks (every block ref 2); the first decode "
                    "copies the shared, partly filled last block on write",
        dict(prompts=("ROMEO: O, speak again",), n=2, max_tokens=16, block_size=4, num_gpu_blocks=32,
             num_cpu_blocks=16, temperature=0.8),
        _kinds("fork", "copy_on_write"), "a fork and a copy-on-write"),
    Scenario(
        "prefix-hit", "prefix caching: a second request with the same opening reuses the first one's "
                      "hashed blocks (cache hits), and only computes its own suffix",
        dict(prompts=("ROMEO: But soft, what light through yonder window breaks? It is the east",),
             max_tokens=8, block_size=4, num_gpu_blocks=48, num_cpu_blocks=16, enable_prefix_caching=True),
        _kinds("prefix_cache_hit", "block_hashed"), "a prefix-cache hit",
        later_prompts={2: "ROMEO: But soft, what light through yonder window breaks? It is my lady"}),
    Scenario(
        "eviction", "prefix caching on a small pool: ROMEO's finished blocks stay cached-free, two new "
                    "requests evict some of them, and ROMEO's line again hits the cached ones and misses "
                    "on the first evicted one",
        dict(prompts=(ROMEO,), max_tokens=8, block_size=4, num_gpu_blocks=18, num_cpu_blocks=8,
             enable_prefix_caching=True),
        _eviction, "a hit followed by a miss on an evicted block",
        later_prompts={7: "JULIET: O Romeo, Romeo, wherefore art thou Romeo? Deny thy father",
                       9: "HAMLET: To be, or not to be, that is the question: whether tis nobler",
                       16: ROMEO + " It is the east"}),
    Scenario(
        "swap", "a small GPU pool: decode runs out of blocks, the newest request is swapped out to the "
                "CPU pool and swapped back in when room frees up",
        dict(prompts=("ROMEO:", "JULIET:", "HAMLET:"), max_tokens=40, block_size=4, num_gpu_blocks=16,
             num_cpu_blocks=32, preemption_mode="swap"),
        _swap, "a swap-out and a swap-in"),
    Scenario(
        "recompute", "the same small pool with recompute preemption: the victim's blocks are freed and "
                     "its tokens computed again later",
        dict(prompts=("ROMEO:", "JULIET:", "HAMLET:"), max_tokens=40, block_size=4, num_gpu_blocks=16,
             num_cpu_blocks=32, preemption_mode="recompute"),
        _recompute, "a recompute preemption"),
    Scenario(
        "v1-story", "vLLM v1 (`blockviz run --kv-manager v1`'s story): ROMEO's long prompt prefilled in chunks "
                    "of the step's token budget; JULIET's n=2 as two requests, the second hitting the first's "
                    "blocks; the pool runs out, a request is preempted by recompute and revived from its cached "
                    "blocks; blocks taken from the free queue's head evict their hashes",
        {}, _v1_story, "a chunked prefill, n=2 hits, a recompute preemption and an eviction", story="story-v1"),
    Scenario(
        "hybrid", "a hybrid model (`blockviz run --model tiny-hybrid`'s story; random weights: the text is noise, "
                  "the memory real): sliding-window and full-attention layers keep a block table each over one "
                  "pool; the window slides and its blocks return to the pool mid-request; ROMEO's opening hits "
                  "in both groups; once the window group's freed blocks are evicted, ROMEO's line again hits "
                  "less than the full-attention group holds (the window tail freed)",
        {}, _hybrid_story, "a window sliding mid-request and a hit cut short by the window group",
        story="story-hybrid"),
    Scenario(
        "cpu-tier", "vLLM's CPU tier (`blockviz run --kv-manager vllm --kv-offloading-size`'s story, on vLLM 0.33's "
                    "own scheduler): v1's story with a CPU tier of 64 blocks; vLLM stores full blocks to the tier as "
                    "they are computed; the pool runs out and a request is preempted by recompute; its prefix, "
                    "evicted from the GPU, is loaded back from the CPU tier as hits instead of computed again",
        {}, _cpu_tier_story, "stores to the CPU tier and a preempted request's prefix loaded back from it",
        story="story-cpu-tier"),
    Scenario(
        "sglang-story", "SGLang's radix cache (`blockviz run --kv-manager sglang`'s story, SGLang 0.5.23's own RadixCache "
                        "and SchedulePolicy, page_size 4, lpm): ROMEO's line enters the tree chunk by chunk; his opening "
                        "with another ending splits a node and locks its path; his whole line with more runs before "
                        "HAMLET's (lpm) and its hit stops at a page boundary; an eviction frees whole leaves, more than "
                        "asked",
        {}, _sglang_story, "a split, a lock, the page floor, lpm's order and an eviction freeing more than asked",
        story="story-sglang"),
]


def make_trace(scenario: Scenario, model: str, out_dir: Path, device: str) -> Path:
    from blockviz.model.trace import read_trace

    from blockviz.session.scenario import scenario as named_scenario

    story_model = named_scenario(scenario.story)[1].get("model") if scenario.story is not None else None
    model = model or story_model or "tiny-shakespeare"
    if scenario.story is not None:
        spec = EngineSpec.for_scenario(scenario.story, model=model, device=device, seed=0)
    else:
        spec = EngineSpec.of(model=model, device=device, seed=0, **scenario.spec)
    out = out_dir / f"{scenario.name}.jsonl"

    def between_steps(session, steps_done: int) -> None:
        prompt = scenario.later_prompts.get(steps_done)
        if prompt is not None:
            session.add_request(prompt)

    extra = {"scenario": scenario.name, "description": scenario.description}
    if model == story_model:  # a name resolved to a directory built on this machine: the header keeps the name
        extra["model"] = model
    if scenario.later_prompts:
        extra["later_prompts"] = [[step, prompt] for step, prompt in sorted(scenario.later_prompts.items())]
    recording = record_trace(spec, out, between_steps=between_steps, extra_header=extra)
    events = read_trace(out).events
    counts = Counter(e.type for e in events)
    if not scenario.expect(counts, events, recording.header):
        raise SystemExit(f"make_traces: scenario {scenario.name!r} did not produce {scenario.expect_text} "
                         f"(events: {dict(counts)}); adjust its prompts or pool sizes")
    size = out.stat().st_size
    print(f"{out.relative_to(ROOT) if out.is_relative_to(ROOT) else out}: {recording.num_events} events, "
          f"{recording.num_steps} steps, {size / 1024:.0f} KiB")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="checkpoint (default: the bundled one; a story's own, as hybrid's)")
    parser.add_argument("--device", default="cpu", help="cpu (default; reproducible) or cuda")
    parser.add_argument("--out-dir", type=Path, default=TRACES_DIR)
    parser.add_argument("--only", action="append", choices=[s.name for s in SCENARIOS])
    args = parser.parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        make_trace(scenario, args.model, args.out_dir, args.device)
    return 0


if __name__ == "__main__":
    sys.exit(main())
