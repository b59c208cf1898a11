"""Numbers a student will catch, agreeing: the memory panel's "empty slots in last blocks" counts a
block two sequences share once (a fork's shared last block is one block, its empty slots one set)."""

from __future__ import annotations

import pytest

from blockviz.model.insights import max_tokens_of, memory_truth
from blockviz.model.reducer import ReducerState
from blockviz.model.trace import load_trace
from engine import events as ev


def test_a_shared_last_block_is_counted_once():
    trace = load_trace("fork-cow")
    state = ReducerState.from_header(trace.header)
    events = list(trace.events)
    fork = next(i for i, e in enumerate(events) if isinstance(e, ev.Forked))
    for e in events[:fork + 1]:
        state.apply(e)
    truth = memory_truth(state, max_tokens_of(events[:fork + 1]))
    parent, child = events[fork].parent_seq_id, events[fork].child_seq_id
    assert state.tables[parent][-1] == state.tables[child][-1]  # one last block, two tables
    last = state.pools["gpu"][state.tables[parent][-1][1]]
    empty = trace.header["block_size"] - len(last.token_ids)
    assert empty > 0
    assert truth.seqs[parent].empty_in_last_block == truth.seqs[child].empty_in_last_block == empty
    assert truth.internal_fragmentation == sum(
        s.empty_in_last_block for seq_id, s in truth.seqs.items() if seq_id != child)


@pytest.mark.parametrize("name", ["recompute", "swap", "v1-story", "hybrid", "cpu-tier"])
def test_a_table_never_says_waiting_beside_blocks_it_holds(name):
    """At every event of the shipped trace, a sequence whose tables hold a block (the null block
    aside) is not "waiting" in its table row: its status word says why it holds them (swapped,
    preempted with its frees to come, loading from the CPU tier, running once placed before its step
    starts, as vLLM's Scheduler.schedule makes it RUNNING)."""
    from blockviz.model.view import tables

    trace = load_trace(name)
    state = ReducerState.from_header(trace.header)
    words = set()
    for event in trace.events:
        state.apply(event)
        for row in tables(state, limit=None):
            held = [b for blocks in [row.blocks, *(g.blocks for g in row.groups)] for b in blocks
                    if state.pools[b[0]][b[1]].state != "null"]
            if held:
                assert row.status != "waiting", (event.seq_no, event.type, row.seq)
                words.add(row.status)
    assert "running" in words
    if name == "recompute":
        assert "preempted" in words  # stepped into a recompute preemption, before its frees
    if name == "swap":
        assert "swapped" in words
    if name == "cpu-tier":
        assert "loading" in words


@pytest.mark.parametrize("name", ["fork-cow", "swap", "v1-story", "prefix-hit"])
def test_a_table_counts_the_tokens_its_slots_hold(name):
    """A row's token count is the memory panel's (the tokens in the blocks it holds): the token
    sampled this step, before the next step's append_slots gives it a slot, is not counted yet."""
    from blockviz.model.view import tables

    trace = load_trace(name)
    state = ReducerState.from_header(trace.header)
    events = list(trace.events)
    max_tokens = max_tokens_of(events)
    unslotted = 0
    for event in events:
        state.apply(event)
        truth = memory_truth(state, max_tokens)
        for row in tables(state, limit=None):
            if row.seq in truth.seqs and truth.seqs[row.seq].num_blocks:
                assert row.num_tokens == truth.seqs[row.seq].num_tokens, (event.seq_no, row.seq)
                unslotted += row.num_tokens < len(state.seqs[row.seq].token_ids)
            elif row.seq in state.seqs:
                assert row.num_tokens == len(state.seqs[row.seq].token_ids)  # no blocks: the request's tokens
    assert unslotted  # the case the count is about came up


@pytest.mark.parametrize("name", ["v1-story", "hybrid", "cpu-tier"])
def test_v1_hit_rate_counts_tokens_as_vllms_prefix_cache_stats(name):
    """vLLM v1's PrefixCacheStats, recorded at each admission (Scheduler.schedule ->
    KVCacheManager.record_prefix_cache_stats): a new request's lookup adds its num_tokens to
    `queries` and the tokens the GPU's prefix cache served to `hits`; a preempted request's goes
    apart. Every lookup's full blocks are looked up, a prompt block chunked prefill fills over two
    steps too (it is allocated part-full)."""
    from blockviz.model.explain import explain_requests
    from blockviz.model.design import kv_cache_groups_of, kv_manager_of

    trace = load_trace(name)
    header = trace.header
    state = ReducerState.from_header(header)
    events = list(trace.events)
    part_full = 0
    for event in events:
        state.apply(event)
        part_full += isinstance(event, ev.BlockAllocated) and 0 < len(event.token_ids) < header["block_size"] \
            and event.logical_index < state.seqs[event.seq_ids[0]].num_prompt_tokens // header["block_size"]
    explained = explain_requests(events, header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"],
                                 bool(header.get("enable_prefix_caching", True)), kv_manager_of(header),
                                 header.get("prefix_caching_hash_algo") or "sha256", kv_cache_groups_of(header))
    new = [x for x in explained if not x.recomputed]
    size = header["block_size"]
    assert state.prefix_hit_unit == "tokens"
    assert state.prefix_cache_queries == sum(x.num_prompt_tokens for x in new)
    assert state.prefix_cache_hits == sum((x.num_hit_blocks - x.num_cpu_hit_blocks) * size for x in new)
    assert state.num_prompt_blocks_looked_up == sum(x.num_prompt_tokens // size for x in explained)
    assert state.prefix_hit_rate() == state.prefix_cache_hits / state.prefix_cache_queries
    if name == "v1-story":
        assert part_full  # a prompt block chunked prefill filled over two steps is among them
