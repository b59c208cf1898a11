"""Requests that arrive while the engine runs, and the story `blockviz run` tells by default.

An `Arrival` is a prompt queued once the engine has taken `step` steps (or at once, when the engine
has nothing left to do before then): a live run and a recording play them the same way
(`admit_arrivals`). `DEFAULT_SCENARIO` is what `blockviz run` plays with no `--prompt`: in about a
minute it shows every idea on the bundled model, on a pool small enough to see whole.
- ROMEO's line starts alone: prefill fills a block table, decode appends slot after slot.
- JULIET's arrives with n=2: prefill, then a fork (both samples share every block, ref 2) and a
  copy-on-write when the shared, partly filled last block is first written.
- A second JULIET line with the same opening arrives: with prefix caching it hits her blocks.
- The pool runs out while five sequences grow: the newest request is preempted (swapped out to the
  CPU pool); cached blocks are evicted to make room, and it is swapped back in when blocks free up.
`DEFAULT_V1_SCENARIO` is the story `blockviz run --kv-manager v1` plays instead, on the same pool
(vLLM v1's KV cache manager and scheduler, engine/v1/):
- ROMEO's long line arrives alone and the step's token budget cuts its prefill into chunks.
- JULIET's arrives with n=2: two requests, the second sharing her prompt's full blocks through
  the prefix cache (hits, ref 2), never a fork or a copy-on-write.
- HAMLET and KING RICHARD arrive: the pool runs out, the last running request is preempted by
  recompute (its blocks freed: hashed ones to the free queue's tail), and when it is admitted again
  its cached blocks serve it (hits); blocks taken from the queue's head evict their hashes.
`HYBRID_SCENARIO` ("story-hybrid") is what `blockviz run --model tiny-hybrid` plays: the same pool and
sampling under vLLM v1's manager, on blockviz/session/tiny_hybrid.py's checkpoint (random weights:
its text is noise, its memory real), whose sliding-window layers and full-attention layers keep
one block table each (vLLM's KV-cache groups) over one pool:
- ROMEO's long line arrives alone; one step after its prefill the window slides: the blocks its
  sliding layers will never read again return to the pool mid-request (BlocksSkipped, then
  BlockFreed), still cached, while the full-attention group keeps every block.
- JULIET's line arrives; then ROMEO's opening again with another ending: its lookup hits four
  blocks in both groups (the window group's from the cached blocks it had let go).
- ROMEO's line arrives a third time, once taking blocks from the free queue has evicted some of
  the window group's freed blocks: the full-attention group still holds every full block of the
  prompt, but a hit must end where the window group holds the blocks just before it, so it is cut
  short ("window tail freed", vLLM's HybridKVCacheCoordinator.find_longest_cache_hit). Then the pool
  runs out and that request is preempted by recompute.
`CPU_TIER_SCENARIO` ("story-cpu-tier") is what `blockviz run --kv-manager vllm --kv-offloading-size
[GiB]` plays: v1's story on vLLM 0.33's own scheduler with its CPU tier (vLLM v1's answer to v0's swap,
engine/vllm_core/offload.py), a tier of `CPU_TIER_GIB` unless the flag gives a size:
- as ROMEO's chunks are computed, vLLM's SimpleCPUOffloadScheduler stores copies of his full blocks in
  the CPU tier, keyed by their hashes (and every full block after, as it is computed);
- the pool runs out: KING RICHARD's request is preempted by recompute, its blocks freed; taking
  blocks from the free queue's head evicts their hashes, his prompt's among them;
- when he is admitted again, his prefix misses on the GPU but the CPU tier holds it: its blocks are
  loaded back (hits, not recomputed), and only the rest of his tokens are computed.
`SGLANG_SCENARIO` ("story-sglang") is what `blockviz run --kv-manager sglang` plays: v1's pool, sampling
and token budget on SGLang 0.5.23's own RadixCache and scheduling policy (engine/sglang_core/), pages
of 4 slots, the waiting queue in longest-prefix-match order (sglang_options page_size, schedule_policy=lpm):
- ROMEO's long line is prefilled in chunks; each chunk's pages enter the radix tree.
- ROMEO's opening again with another ending: its match leaves the tree inside a node, which splits
  there; the matched path is locked (lock_ref) up to the root.
- HAMLET's line and then ROMEO's whole line with more arrive together: ROMEO's, with most of it in
  the tree, runs first (lpm); its hit stops at a page boundary, the first line's partial last page
  never being in the tree.
- KING RICHARD's line arrives; once the first requests finish, its allocation asks the tree to evict,
  and SGLang frees whole least-recently-used leaves: more slots than it asked.
`blockviz run` plays it guided: it stops at each of these ideas the first time (blockviz/model/guide.py).
No torch, no textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from blockviz.model.design import has_random_weights
from blockviz.session.tiny_hybrid import TINY_HYBRID
from engine.model_source import DEFAULT_MODEL


@dataclass(frozen=True, slots=True)
class Arrival:
    """A request (`prompt`, `n` samples) queued once the engine has taken `step` steps."""

    step: int
    prompt: str
    n: int = 1


DEFAULT_SCENARIO: tuple[Arrival, ...] = (
    Arrival(0, "ROMEO: But soft, what light through yonder window breaks?"),
    Arrival(3, "JULIET: O Romeo, Romeo, wherefore art thou Romeo?", n=2),
    Arrival(10, "JULIET: O Romeo, Romeo, wherefore art thou gone?"),
    Arrival(16, "HAMLET: To be, or not to be, that is the question."),
)
# `blockviz run`'s engine settings for it (each flag overrides its own): small blocks, so a short
# line spans several and an opening can be shared; a pool that fits on an 80x24 screen and runs
# out once; sampled text that reads as Shakespeare and differs between samples.
DEFAULT_SCENARIO_OPTIONS = {
    "block_size": 4, "num_gpu_blocks": 48, "num_cpu_blocks": 32, "max_tokens": 32, "temperature": 0.8,
    "enable_prefix_caching": True, "preemption_mode": "swap",
}


DEFAULT_V1_SCENARIO: tuple[Arrival, ...] = (
    Arrival(0, "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."),
    Arrival(2, "JULIET: O Romeo, Romeo, wherefore art thou Romeo?", n=2),
    Arrival(4, "HAMLET: To be, or not to be, that is the question."),
    Arrival(6, "KING RICHARD III: Now is the winter of our discontent made glorious summer by this sun of York."),
)
# The v0 story's pool and sampling (so `run --kv-manager v1` takes the same command-line defaults),
# in vLLM v1's manager, with a token budget per step (SchedulerConfig.max_num_batched_tokens) small
# enough that a long prompt is prefilled in chunks.
V1_TOKEN_BUDGET = 16
DEFAULT_V1_SCENARIO_OPTIONS = {
    **{k: v for k, v in DEFAULT_SCENARIO_OPTIONS.items() if k not in ("num_cpu_blocks", "preemption_mode")},
    "kv_manager": "v1", "max_num_batched_tokens": V1_TOKEN_BUDGET,
}


HYBRID_SCENARIO: tuple[Arrival, ...] = (
    DEFAULT_V1_SCENARIO[0],
    Arrival(2, "JULIET: O Romeo, Romeo, wherefore art thou Romeo?"),
    Arrival(4, "ROMEO: But soft, what light through yonder window breaks? It is my lady, O, it is my love!"),
    Arrival(12, DEFAULT_V1_SCENARIO[0].prompt),
)
# v1's story settings (the command line's defaults) with no token budget, on the tiny hybrid model
# (blockviz/session/tiny_hybrid.py, built on first use).
HYBRID_SCENARIO_OPTIONS = {
    **{k: v for k, v in DEFAULT_V1_SCENARIO_OPTIONS.items() if k != "max_num_batched_tokens"}, "model": TINY_HYBRID,
}


CPU_TIER_SCENARIO = DEFAULT_V1_SCENARIO
# The CPU tier's default size, in GiB as vLLM's --kv-offloading-size takes it: 2 MiB, which holds 64
# blocks of the bundled model's (block_size 4), more than the story stores, so the CPU pool never
# evicts and the preempted request's prefix is still there to load back; a pool small enough to fit
# a projector, next to the GPU pool's 48.
CPU_TIER_GIB = 2 / 1024
CPU_TIER_SCENARIO_OPTIONS = {**DEFAULT_V1_SCENARIO_OPTIONS, "kv_manager": "vllm",
                             "vllm_options": {"kv_offloading_size": CPU_TIER_GIB}}


SGLANG_SCENARIO: tuple[Arrival, ...] = (
    DEFAULT_V1_SCENARIO[0],
    Arrival(2, "ROMEO: But soft, what light through yonder window breaks? It is the east, and the moon is pale."),
    Arrival(4, DEFAULT_V1_SCENARIO[2].prompt),
    Arrival(4, DEFAULT_V1_SCENARIO[0].prompt + " Arise, fair sun, and kill the envious moon,"),
    Arrival(12, DEFAULT_V1_SCENARIO[3].prompt),
)
# v1's story settings (the same pool, sampling and per-step token budget, which SGLang takes as its
# chunked_prefill_size) on SGLang's RadixCache: pages of 4 slots (a hit stops at a page boundary)
# and the waiting queue in longest-prefix-match order.
SGLANG_SCENARIO_OPTIONS = {
    **DEFAULT_V1_SCENARIO_OPTIONS, "kv_manager": "sglang",
    "sglang_options": {"page_size": DEFAULT_SCENARIO_OPTIONS["block_size"], "schedule_policy": "lpm"},
}


# The scenarios a live view can play by name (`Visualizer.live(scenario="story")`): the arrivals and
# the engine and sampling settings they were written for.
SCENARIOS = {"story": (DEFAULT_SCENARIO, DEFAULT_SCENARIO_OPTIONS)}
SCENARIOS["story-v1"] = (DEFAULT_V1_SCENARIO, DEFAULT_V1_SCENARIO_OPTIONS)
SCENARIOS["story-hybrid"] = (HYBRID_SCENARIO, HYBRID_SCENARIO_OPTIONS)
SCENARIOS["story-cpu-tier"] = (CPU_TIER_SCENARIO, CPU_TIER_SCENARIO_OPTIONS)
SCENARIOS["story-sglang"] = (SGLANG_SCENARIO, SGLANG_SCENARIO_OPTIONS)


# How many cards each story shows when played with its own settings (blockviz/model/guide.py's
# Guide, the opening card included; tests/test_guided_story.py checks each against its recording):
# a live run's card counter says "of N" before its stream has ended.
STORY_CARDS = {"story": 7, "story-v1": 5, "story-hybrid": 6, "story-cpu-tier": 7, "story-sglang": 7}


def story_cards(header: dict) -> int | None:
    """The number of cards a run shows (STORY_CARDS) when its header is a story's (its arrivals)
    played with that story's model and settings (every setting the header records; a live run's
    tiny-hybrid checkpoint directory is "tiny-hybrid", design.has_random_weights); None otherwise."""
    arrivals = [a.get("prompt") for a in header.get("arrivals") or [] if isinstance(a, dict)]
    header = {**header, "model": TINY_HYBRID} if has_random_weights(header) else header
    for name, (story, options) in SCENARIOS.items():
        if arrivals == [a.prompt for a in story] and name in STORY_CARDS and all(
                header.get(key) in (None, value) for key, value in {"model": DEFAULT_MODEL, **options}.items()):
            return STORY_CARDS[name]
    return None


def is_story(header: dict) -> bool:
    """Whether a run's header records one of the stories (its arrivals are a scenario's: `blockviz
    run`'s v0 story, v1's, the hybrid one, the CPU tier's or SGLang's): replays and notebooks of it
    are guided by default."""
    arrivals = [a.get("prompt") for a in header.get("arrivals") or [] if isinstance(a, dict)]
    return any(arrivals == [a.prompt for a in story] for story, _ in SCENARIOS.values())


def scenario(name: str) -> tuple[tuple[Arrival, ...], dict]:
    """A named scenario's arrivals and settings; a ValueError lists the names."""
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}: the scenarios are {', '.join(sorted(SCENARIOS))}")
    return SCENARIOS[name]


def admit_arrivals(engine, pending: list[Arrival], steps_done: int, params_for) -> list[str]:
    """Queue the pending arrivals that are due (their step reached, or the engine idle before it):
    `params_for(n)` gives each its SamplingParams. Returns the request ids added; `pending` loses
    them."""
    added = []
    while pending and (pending[0].step <= steps_done or not engine.has_unfinished_requests()):
        arrival = pending.pop(0)
        added.append(engine.add_request(arrival.prompt, params_for(arrival.n)))
    return added
