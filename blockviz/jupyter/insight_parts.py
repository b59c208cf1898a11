"""The frame parts of the insight views: plain, JSON-ready dicts of what blockviz.model.insights says at a
cursor, so the JavaScript only draws them and a test compares them with the model layer.

- `explain_part`: one request's prefix lookup (blockviz.model.explain.Explanation) block by block: hash,
  tokens as text, hit with the physical block or the reason of the first miss, the evicting event.
- `ledger_part`: the preemption ledger (blockviz.model.insights.Preemption) and its totals line.
- `memory_part`: memory truth at the cursor (blockviz.model.insights.memory_truth) per pool and per
  sequence, and the sparkline points (block and token utilization at each step end).
Each costs what its answer holds (requests, preemptions, one pool, the step ends), never a pass over
the events: the Visualizer computes them for every frame its insight views are shown in.
"""

from __future__ import annotations

from typing import Any

from blockviz.model.explain import EVICTED
from blockviz.model.insights import Insights, ledger_totals, memory_truth
from blockviz.model.narration import describe
from blockviz.model.palette import event_number, short_hash, show_token
from blockviz.model.reducer import ReducerState

MAX_LEDGER_ROWS = 200  # preemptions listed (the newest; the totals count them all)
MAX_MEMORY_SEQS = 32  # sequences in the memory table
MAX_SPARK_POINTS = 240  # points of a sparkline (a longer series is thinned evenly, the last kept)


def explain_part(insights: Insights, position: int, request_id: str | None, events: list,
                 vocab: dict[int, str]) -> dict[str, Any]:
    """The explainer at `position` for `request_id` (the newest request explained by then when it
    is None or not explained yet): the requests to pick from, and the chosen one's lookup.
    `events` are the timeline's (to name an evicting event), `vocab` token id -> text."""
    explained = insights.explanations(position)
    requests = list(dict.fromkeys(x.request_id for x in explained))  # once each, in order of arrival
    # a request's latest lookup (one preempted by recompute looks up again when admitted)
    chosen = next((x for x in reversed(explained) if x.request_id == request_id), explained[-1] if explained else None)
    if chosen is None:
        return {"requests": requests, "request": None}
    blocks = []
    for b in chosen.blocks:
        row = {"index": b.index, "hash": short_hash(b.block_hash) if b.block_hash is not None else "",
               "tokens": [show_token(vocab.get(t, f"<{t}>")) for t in b.token_ids],
               "verdict": b.verdict, "block": b.block, "evicted_by": None}
        if b.verdict == EVICTED and b.evicted_by is not None:
            row["evicted_by"] = _event_reference(events, b.evicted_by)
        blocks.append(row)
    miss = chosen.first_miss
    return {
        "requests": requests, "request": chosen.request_id, "seq": chosen.seq_id,
        "num_prompt_tokens": chosen.num_prompt_tokens, "recomputed": chosen.recomputed, "block_size": chosen.block_size,
        "blocks": blocks, "hit_blocks": chosen.num_hit_blocks, "hit_tokens": chosen.num_hit_tokens,
        "first_miss": None if miss is None else {"index": miss.index, "verdict": miss.verdict},
        "caching": insights.explainer.caching,
    }


def _event_reference(events: list, seq_no: int) -> dict[str, Any]:
    """The event numbered `seq_no` as the log shows it: its number there (1-based) and its words."""
    index = seq_no if 0 <= seq_no < len(events) and events[seq_no].seq_no == seq_no else None
    if index is None:
        index = next((i for i, e in enumerate(events) if e.seq_no == seq_no), None)
    if index is None:
        return {"seq_no": seq_no, "number": None, "text": f"event seq_no {seq_no}"}
    return {"seq_no": seq_no, "number": event_number(seq_no), "text": describe(events[index])}


def ledger_part(insights: Insights, position: int) -> dict[str, Any]:
    """The preemptions by `position` (the newest MAX_LEDGER_ROWS) and the totals line over all."""
    entries = insights.ledger(position)
    rows = [{
        "seq_no": e.seq_no, "step": e.step, "request": e.request_id, "seqs": list(e.seq_ids), "mode": e.mode,
        "reason": e.reason, "blocks_swapped": e.blocks_swapped, "blocks_freed": e.blocks_freed,
        "tokens_lost": e.tokens_lost, "resumed_step": e.resumed_step, "steps_until_resumed": e.steps_until_resumed,
    } for e in entries[-MAX_LEDGER_ROWS:]]
    return {"rows": rows, "count": len(entries), "totals": ledger_totals(entries)}


def memory_part(insights: Insights, state: ReducerState, position: int) -> dict[str, Any]:
    """Memory truth at the cursor (`state`, `position`): per pool, per sequence, the totals, and
    the sparkline over the step ends by `position`."""
    truth = memory_truth(state, insights.max_tokens)
    pools = {device: {"num_blocks": p.num_blocks, "used_blocks": p.used_blocks, "slots_used": p.slots_used,
                      "slots_allocated": p.slots_allocated, "block_utilization": p.block_utilization,
                      "token_utilization": p.token_utilization} for device, p in truth.pools.items()}
    seqs = [{"seq": s.seq_id, "num_tokens": s.num_tokens, "num_blocks": s.num_blocks,
             "empty_in_last_block": s.empty_in_last_block, "reserved_slots": s.reserved_slots}
            for s in sorted(truth.seqs.values(), key=lambda s: s.seq_id)[:MAX_MEMORY_SEQS]]
    return {
        "block_size": state.block_size, "pools": pools, "seqs": seqs, "num_seqs": len(truth.seqs),
        "internal_fragmentation": truth.internal_fragmentation, "reserved_slots": truth.reserved_slots,
        "held_tokens": sum(s.num_tokens for s in truth.seqs.values()),
        "reservation_waste": truth.reservation_waste(), "paged_waste": truth.paged_waste(),
        "series": sparkline_points(insights, position),
    }


def sparkline_points(insights: Insights, position: int, limit: int = MAX_SPARK_POINTS) -> list[list]:
    """[step, position, block utilization, token utilization] at each step end by `position`,
    thinned evenly to at most `limit` points (the newest always kept)."""
    series = insights.memory_series(position)
    if len(series) > limit:
        stride = -(-len(series) // limit)
        series = series[len(series) - 1::-stride][::-1]
    return [[p.step, p.position, round(p.block_utilization, 4), round(p.token_utilization, 4)] for p in series]

