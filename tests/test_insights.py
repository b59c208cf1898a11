"""The preemption ledger and the memory figures, checked over the shipped traces against the same
facts derived another way: from reducer states at the preemption and the reducer's own counts."""

from __future__ import annotations

import pytest

from blockviz.model.design import design_of, kv_cache_groups_of
from blockviz.model.timeline import Timeline
from blockviz.model.insights import max_tokens_of, memory_truth, preemption_ledger
from blockviz.model.trace import load_trace, shipped_traces


@pytest.mark.parametrize("name", ["swap", "recompute"])
def test_the_ledger_matches_the_victims_tables_at_each_preemption(name):
    trace = load_trace(name)
    events = trace.events
    ledger = preemption_ledger(events)
    preempted = [i for i, e in enumerate(events) if e.type == "preempted"]
    assert len(ledger) == len(preempted) > 0
    timeline = Timeline.for_trace(trace)
    for entry, index in zip(ledger, preempted):
        event = events[index]
        assert (entry.request_id, entry.mode, entry.tokens_lost) == (event.request_id, event.mode, event.num_tokens_lost)
        # the victims' GPU blocks as the last step left them
        last_step_end = max(i for i, e in enumerate(events[:index]) if e.type == "step_finished") + 1
        timeline.seek(last_step_end)
        blocks = {number for seq in event.seq_ids for device, number in timeline.state.tables.get(seq, [])
                  if device == "gpu"}
        assert entry.blocks_freed == len(blocks)
        assert entry.blocks_swapped == (len(blocks) if event.mode == "swap" else 0)
        assert entry.mode != "recompute" or entry.tokens_lost > 0
        resumed = next((e.step for e in events[index:] if e.type == "step_started"
                        and set(event.seq_ids) & set(e.seq_ids)), None)
        assert entry.resumed_step == resumed and entry.steps_until_resumed is not None
        assert entry.steps_until_resumed > 0


@pytest.mark.parametrize("name", shipped_traces())
def test_memory_figures_agree_with_the_reducer_at_every_step(name):
    trace = load_trace(name)
    timeline = Timeline.for_trace(trace)
    max_tokens = max_tokens_of(trace.events)
    for end in timeline.step_ends:
        timeline.seek(end)
        state = timeline.state
        truth = memory_truth(state, max_tokens)
        gpu = truth.pools["gpu"]
        assert gpu.used_blocks == state.num_used("gpu")
        usable = trace.num_gpu_blocks - design_of(trace.header).null_block  # v1's null block never counts
        assert gpu.num_blocks == usable and gpu.block_utilization == state.num_used("gpu") / usable
        assert gpu.token_utilization == pytest.approx(state.kv_utilization())
        for seq_id in state.tables:
            seq = truth.seqs[seq_id]
            # a hybrid run's sequence has a table per KV-cache group: each last block's empty slots count
            tables = [state.tables_of(g)[seq_id] for g in range(state.num_kv_cache_groups)
                      if seq_id in state.tables_of(g)]
            lasts = [state.pools[table[-1][0]][table[-1][1]] for table in tables if table]
            assert seq.empty_in_last_block == sum(trace.block_size - len(last.token_ids) for last in lasts)
            assert seq.reserved_slots == (state.seqs[seq_id].num_prompt_tokens + max_tokens[seq_id]) * len(tables)
        # every block but a sequence's last is full, so paged waste is at most one block a sequence
        assert gpu.slots_allocated - gpu.slots_used <= truth.internal_fragmentation
        assert truth.reservation_waste() >= 0


@pytest.mark.parametrize("name", shipped_traces())
def test_insights_fed_in_pieces_answer_as_of_any_cursor(name):
    """The lazy tracker the views use: fed in uneven pieces, at each position it equals the batch
    functions over the events up to there (explanations, the ledger, the memory series)."""
    from blockviz.model.explain import explain_requests
    from blockviz.model.insights import Insights

    trace = load_trace(name)
    events, h = trace.events, trace.header
    insights = Insights.for_header(h)
    for stop in range(0, len(events) + 7, 7):
        insights.sync(events[:stop])
    assert insights.fed == len(events)
    timeline = Timeline.for_trace(trace)
    for position in sorted({0, 1, len(events) // 3, len(events) // 2, len(events)}
                           | {i + 1 for i, e in enumerate(events) if e.type in ("preempted", "step_started")}):
        upto = events[:position]
        batch = explain_requests(upto, h["block_size"], h["num_gpu_blocks"], h["num_cpu_blocks"],
                                 h["enable_prefix_caching"], h.get("kv_manager") or "v0",
                                 h.get("prefix_caching_hash_algo") or "sha256", kv_cache_groups_of(h))
        assert [x.lines() for x in insights.explanations(position)] == [x.lines() for x in batch]
        got = [(p.seq_no, p.blocks_freed, p.blocks_swapped, p.tokens_lost, p.resumed_step)
               for p in insights.ledger(position)]
        assert got == [(p.seq_no, p.blocks_freed, p.blocks_swapped, p.tokens_lost, p.resumed_step)
                       for p in preemption_ledger(upto)]
        series = insights.memory_series(position)
        ends = [i + 1 for i, e in enumerate(upto) if e.type == "step_finished"]
        assert [p.position for p in series] == ends
        if ends:  # the last point is the memory truth at that step's end
            timeline.seek(ends[-1])
            truth = memory_truth(timeline.state, max_tokens_of(upto))
            assert series[-1].block_utilization == truth.pools["gpu"].block_utilization
            assert series[-1].internal_fragmentation == truth.internal_fragmentation
            assert series[-1].reservation_waste == truth.reservation_waste()
