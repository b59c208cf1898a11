"""Lesson 12 (lessons/12_questions_vllm_users_ask.ipynb): the questions vLLM users bring to its issue
tracker, each reproduced on a fresh engine (the bundled model on engine/v1, blocks of 16 as vLLM's
default) and set beside what vLLM 0.33's source says.

Each `run_*` function runs one section's workload on an engine of its own, once per process
(`functools.cache`), and returns the figures the notebook prints and the checks compare with. The
vLLM facts the lesson states (log lines, messages, defaults, option names) are held against vLLM's
own functions and classes in tests/test_lessons_vllm.py:

- `max_concurrency`: vLLM `vllm/v1/core/kv_cache_utils.py` `get_max_concurrency_for_kv_cache_config`
  (num_blocks over the blocks one max_model_len request takes), logged by `update_kv_cache_capacity`.
- `vllm_refusal`: the ValueError of `vllm/v1/core/kv_cache_planning.py` `_check_enough_kv_cache_memory`,
  with `estimate_max_model_len`'s figure.
- `run_full_pool`: `BlockPool.get_usage` (`vllm/v1/core/block_pool.py`): 1 - free / (num_gpu_blocks - 1),
  where a cached block no request holds is free.
- `OFFLOAD_OPTIONS`: `OffloadConfig.uva.cpu_offload_gb` (`vllm/config/offload.py`) and
  `CacheConfig.kv_offloading_size` (`vllm/config/cache.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from blockviz.lessons.checks import Slip, close_to, exercise
from blockviz.lessons.engines import events_of, fresh

MiB = 2**20
BLOCK_SIZE = 16  # vLLM's default block size on GPUs
SIZING_BUDGET = 5 * MiB  # kv_cache_memory_bytes of the sizing sections
SMALL_BUDGET = 1 * MiB  # kv_cache_memory_bytes of the refusal section
LONG_PROMPT = 150  # tokens of the request the small pool refuses

# vLLM 0.33's two offloading options, and what each moves to the CPU (vllm/config/offload.py, vllm/config/cache.py)
OFFLOAD_OPTIONS = {"cpu_offload_gb": "model weights", "kv_offloading_size": "KV cache blocks"}


def options(**more) -> dict:
    """The lesson's engine: the bundled model on engine/v1, blocks of 16, no CPU pool, on the CPU
    (the figures, a block's bytes among them, are the CPU's on every machine)."""
    return {"kv_manager": "v1", "block_size": BLOCK_SIZE, "num_cpu_blocks": 0, "device": "cpu", **more}


def prompt(num_tokens: int, start: int = 100) -> dict:
    """A prompt of `num_tokens` token ids counting up from `start` (different starts: different prompts)."""
    return {"prompt_token_ids": [start + i for i in range(num_tokens)]}


def params(max_tokens: int):
    """Greedy sampling of exactly `max_tokens` tokens (the EOS token does not stop it)."""
    from engine.sequence import SamplingParams

    return SamplingParams(max_tokens=max_tokens, ignore_eos=True)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def tokens_of(viz, request_id: str) -> list[int]:
    """The tokens `request_id`'s (first) sequence sampled, in order."""
    from engine import events as ev

    seq_id = viz.state.requests[request_id][0]
    return [e.token_id for e in events_of(viz, ev.TokenGenerated) if e.seq_id == seq_id]


# ---------------------------------------------------------------- 2-3: how many requests fit, the whole GPU


def max_concurrency(num_blocks: int, block_size: int, max_model_len: int) -> float:
    """The figure of vLLM's "Maximum concurrency for N tokens per request: X" line, one full-attention
    group: the pool's blocks (block 0, the null block, among them) over cdiv(max_model_len, block_size)
    (vLLM `get_max_concurrency_for_kv_cache_config`)."""
    return num_blocks / cdiv(max_model_len, block_size)


def concurrency_line(num_blocks: int, block_size: int, max_model_len: int) -> str:
    """vLLM's log line for this pool (`update_kv_cache_capacity`, on a GPU)."""
    concurrency = max_concurrency(num_blocks, block_size, max_model_len)
    return (f"GPU KV cache size: {int(concurrency * max_model_len):,} tokens, Maximum concurrency for "
            f"{max_model_len:,} tokens per request: {concurrency:.2f}x")


@dataclass(frozen=True)
class Sizing:
    """The sizing run: the pool a KV budget gives, its bytes held before any request, the weights'
    bytes, and the most max_model_len requests that ran in one step."""

    budget_bytes: int
    num_gpu_blocks: int
    block_bytes: int
    pool_bytes: int
    weights_bytes: int
    max_model_len: int
    most_running: int


@cache
def run_sizing() -> Sizing:
    """An engine with a KV budget of SIZING_BUDGET (vLLM's kv_cache_memory_bytes): its pool and bytes
    right after start, then three requests of max_model_len tokens each, run to the end."""
    from engine import events as ev
    from engine.kv_sizing import weights_bytes

    with fresh(options(kv_cache_memory_bytes=SIZING_BUDGET)) as viz:
        engine = viz.llm.engine
        cache_engine = engine.cache_engine
        sizing = dict(budget_bytes=SIZING_BUDGET, num_gpu_blocks=cache_engine.num_gpu_blocks,
                      block_bytes=cache_engine.block_bytes, pool_bytes=cache_engine.pool_bytes("gpu"),
                      weights_bytes=weights_bytes(engine.model), max_model_len=engine.max_model_len)
        for k in range(3):
            viz.add_request(prompt(engine.max_model_len - 2, 100 + 300 * k), params(2))
        viz.run_to_completion()
        most = max(len(e.seq_ids) for e in events_of(viz, ev.StepStarted))
        return Sizing(**sizing, most_running=most)


@exercise("12", "my_concurrency", "the log line is worked out from blocks before any request runs; the section names "
                                  "the function that computes it (answer as a number of requests).",
          slips=[Slip(lambda: run_sizing().most_running,
                      "that is how many ran at once on the engine; the log line is a ratio of blocks, not a count of "
                      "requests admitted."),
                 Slip(lambda: (run_sizing().num_gpu_blocks - 1) / cdiv(run_sizing().max_model_len, BLOCK_SIZE),
                      "vLLM divides the pool's whole block count, the null block included.")],
          praise="vLLM logs a ratio of blocks; the requests that really run at once are fewer when they grow to "
                 "max_model_len, more when they are short.",
          same=close_to)
def check_concurrency():
    """The concurrency vLLM would log for the sizing run's pool."""
    sizing = run_sizing()
    return max_concurrency(sizing.num_gpu_blocks, BLOCK_SIZE, sizing.max_model_len)


@exercise("12", "my_pool_bytes", "when does vLLM allocate its KV pool: as requests come, or before the first? "
                                 "(answer in bytes)",
          slips=[Slip(0, "the pool is allocated at start, not as requests come: an idle engine already holds it."),
                 Slip(lambda: run_sizing().block_bytes, "that is one block; the engine allocates all of them at once.")],
          praise="the KV pool is taken whole at start: that is the memory nvidia-smi shows for an idle vLLM.")
def check_pool_bytes():
    """Bytes of the sizing run's KV pool tensors right after start (no request yet)."""
    return run_sizing().pool_bytes


# ---------------------------------------------------------------- 4: max seq len larger than the KV cache


def estimated_max_model_len(available_bytes: int, block_bytes: int, block_size: int, max_model_len: int) -> int:
    """The longest context whose blocks fit `available_bytes`, for one full-attention group (what vLLM
    `estimate_max_model_len`'s binary search finds: whole blocks of the budget, at most max_model_len)."""
    return min(max_model_len, available_bytes // block_bytes * block_size)


def format_gib(num_bytes: int) -> str:
    """Bytes in GiB as vLLM's `format_gib` prints them (two decimals)."""
    return f"{round(num_bytes / 2**30, 2)}"


def vllm_refusal(available_bytes: int, block_bytes: int, block_size: int, max_model_len: int) -> str:
    """The ValueError vLLM raises at start when one request of max_model_len does not fit the KV
    memory (`_check_enough_kv_cache_memory`), in its words, for these figures."""
    needed = cdiv(max_model_len, block_size) * block_bytes
    estimated = estimated_max_model_len(available_bytes, block_bytes, block_size, max_model_len)
    estimated_msg = (f"Based on the available memory, the estimated maximum model length is {estimated}. "
                     if estimated > 0 else "")
    return (f"To serve at least one request with the model's max seq len ({max_model_len}), "
            f"({format_gib(needed)} GiB KV cache is needed, which is larger than the available KV cache memory "
            f"({format_gib(available_bytes)} GiB). {estimated_msg}Try increasing `gpu_memory_utilization` (which "
            f"also controls CPU memory on the CPU backend) or decreasing `max_model_len` when initializing the "
            f"engine. See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")


@dataclass(frozen=True)
class Refusal:
    """The small pool's run: its blocks, and how the long request ended (reason and detail)."""

    num_gpu_blocks: int
    block_bytes: int
    max_model_len: int
    reason: str
    detail: str


@cache
def run_refusal() -> Refusal:
    """An engine with a KV budget of SMALL_BUDGET, smaller than one max_model_len request, asked for a
    LONG_PROMPT-token request."""
    from engine import events as ev

    with fresh(options(kv_cache_memory_bytes=SMALL_BUDGET)) as viz:
        engine = viz.llm.engine
        viz.add_request(prompt(LONG_PROMPT), params(10))
        viz.run_to_completion()
        (finished,) = events_of(viz, ev.SequenceFinished)
        return Refusal(engine.cache_engine.num_gpu_blocks, engine.cache_engine.block_bytes, engine.max_model_len,
                       finished.reason, finished.detail)


@exercise("12", "my_estimated_len", "vLLM's estimate is worked out from the budget's bytes, in whole blocks (answer in "
                                    "tokens).",
          slips=[Slip(lambda: (run_refusal().num_gpu_blocks - 1) * BLOCK_SIZE,
                      "vLLM's estimate is made from the budget's bytes, before the pool sets block 0 aside."),
                 Slip(lambda: run_refusal().max_model_len, "that is the model's max seq len, which does not fit."),
                 Slip(lambda: SMALL_BUDGET // run_refusal().block_bytes, "that counts blocks; give the tokens they hold.")],
          praise="vLLM refuses to start and names the length that would fit; `--max-model-len` at or below it starts.")
def check_estimated_len():
    """The maximum model length vLLM's refusal would estimate for the small budget."""
    refusal = run_refusal()
    return estimated_max_model_len(SMALL_BUDGET, refusal.block_bytes, BLOCK_SIZE, refusal.max_model_len)


# ---------------------------------------------------------------- 5: preempted by recompute

PRESSURE_BLOCKS = 12  # 11 usable blocks: three requests of 40 + 16 tokens need 4 blocks each


@dataclass(frozen=True)
class Pressure:
    """The pressure run: each preemption as (request name, mode, tokens whose K/V was lost)."""

    preemptions: tuple[tuple[str, str, int], ...]


@cache
def run_pressure(kv_manager: str = "v1") -> Pressure:
    """On `kv_manager` (our v1, or "vllm": vLLM's own objects), requests A, B, C (40 tokens each, 16 sampled) on a pool of PRESSURE_BLOCKS blocks: each
    starts in 3 blocks and needs a fourth in the same decode step."""
    from engine import events as ev

    with fresh(options(num_gpu_blocks=PRESSURE_BLOCKS, kv_manager=kv_manager)) as viz:
        names = {viz.add_request(prompt(40, 100 + 300 * k), params(16)): name for k, name in enumerate("ABC")}
        viz.run_to_completion()
        return Pressure(tuple((names[e.request_id], e.mode, e.num_tokens_lost) for e in events_of(viz, ev.Preempted)))


@exercise("12", "my_victim", "all three need a block in the same step; vLLM's scheduler (first come, first served) "
                             "takes its victim from one end of the running list (answer \"A\", \"B\" or \"C\").",
          slips=[Slip("A", "A came first: it is the last the scheduler would give up.")],
          praise="the last admitted goes first (Scheduler.schedule pops self.running[-1]); its K/V is freed and "
                 "computed again when it returns.")
def check_victim():
    """The request preempted first in the pressure run."""
    return run_pressure().preemptions[0][0]


# ---------------------------------------------------------------- 6-7: usage at 100 %, usage after requests finish

FULL_POOL_BLOCKS = 13  # 12 usable: A, B and C hold 4 each


@dataclass(frozen=True)
class FullPool:
    """The full-pool run: per step (step, vLLM's usage, requests waiting), D's first step, the usage
    after every request finished and the blocks that still had a hash then."""

    steps: tuple[tuple[int, float, int], ...]
    d_admitted_step: int
    usage_after: float
    cached_after: int


def full_pool_requests(viz) -> str:
    """A (56 tokens, 4 sampled), B and C (56 tokens, 8 sampled) fill the 12 usable blocks; D (20 tokens)
    arrives with them. Returns D's request id."""
    viz.add_request(prompt(56, 100), params(4))
    viz.add_request(prompt(56, 400), params(8))
    viz.add_request(prompt(56, 700), params(8))
    return viz.add_request(prompt(20, 1000), params(4))


def full_pool_figures(viz) -> FullPool:
    """`full_pool_requests` on `viz`'s engine, stepped to the end, reading vLLM's usage metric
    (BlockPool.get_usage) and the requests waiting after every step."""
    from engine import events as ev

    d = full_pool_requests(viz)
    pool = viz.llm.engine.scheduler.kv_cache_manager.block_pool
    steps = []
    while (finished := viz.run_until(ev.StepFinished.type)) is not None:
        waiting = sum(1 for seq in viz.state.seqs.values() if seq.status == "waiting")
        steps.append((finished.step, round(pool.get_usage(), 3), waiting))
    d_seq = viz.state.requests[d][0]
    first = min(e.step for e in events_of(viz, ev.StepStarted) if d_seq in e.seq_ids)
    cached = sum(1 for block in pool.blocks if block.block_hash is not None)
    return FullPool(tuple(steps), first, pool.get_usage(), cached)


@cache
def run_full_pool() -> FullPool:
    """`full_pool_figures` on a pool of FULL_POOL_BLOCKS."""
    with fresh(options(num_gpu_blocks=FULL_POOL_BLOCKS)) as viz:
        return full_pool_figures(viz)


@exercise("12", "my_admitted_step", "D needs free blocks, and none come back until a request finishes (answer a step "
                                    "number).",
          slips=[Slip(4, "A's blocks come back at the end of its last step; D is scheduled in the step after."),
                 Slip(5, "that is the synchronous order: under vLLM 0.33's default asynchronous scheduling, when is "
                         "the step after A's last one planned, and when does A's last token free its blocks?"),
                 Slip(2, "D waits until blocks are free: nothing is preempted for a waiting request.")],
          praise="at 100 % usage new requests wait in the queue; they start as running ones finish.")
def check_admitted_step():
    """The step D is first scheduled in, in the full-pool run."""
    return run_full_pool().d_admitted_step


@exercise("12", "my_usage_after", "vLLM's usage counts the blocks not on the free queue; where does a cached block go "
                                  "when its last request finishes? (answer a fraction between 0 and 1)",
          slips=[Slip(lambda: run_full_pool().cached_after / (FULL_POOL_BLOCKS - 1),
                      "those blocks keep their hashes, but vLLM 0.33's get_usage counts a cached block no request "
                      "holds as free."),
                 Slip(1, "the requests have finished and given their blocks back.")],
          praise="cached blocks no request holds are free to vLLM's usage metric: they are evicted only when a "
                 "block is needed.",
          same=close_to)
def check_usage_after():
    """vLLM's usage metric after every request of the full-pool run finished."""
    return run_full_pool().usage_after


# ---------------------------------------------------------------- 8: multi-turn chats

TURN1_PROMPT = 40  # tokens of turn 1's prompt
TURN1_SAMPLED = 10  # tokens turn 1 samples
TURN2_NEW = 12  # tokens the user adds in turn 2


@dataclass(frozen=True)
class Chat:
    """The chat run: tokens of turn 2's prompt, and the tokens the cache served it (whole turn 1 sent
    back as is, then with one token of turn 1 changed, as a chat template that rewrites history)."""

    turn2_tokens: int
    hits: int
    hits_edited: int
    edited_at: int


@cache
def run_chat(kv_manager: str = "v1") -> Chat:
    """On `kv_manager`: turn 1 (TURN1_PROMPT tokens, TURN1_SAMPLED sampled) runs to the end; turn 2 sends turn 1's prompt
    and answer back with TURN2_NEW new tokens; then the same turn 2 with token 20 changed."""
    with fresh(options(num_gpu_blocks=64, kv_manager=kv_manager)) as viz:
        first = prompt(TURN1_PROMPT)["prompt_token_ids"]
        turn1 = viz.add_request({"prompt_token_ids": first}, params(TURN1_SAMPLED))
        viz.run_to_completion()
        history = first + tokens_of(viz, turn1)
        turn2 = history + prompt(TURN2_NEW, 1500)["prompt_token_ids"]
        again = viz.add_request({"prompt_token_ids": turn2}, params(2))
        viz.step()
        hits = viz.insight.explain(again).num_hit_tokens
        viz.run_to_completion()
        edited_at = 20
        edited = turn2[:edited_at] + [turn2[edited_at] + 1] + turn2[edited_at + 1:]
        third = viz.add_request({"prompt_token_ids": edited}, params(2))
        viz.step()
        return Chat(len(turn2), hits, viz.insight.explain(third).num_hit_tokens, edited_at)


@exercise("12", "my_turn2_hits", "which of turn 1's blocks got a hash? Look hard at the last one (answer in tokens).",
          slips=[Slip(TURN1_PROMPT + TURN1_SAMPLED, "the last block of turn 1 is partly filled: it has no hash."),
                 Slip(TURN1_PROMPT, "turn 1's answer is cached too: its blocks fill as it decodes."),
                 Slip(3, "that is a count of blocks; give the tokens they hold.")],
          praise="turn 2 misses only turn 1's last, partly filled block, and computes it again.")
def check_turn2_hits():
    """Tokens of turn 2 served from the cache in the chat run."""
    return run_chat().hits


# ---------------------------------------------------------------- 9: greedy output under two batch shapes

BATCH_DTYPE = "float16"
BATCH_SAMPLED = 16


@dataclass(frozen=True)
class BatchShapes:
    """The batch-shape run: one prompt's greedy tokens alone (no cache), and again in a batch of four
    whose first blocks come from the prefix cache; how many of them differ."""

    alone: tuple[int, ...]
    batched: tuple[int, ...]
    hit_tokens: int

    @property
    def num_different(self) -> int:
        return sum(a != b for a, b in zip(self.alone, self.batched))


@cache
def run_batch_shapes() -> BatchShapes:
    """On float16: a 40-token prompt alone, run to the end; then the same prompt beside three others,
    in one batch, its first two blocks served by the cache."""
    with fresh(options(num_gpu_blocks=64, dtype=BATCH_DTYPE)) as viz:
        alone = viz.add_request(prompt(40), params(BATCH_SAMPLED))
        viz.run_to_completion()
        batched = viz.add_request(prompt(40), params(BATCH_SAMPLED))
        for k in range(3):
            viz.add_request(prompt(24 + 8 * k, 500 + 200 * k), params(BATCH_SAMPLED))
        viz.step()
        hits = viz.insight.explain(batched).num_hit_tokens
        viz.run_to_completion()
        return BatchShapes(tuple(tokens_of(viz, alone)), tuple(tokens_of(viz, batched)), hits)


@exercise("12", "my_different", "a cache hit hands back the K/V numbers computed before; what changes a float16 "
                                "result is the order its additions run in, which is the kernels' choice (answer in "
                                "tokens, counted on this run).",
          slips=[Slip(BATCH_SAMPLED, "the cache stores the very numbers a prefill computes; it cannot change every "
                                     "token.")],
          praise="here the tokens agree; on a GPU the kernels pick their tiling by batch shape, and float16 sums "
                 "added in another order may tip a greedy choice.")
def check_different():
    """How many greedy tokens differ between the prompt alone and in the batch with cache hits."""
    return run_batch_shapes().num_different


# ---------------------------------------------------------------- 10: hybrid models


@cache
def run_hybrid(kv_manager: str = "v1") -> tuple[int, int]:
    """On `kv_manager` and lesson 11's tiny hybrid checkpoint (sliding window 4 and full attention, blocks of 4): a
    16-token request runs to the end, then comes again. Returns (its tokens, the tokens served)."""
    from blockviz.lessons import lesson11

    with fresh({**lesson11.hybrid_options(32), "kv_manager": kv_manager, "device": "cpu"}) as viz:
        first = {"prompt_token_ids": list(lesson11.A_PROMPT)}
        viz.add_request(first, params(2))
        viz.run_to_completion()
        again = viz.add_request(first, params(2))
        viz.step()
        return len(lesson11.A_PROMPT), viz.insight.explain(again).num_hit_tokens


@exercise("12", "my_hybrid_hits", "nothing evicted the first request's blocks; recall what a hit can never include "
                                  "(lesson 10) (answer in tokens).",
          slips=[Slip(0, "attention groups of a hybrid model are cached block by block, as a full model's."),
                 Slip(16, "the last prompt token is always computed, and hits come in whole blocks of 4."),
                 Slip(3, "that counts blocks; give the tokens they hold.")],
          praise="a hybrid attention model hits like a full one while its window blocks stay cached; Mamba layers "
                 "are the case vLLM treats apart (mamba_cache_mode).")
def check_hybrid_hits():
    """Tokens the repeated 16-token request is served on the tiny hybrid checkpoint."""
    return run_hybrid()[1]


# ---------------------------------------------------------------- 11: cpu_offload_gb and kv_offloading_size


@exercise("12", "my_kv_option", "one of the two options moves part of the model's weights to the CPU; the other gives "
                                "the KV cache a CPU tier (answer the option's name as a string).",
          slips=[Slip("cpu_offload_gb", "cpu_offload_gb streams weights from the CPU in every forward pass; the KV "
                                        "pool keeps its size.")],
          praise="KV offloading is kv_offloading_size (--kv-offloading-size, in GiB); cpu_offload_gb leaves the KV "
                 "cache where it was.")
def check_kv_option():
    """The vLLM option that offloads KV cache blocks to the CPU."""
    (name,) = [name for name, what in OFFLOAD_OPTIONS.items() if what == "KV cache blocks"]
    return name
