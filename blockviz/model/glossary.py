"""The words blockviz uses, defined once: the `?` help's glossary (blockviz/tui/widgets/screens.py),
the terms each guide card links (blockviz/model/guide.py), and the notebook's card (title text
on each term). `BASICS` come first, the words every later one is made of; `GLOSSARY` names the
block manager's operations after vLLM v0's BlockSpaceManager and nano-vllm's BlockManager.
"""

from __future__ import annotations

import re

# The first words: what the pictures are made of, in the order a newcomer needs them.
BASICS = (
    ("token", "a piece of text the model reads or writes (a word or part of one); a prompt is a list of tokens"),
    ("K/V", "key and value vectors: what attention in each layer keeps of every token it has read, to read again "
            "for every later token. Kept, they are the KV cache; it grows by one token's K/V per token"),
    ("slot", "room for one token's K/V in every layer"),
    ("block", "block_size slots, the unit memory is handed out in (vLLM's PhysicalTokenBlock / KVCacheBlock); "
              "a cell of the pool grid"),
    ("pool", "all the blocks of one device: the GPU pool, where attention reads them, and (vLLM v0) the CPU pool "
             "that swapped-out blocks wait in"),
    ("block table", "one per sequence: its logical blocks (L0, L1, ...) in order, each pointing at a physical "
                    "block in a pool; the tokens need not sit next to each other"),
    ("ref count", "how many block tables point at a block (the superscript ²): above 1 it is shared, at 0 it is free"),
    ("hash", "a full block's fingerprint, chained from the hash before it: equal hashes mean equal tokens from the "
             "start, so equal K/V (the prefix cache's key)"),
)

GLOSSARY = (
    ("allocate", "prefill: one block table per request, shared by its n sequences (vLLM v0 BlockSpaceManager.allocate)"),
    ("append_slot", "decode: the new token gets a slot; a fresh block when the last one is full"),
    ("copy-on-write", "the last block was shared (ref > 1): copy it before writing (vLLM v0 append_slots)"),
    ("forking", "n > 1: the child shares every block of its parent, ref count +1"),
    ("prefix cache", "full blocks kept by their hash, so a prompt that starts the same reuses them (nano-vllm "
                     "hash_to_block_id, vLLM v1 BlockPool.cached_block_hash_to_block)"),
    ("eviction", "a free block still holding a cached hash is taken for new tokens: its hash is dropped, least "
                 "recently used first (vLLM v0 LRUEvictor, v1 the free queue's head)"),
    ("swap_out / swap_in", "preemption by swap: blocks move GPU ↔ CPU pool, K/V copied (vLLM v0 swap_out / swap_in)"),
    ("recompute", "preemption by recompute: blocks freed, the K/V is computed again later"),
    ("chunked prefill", "vLLM v1: a long prompt is computed a chunk per step, within the step's token budget"),
    ("request", "what a user sends: a prompt and its sampling parameters, named by its request id; with n > 1 it "
                "runs as n sequences (\"request 3 (seq 4)\": request 3's sequence 4)"),
    ("prefill", "the step that computes a prompt's K/V (all of it, or a chunk); decode steps then add one token each"),
    ("preemption", "a running request stopped to make room: swapped out (v0) or recomputed later (v0 and v1)"),
    ("free queue", "vLLM v1's free blocks in one queue, the head handed out first (FreeKVCacheBlockQueue): a freed "
                   "block with a hash joins the tail, one without a hash the head; taking a cached one evicts it"),
    ("null block", "vLLM v1's block 0 (BlockPool.null_block): a placeholder a table points at for a slot it skips; "
                   "never allocated, freed or counted, so a pool of N blocks has N - 1 to hand out"),
    ("group", "a KV-cache group: layers of one kind (full attention, or one sliding window) sharing one block table "
              "per request; every group draws blocks from the one pool (vLLM KVCacheGroupSpec)"),
    ("sliding window", "a layer that reads only the last sliding_window tokens: its group lets a block go once the "
                       "window has passed it (vLLM SlidingWindowManager.remove_skipped_blocks)"),
    ("hash chain", "xxh64(parent hash, tokens) of each full block: equal hash = equal prefix (nano-vllm compute_hash)"),
    ("tokens fill", "token utilization: slots holding tokens / slots in used GPU blocks (the memory line)"),
    ("empty in last", "internal fragmentation: the unfilled slots of each sequence's last block, the only waste paging leaves"),
    ("max-length reservation", "what reserving prompt + max_tokens slots per sequence up front would hold: the vLLM paper's baseline"),
    ("why hit or miss", "a prompt's lookup block by block: different tokens, different parent, evicted (by event N), "
                        "last prompt block (always computed, to sample from), partial block (no hash yet)"),
    ("ledger", "each preemption: the victim, swap (its blocks to CPU) or recompute (blocks freed, tokens lost), "
               "steps until it ran again (vLLM v0 Scheduler._preempt)"),
    ("block count", "num_gpu_blocks = budget // (block_size × layers × 2 × K/V heads × head_dim × dtype) (vLLM determine_num_available_blocks; K/V heads, not query heads)"),
)

DEFINITIONS = dict(BASICS + GLOSSARY)

# How a term shows up in running text, where that differs from its name.
_SPELLINGS = {
    "token": r"tokens?", "K/V": r"K/V", "slot": r"slots?", "block": r"blocks?", "pool": r"pools?",
    "block table": r"block tables?", "ref count": r"ref counts?", "hash": r"hash(es)?", "forking": r"fork(ed|s|ing)?",
    "copy-on-write": r"copy-on-write|copied .* on write", "prefix cache": r"prefix[- ]cache",
    "eviction": r"evict(ion|ed|s)?", "swap_out / swap_in": r"swap(ped)?[ _-]?(out|in)", "recompute": r"recompute",
    "chunked prefill": r"chunk(ed)?", "request": r"requests?", "prefill": r"prefill(ed|s)?",
    "preemption": r"preempt(ed|ion|s)?", "free queue": r"free queue", "null block": r"null block",
    "group": r"groups?", "sliding window": r"sliding[- ]window|window",
}


def terms_in(*texts: str) -> tuple[str, ...]:
    """The glossary terms `texts` use, in glossary order: what a card links (`?` defines them)."""
    text = " ".join(texts)
    return tuple(term for term, _ in BASICS + GLOSSARY
                 if term in _SPELLINGS and re.search(rf"(?<![\w-])({_SPELLINGS[term]})(?![\w-])", text, re.IGNORECASE))
