"""Lesson 13 (lessons/13_two_designs_of_prefix_caching.ipynb): one multi-turn chat workload through two
designs of prefix caching, each on the bundled model: vLLM v1's hashed full blocks (engine/v1, blocks
of 16, vLLM's default) and SGLang 0.5.23's radix tree (`kv_manager="sglang"`: SGLang's own
RadixCache, allocator and scheduling policy, page_size 1, SGLang's default).

`run_chat` plays the workload on an engine of its own, once per process (`functools.cache`), and
returns the figures the notebook prints and the checks compare with. What the lesson states is held
against each project's own objects in tests/test_lesson13.py:

- hits: vLLM `vllm/v1/core/kv_cache_manager.py` `KVCacheManager.get_computed_blocks` (whole blocks
  keyed by `BlockPool.cache_full_blocks`); SGLang `sglang/srt/mem_cache/radix_cache.py`
  `RadixCache.match_prefix` (the key cut to whole pages) and `insert` at `release_kv_cache`
  (`sglang/srt/mem_cache/common.py`).
- eviction: vLLM `BlockPool.get_new_blocks` popping `FreeKVCacheBlockQueue` and
  `_maybe_evict_cached_block`, one block at a time; SGLang `RadixCache.evict`, whole unlocked leaves
  in LRU order until at least the shortfall `evict_to_free_tokens` asked for
  (`sglang/srt/mem_cache/allocator/base.py`).
- free space: vLLM `BlockPool.get_num_free_blocks` (the free queue, cached blocks in it); SGLang
  `TokenToKVPoolAllocator.available_size` (cached slots are not in it) beside
  `RadixCache.evictable_size`.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import events_of, fresh
from blockviz.lessons.lesson12 import params, prompt, tokens_of
from blockviz.model.design import get_design

BLOCK_SIZE = 16  # vLLM's default block size on GPUs
PAGE_SIZE = 1  # SGLang's default page size
VLLM_BLOCKS = 8  # vLLM's pool: 7 blocks of 16 to lend (block 0 is the null block): 112 token slots
SGLANG_PAGES = 113  # SGLang's pool: 112 slots of one token to lend (page 0 is SGLang's padding page)

SYSTEM = 40  # tokens of the system prompt both users' chats open with
USER_A, USER_B = 10, 12  # tokens of each user's first message
SAMPLED = 8  # tokens each turn samples
FOLLOW_UP = 6  # tokens of each user's second message
NEWCOMER = 40  # tokens of C's prompt, another application's, sharing nothing with the chats
USER_D = 8  # tokens of D's first message, the conversation that opens after C


def options(kv_manager: str = "v1", page_size: int | None = None, **more) -> dict:
    """The lesson's engine: the bundled model on the CPU, no CPU pool. "v1" (or "vllm"): blocks of
    BLOCK_SIZE in a pool of VLLM_BLOCKS; "sglang": pages of `page_size` (PAGE_SIZE unless given), as
    many as hold the same 112 token slots to lend (SGLANG_PAGES pages of one token)."""
    base = {"kv_manager": kv_manager, "num_cpu_blocks": 0, "device": "cpu"}
    if get_design(kv_manager).radix_tree:
        page_size = page_size or PAGE_SIZE
        base.update(sglang_options={"page_size": page_size},
                    num_gpu_blocks=SGLANG_PAGES if page_size == 1 else VLLM_BLOCKS * BLOCK_SIZE // page_size)
    else:
        base.update(block_size=BLOCK_SIZE, num_gpu_blocks=VLLM_BLOCKS)
    return {**base, **more}


def first_turns() -> dict[str, list[int]]:
    """Turn 1 of each user: the shared system prompt, then the user's own message."""
    system = prompt(SYSTEM, 100)["prompt_token_ids"]
    return {"A": system + prompt(USER_A, 300)["prompt_token_ids"], "B": system + prompt(USER_B, 500)["prompt_token_ids"]}


@dataclass(frozen=True)
class Chat:
    """The chat run on one design: each turn's prompt tokens and the tokens the cache served it
    (A1, B1, A2, B2 in order), the free space after the chat, and what made room for C."""

    kv_manager: str
    page_size: int
    prompt_tokens: tuple[int, ...]
    hits: tuple[int, ...]
    slots: int  # token slots the pool lends
    free_slots: int  # slots the design counts as free after the chat
    cached_slots: int  # slots holding cached tokens no request holds then
    asked: int  # slots C's prefill was short of (SGLang's eviction asks for these)
    evicted_slots: int  # slots evicted to make room for C
    evicted_runs: tuple[int, ...]  # slots per evicted node (SGLang) or block (vLLM), in order
    system_hits_after: int  # tokens served to a new conversation (the system prompt, then D's message) after C

    @property
    def turns(self) -> dict[str, tuple[int, int]]:
        """Each turn's name -> (prompt tokens, tokens served)."""
        return dict(zip(("A1", "B1", "A2", "B2"), zip(self.prompt_tokens, self.hits)))


def play_chat(viz) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The workload on `viz`'s engine, one turn after another, each run to its end: A's turn 1, B's
    turn 1, then each user's turn 2 (turn 1's prompt and answer sent back, then a follow-up
    message). Returns each turn's prompt tokens and the tokens the cache served it."""
    first = first_turns()
    lengths, hits = [], []

    def turn(tokens: list[int]) -> str:
        request_id = viz.add_request({"prompt_token_ids": tokens}, params(SAMPLED))
        viz.run_to_completion()
        output = next(o for o in viz.outputs if o.request_id == request_id)
        lengths.append(len(tokens))
        hits.append(output.num_cached_tokens)
        return request_id

    answers = {user: tokens_of(viz, turn(first[user])) for user in "AB"}
    for user, start in (("A", 700), ("B", 800)):
        turn(first[user] + answers[user] + prompt(FOLLOW_UP, start)["prompt_token_ids"])
    return tuple(lengths), tuple(hits)


def free_space(scheduler, kv_manager: str) -> tuple[int, int, int]:
    """(slots lent, slots counted free, cached slots no request holds) as the design counts them:
    SGLang's allocator (available_size) and tree (evictable_size); vLLM's BlockPool
    (get_num_free_blocks, the blocks in the free queue that still have a hash)."""
    if get_design(kv_manager).radix_tree:
        return scheduler.allocator.size, scheduler.allocator.available_size(), scheduler.tree_cache.evictable_size()
    pool = scheduler.kv_cache_manager.block_pool
    cached = sum(1 for block in pool.blocks if block.block_hash is not None and block.ref_cnt == 0)
    return (pool.num_gpu_blocks - 1) * BLOCK_SIZE, pool.get_num_free_blocks() * BLOCK_SIZE, cached * BLOCK_SIZE


@cache
def run_chat(kv_manager: str = "v1", page_size: int | None = None) -> Chat:
    """On `kv_manager` ("v1", "vllm": vLLM's own core, or "sglang" with pages of `page_size`): the
    chat (`play_chat`), the free space after it, then C, NEWCOMER tokens of another application,
    admitted into the full pool: what the design evicts to make room; then D, a new conversation
    opening with the system prompt: what the cache still serves it."""
    from engine import events as ev

    with fresh(options(kv_manager, page_size)) as viz:
        lengths, hits = play_chat(viz)
        scheduler = viz.llm.engine.scheduler
        slots, free, cached = free_space(scheduler, kv_manager)
        block_size = viz.llm.engine.config.block_size
        new_slots = -(-NEWCOMER // block_size) * block_size
        before = len(viz.events)
        viz.add_request(prompt(NEWCOMER, 1000), params(2))
        viz.run_to_completion()
        after = viz.events[before:]
        system = first_turns()["A"][:SYSTEM]
        d = viz.add_request({"prompt_token_ids": system + prompt(USER_D, 1200)["prompt_token_ids"]}, params(2))
        viz.run_to_completion()
        d_hits = next(o for o in viz.outputs if o.request_id == d).num_cached_tokens
        if get_design(kv_manager).radix_tree:
            runs = tuple(len(e.slots) for e in after if isinstance(e, ev.RadixNodeEvicted))
        else:
            runs = tuple(block_size for e in after if isinstance(e, ev.BlockEvicted))
        return Chat(kv_manager, block_size, lengths, hits, slots, free, cached, max(0, new_slots - free), sum(runs), runs,
                    d_hits)


def chat_line(chat: Chat) -> str:
    """One line per turn: its prompt tokens, the tokens served, the tokens computed."""
    return "\n".join(f"  {name}: prompt {length} tokens, {hit} served from the cache, {length - hit} computed"
                     for name, (length, hit) in chat.turns.items())


# ---------------------------------------------------------------- 1: hits at token and at block granularity


@exercise("13", "my_vllm_hits", "B shares the system prompt with A; which of A's blocks got a hash in vLLM, and "
                                "does a block that holds some of A's message match B? (answer in tokens)",
          slips=[Slip(SYSTEM, "vLLM keys whole blocks: does the system prompt end on a block boundary?")],
          praise="vLLM serves whole blocks only: the system prompt's last, mixed block is computed again.",
          unit="tokens", other_unit=("blocks", lambda: run_chat().hits[1] // BLOCK_SIZE))
def check_vllm_hits():
    """Tokens of B's turn 1 served by vLLM's cache (engine/v1)."""
    return run_chat().hits[1]


@exercise("13", "my_sglang_hits", "a radix tree matches token by token at page_size 1; where do A's and B's "
                                  "prompts part? (answer in tokens)",
          slips=[Slip(lambda: run_chat().hits[1], "that is the block-aligned hit; SGLang's page here is one token."),
                 Slip(0, "A's prompt entered the tree after its prefill: what does B share with it?")],
          praise="SGLang splits A's node where B's prompt leaves it and serves every shared token.",
          unit="tokens")
def check_sglang_hits():
    """Tokens of B's turn 1 served by SGLang's radix tree (page_size 1)."""
    return run_chat("sglang").hits[1]


# ---------------------------------------------------------------- 2: what a partial last block costs


@exercise("13", "my_partial_cost", "count what each design served of A's turn 2, then subtract; what did SGLang keep "
                                   "that vLLM's last, partly filled block could not? (answer in tokens)",
          slips=[Slip(BLOCK_SIZE, "vLLM drops only the tokens of its last, partly filled block, not a whole block."),
                 Slip(lambda: run_chat("sglang").hits[2], "that is all SGLang served; the question asks for the "
                                                          "difference between the two designs."),
                 Slip(lambda: run_chat("sglang").hits[2] - run_chat().hits[2] + 1,
                      "turn 1's last sampled token never had its K/V computed: neither design has it.")],
          praise="vLLM computes turn 1's partial last block again on every turn; SGLang keeps each token it computed.",
          unit="tokens")
def check_partial_cost():
    """Tokens of A's turn 2 that SGLang served and vLLM computed again."""
    return run_chat("sglang").hits[2] - run_chat().hits[2]


# ---------------------------------------------------------------- 3: free space as each design counts it


@exercise("13", "my_sglang_free", "SGLang's allocator hands out only slots no node of the tree holds; what does the "
                                  "tree hold after the four turns? (answer in token slots)",
          slips=[Slip(lambda: run_chat("sglang").slots, "that is vLLM's way of counting: SGLang's allocator does not "
                                                        "count a cached slot as free."),
                 Slip(lambda: run_chat("sglang").cached_slots, "that is what the tree holds (evictable_size); the "
                                                               "question asks what the allocator counts as free.")],
          praise="SGLang's free space leaves the tree out; its admission budget is available_size + evictable_size.",
          unit="slots")
def check_sglang_free():
    """Slots SGLang's allocator counts as free after the chat."""
    return run_chat("sglang").free_slots


# ---------------------------------------------------------------- 4: eviction order


@exercise("13", "my_sglang_evicted", "RadixCache.evict deletes whole leaves, least recently used first, until it has "
                                     "freed at least what was asked; which leaves are there, and which was used "
                                     "last? (answer in token slots)",
          slips=[Slip(lambda: run_chat("sglang").asked, "that is what was asked: a leaf is evicted whole, never cut."),
                 Slip(lambda: run_chat("sglang").evicted_runs[0], "the first leaf was not enough: once it is gone "
                                                                  "its parent may be a leaf too.")],
          praise="SGLang frees whole leaves, oldest first, and usually more than it was asked for.",
          unit="slots")
def check_sglang_evicted():
    """Slots SGLang's tree evicted to admit C."""
    return run_chat("sglang").evicted_slots


@exercise("13", "my_vllm_evicted", "vLLM takes C's blocks from the head of its free queue; which blocks there never "
                                   "had a hash? (answer in blocks)",
          slips=[Slip(-(-NEWCOMER // BLOCK_SIZE), "one of C's blocks came from the free queue without a hash: "
                                                  "nothing was evicted for it."),
                 Slip(lambda: run_chat().cached_slots // BLOCK_SIZE, "vLLM evicts lazily: one block as it is "
                                                                     "handed out, not every cached block.")],
          praise="vLLM evicts one block at a time, only when the free queue hands it out.",
          unit="blocks", other_unit=("tokens", lambda: run_chat().evicted_slots))
def check_vllm_evicted():
    """Cached blocks vLLM (engine/v1) evicted to admit C."""
    return len(run_chat().evicted_runs)


# ---------------------------------------------------------------- 5: the page, not the tree, sets the granularity


@exercise("13", "my_page16_hits", "SGLang cuts the key to whole pages before it matches (page_aligned); how many "
                                  "whole pages of 16 does B share with A? (answer in tokens)",
          slips=[Slip(lambda: run_chat("sglang").hits[1], "a tree of 16-token pages keys whole pages, like vLLM.")],
          praise="at page_size 16 SGLang hits where vLLM hits: the granularity is the page's, not the tree's.",
          unit="tokens", other_unit=("pages", lambda: run_chat("sglang", BLOCK_SIZE).hits[1] // BLOCK_SIZE))
def check_page16_hits():
    """Tokens of B's turn 1 served by SGLang's tree with pages of 16."""
    return run_chat("sglang", BLOCK_SIZE).hits[1]
