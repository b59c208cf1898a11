"""Lesson 10 (lessons/10_vllm_v1.ipynb): vLLM v1's KV cache manager beside v0's, on fresh engines
(`kv_manager="v1"`: engine/v1/, after vLLM v1 `KVCacheManager`, `BlockPool`,
`FreeKVCacheBlockQueue` and the v1 `Scheduler`).

The lesson has variants (blockviz.lessons.variants): a variant changes the block size, the pools
(the same tokens in blocks of that size) and the token budget of the chunked prefill."""

from __future__ import annotations

import random
from functools import cache
from typing import NamedTuple

from blockviz.lessons import variants
from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import events_of, fresh

WINTER = "Now is the winter of our discontent"  # 10 tokens
HAMLET = "HAMLET: To be, or not to be,"  # 12 tokens: 3 full blocks of 4
CITIZEN = "First Citizen:\nBefore we proceed any further, hear me speak."  # 20 tokens
PREEMPT_PROMPTS = [WINTER, "ROMEO: What light through yonder window breaks?"]
HAMLET_TOKENS, CITIZEN_TOKENS = 12, 20
BLOCK_SIZES = (3, 4, 6)  # each divides Hamlet's 12 tokens and none Winter's 10: whole blocks, a partial one
BUDGETS = (3, 6, 7, 11)  # none divides the 20-token line: its last chunk is a short one


class Figures(NamedTuple):
    """The figures one variant of the lesson computes with: the block size, the pools (POOLS) and
    the chunked prefill's token budget."""

    block_size: int
    num_gpu_blocks: int
    eviction_blocks: int
    preemption_blocks: int
    budget: int

    @property
    def hamlet_blocks(self) -> int:
        return HAMLET_TOKENS // self.block_size

    @property
    def citizen_blocks(self) -> int:
        return -(-CITIZEN_TOKENS // self.block_size)

    def fields(self) -> dict:
        """The figures by name, derived ones too (what hints and the notebook's text are filled with)."""
        return {**self._asdict(), "hamlet_blocks": self.hamlet_blocks, "citizen_blocks": self.citizen_blocks}


# per block size: the default pool, the free-queue pool (too small for Hamlet and the 20-token line
# together) and the preemption pool (too small for both requests to finish together), block 0 the
# null block in each
POOLS = {3: (21, 12, 19), 4: (16, 9, 14), 6: (11, 6, 10)}


@cache
def figures_of(seed: int | None) -> Figures:
    """The figures of variant `seed` (None: the lesson as stored: blocks of 4, a budget of 8)."""
    if seed is None:
        block_size, budget = 4, 8
    else:
        rng = random.Random(seed)
        block_size, budget = rng.choice(BLOCK_SIZES), rng.choice(BUDGETS)
    return Figures(block_size, *POOLS[block_size], budget)


variants.register("10", figures_of)

# what a variant's notebook says in place of the stored lesson's figures (key.py --variants)
VARIANT_TEXT = (
    ("in blocks of 4 tokens", "in blocks of {block_size} tokens"),
    ("on a pool of 9 blocks", "on a pool of {eviction_blocks} blocks"),
    ("needs 5 blocks, then more", "needs {citizen_blocks} blocks, then more"),
    ("on a pool of 14 blocks", "on a pool of {preemption_blocks} blocks"),
    ("(4 per hit; count tokens)", "({block_size} per hit; count tokens)"),
    ("exactly 3 blocks", "exactly {hamlet_blocks} blocks"),
    ("With a budget of 8 tokens a step", "With a budget of {budget} tokens a step"),
)


def figures() -> Figures:
    """This notebook's figures (its variant's, blockviz.lessons.variants.use)."""
    return figures_of(variants.active())


def options(kv_manager: str, num_gpu_blocks: int | None = None, **more) -> dict:
    """The lesson's engine: the variant's block size, no CPU pool, v0's or v1's manager, and
    `num_gpu_blocks` (the variant's default pool unless given)."""
    fig = figures()
    return {"block_size": fig.block_size, "num_gpu_blocks": num_gpu_blocks or fig.num_gpu_blocks,
            "num_cpu_blocks": 0, "kv_manager": kv_manager, **more}


@exercise("10", "my_child_hits", "both children are admitted in the same step, and the first one caches each block "
                                 "as soon as it is full.",
          slips=[Slip(lambda: -(-10 // figures().block_size), "only full blocks get a hash: the last block is partly "
                                                              "filled, so each child has its own."),
                 Slip(0, "v1 caches a full block as soon as its tokens have slots, so the second child, planned "
                         "in the same step, already finds it.")],
          praise="the full blocks are shared through the cache; the partly filled one never is, so no copy is needed.",
          unit="blocks", other_unit=("tokens", lambda: check_child_hits.truth() * figures().block_size))
def check_child_hits():
    """Prefix-cache hits of n=2's second child in v1 for the 10-token prompt."""
    from engine.sequence import SamplingParams

    with fresh(options("v1"), prompts=WINTER,
               sampling_params=SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=8)) as viz:
        viz.step()
        return viz.state.num_prefix_hits


def hamlet_then_citizen() -> tuple[list[int], int]:
    """Hamlet's table on the variant's small v1 pool (block 0 the null block), and the first block
    evicted when the 20-token request follows it."""
    return _hamlet_then_citizen(figures())


@cache
def _hamlet_then_citizen(fig: Figures) -> tuple[list[int], int]:
    from engine import events as ev
    from engine.sequence import SamplingParams

    params = SamplingParams(max_tokens=4, ignore_eos=True)
    with fresh(options("v1", fig.eviction_blocks)) as viz:
        request_id = viz.add_request(HAMLET, params)
        viz.run_to_completion()
        table = _table_of(viz, request_id)
        viz.add_request(CITIZEN, params)
        return table, viz.run_until(ev.BlockEvicted.type).block


def _table_of(viz, request_id: str) -> list[int]:
    """The blocks a finished request held, in table order, from its allocation and hit events."""
    from engine import events as ev

    seq_id = viz.state.requests[request_id][0]
    held = [(e.logical_index, e.block) for e in viz.events
            if isinstance(e, (ev.BlockAllocated, ev.PrefixCacheHit)) and seq_id in e.seq_ids]
    return [block for _, block in sorted(held)]


@exercise("10", "my_evicted", "v1 frees a request's blocks last first, and hashed blocks join the tail of the free "
                              "queue in that order; blocks are popped from the head.",
          slips=[Slip(lambda: hamlet_then_citizen()[0][0], "which end of the chain went to the queue first, "
                                                           "and from which end is the queue popped?"),
                 Slip(lambda: hamlet_then_citizen()[0][-1], "the partly filled block had no hash: popping it evicts "
                                                           "nothing.")],
          praise="the chain loses its tail first, so its head, the part other prompts share, lives longest.")
def check_evicted():
    """The first of Hamlet's cached blocks the pool evicts."""
    return hamlet_then_citizen()[1]


def preemption_run(kv_manager: str) -> dict:
    """The two requests on the variant's preemption pool: tokens lost per preemption, tokens the
    cache served back to the first victim when it was admitted again, and the tokens run through
    the model."""
    return _preemption_run(kv_manager, figures())


@cache
def _preemption_run(kv_manager: str, fig: Figures) -> dict:
    from engine import events as ev
    from engine.sequence import SamplingParams

    config = options(kv_manager, fig.preemption_blocks)
    with fresh(config, prompts=PREEMPT_PROMPTS, sampling_params=SamplingParams(max_tokens=20, ignore_eos=True)) as viz:
        viz.run_to_completion()
        preempted = events_of(viz, ev.Preempted)
        served = 0
        if preempted:
            victim, after = preempted[0].seq_ids[0], preempted[0].seq_no
            served = config["block_size"] * sum(1 for e in events_of(viz, ev.PrefixCacheHit) if victim in e.seq_ids and e.seq_no > after)
        return {"lost": [e.num_tokens_lost for e in preempted], "served": served,
                "computed": sum(e.num_tokens for e in events_of(viz, ev.StepStarted))}


@exercise("10", "my_served", "count the victim's prefix-cache hits when it is admitted again, {block_size} tokens "
                             "each; tail-first eviction took the end of its chain.",
          slips=[Slip(lambda: preemption_run("v1")["lost"][0], "the other request kept growing after the preemption "
                                                               "and took some of the freed blocks: their hashes are "
                                                               "gone."),
                 Slip(0, "freed blocks keep their hash in v1 until the pool hands them out again.")],
          unit="tokens", other_unit=("blocks", lambda: check_served.truth() // figures().block_size))
def check_served():
    """Tokens the prefix cache served back to the v1 victim when it was admitted again."""
    return preemption_run("v1")["served"]


@exercise("10", "my_aligned_hits", "v1 serves at most num_tokens - 1 tokens from the cache, and hits come in whole "
                                   "blocks.",
          slips=[Slip(lambda: figures().hamlet_blocks, "every block of the line is cached, but serving all 12 tokens "
                                                       "would leave nothing to compute the next token's logits from.")],
          unit="blocks", other_unit=("tokens", lambda: check_aligned_hits.truth() * figures().block_size))
def check_aligned_hits():
    """Hits of the 12-token prompt sent a second time, in v1."""
    from engine.sequence import SamplingParams

    with fresh(options("v1")) as viz:
        viz.add_request(HAMLET, SamplingParams(max_tokens=4))
        viz.run_to_completion()
        before = viz.state.num_prefix_hits
        viz.add_request(HAMLET, SamplingParams(max_tokens=4))
        viz.step()
        return viz.state.num_prefix_hits - before


@exercise("10", "my_chunk_steps", "a step computes at most max_num_batched_tokens of the prompt: count the steps "
                                  "it takes to compute all 20 of its tokens.",
          slips=[Slip(1, "that is v0's prefill: the whole prompt in one step. v1 cuts it to the token budget."),
                 Slip(lambda: CITIZEN_TOKENS // figures().budget,
                      "add up the tokens those steps compute and compare the sum with the prompt's length.")])
def check_chunk_steps():
    """Steps the 20-token prompt's prefill takes in v1 with the variant's token budget."""
    from engine import events as ev
    from engine.sequence import SamplingParams

    with fresh(options("v1", max_num_batched_tokens=figures().budget), prompts=CITIZEN,
               sampling_params=SamplingParams(max_tokens=3)) as viz:
        viz.run_to_completion()
        return sum(1 for e in events_of(viz, ev.TokensScheduled) if e.num_computed_tokens[0] < e.num_tokens[0] - 1)
