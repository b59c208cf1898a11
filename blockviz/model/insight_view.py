"""The insight panels' records: what the explainer, the preemption ledger and memory truth show at a
cursor, computed once here and drawn by both front ends (the TUI's widgets/insight_panels.py turns a
record into Rich text; the notebook sends `record.to_json()` and its JavaScript draws that), as
blockviz.model.view does for the core panels.

- `explain_record`: one request's prefix lookup (blockviz.model.explain.Explanation) block by block:
  hash, tokens as text, hit with the physical block or the reason of the first miss, the evicting
  event. Which lookup is chosen here, once: the asked-for request's latest lookup (a request
  preempted by recompute looks up again when admitted), its selected sequence's own where it has one
  (vLLM v1's n > 1 children), else the newest lookup by the cursor.
- `ledger_record`: the preemption ledger (blockviz.model.insights.Preemption) and its totals line.
- `memory_record`: memory truth at the cursor (blockviz.model.insights.memory_truth) per pool and per
  sequence, and the sparkline points (block and token utilization at each step end).
Each costs what its answer holds (requests, preemptions, one pool, the step ends), never a pass over
the events: both front ends compute them for every frame their insight panels are shown in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from blockviz.model.explain import EVICTED, WINDOW_TAIL, Explanation
from blockviz.model.insights import Insights, MemoryTruth, ledger_totals, memory_truth
from blockviz.model.names import RequestNames
from blockviz.model.narration import describe
from blockviz.model.narration import plural
from blockviz.model.palette import event_number, short_hash, show_token
from blockviz.model.record import Record
from blockviz.model.reducer import ReducerState
from blockviz.model.view import group_label, has_groups

MAX_LEDGER_ROWS = 200  # preemptions listed (the newest; the totals count them all)
MAX_MEMORY_SEQS = 32  # sequences in the memory table
MAX_SPARK_POINTS = 240  # points of a sparkline (a longer series is thinned evenly, the last kept)
GPU_BLOCKS_IN_USE = "GPU blocks in use"  # the figure's one label: the status bar's memory line and the sparkline


# ------------------------------------------------------------------------------------ explainer


@dataclass(slots=True)
class EventReference(Record):
    """An event as the log shows it: its number there (palette.event_number; None when the timeline
    no longer holds it) and its words (narration.describe)."""

    seq_no: int
    number: int | None
    text: str


@dataclass(slots=True)
class LookupRow(Record):
    """One logical block of a lookup: its short hash ("" for a partial block), tokens as text, the
    verdict (blockviz.model.explain), the physical block it hit, the event that evicted its twin,
    and for a "window tail freed" miss `detail`: which KV-cache group lost which block, and
    `freed_by`: the window slide (blocks_skipped) that let it go."""

    index: int
    hash: str
    tokens: list[str]
    verdict: str
    block: int | None
    evicted_by: EventReference | None = None
    detail: str = ""
    freed_by: EventReference | None = None


@dataclass(slots=True)
class FirstMiss(Record):
    index: int
    verdict: str


@dataclass(slots=True)
class ExplainRecord(Record):
    """The explainer at a cursor: the requests explained by then (to pick from) and the chosen
    request's lookup (`request` None: nothing allocated yet). `fallback`: a request was asked for
    but had no lookup by the cursor, so the newest is shown. `name`: the lookup's sequence as the
    tables name it (blockviz.model.names)."""

    requests: list[str]
    request: str | None = None
    seq: int | None = None
    num_prompt_tokens: int = 0
    recomputed: bool = False
    block_size: int = 0
    blocks: list[LookupRow] = field(default_factory=list)
    hit_blocks: int = 0
    hit_tokens: int = 0
    first_miss: FirstMiss | None = None
    caching: bool = True
    fallback: bool = False
    name: str = ""

    def to_json(self) -> dict[str, Any]:
        if self.request is None:
            return {"requests": self.requests, "request": None}
        return Record.to_json(self)


def explain_record(insights: Insights, position: int, *, state: ReducerState | None = None,
                   seq_id: int | None = None, request_id: str | None = None, events: list = (),
                   vocab: dict[int, str] | None = None) -> ExplainRecord:
    """The explainer at `position` (`insights` synced): `request_id`'s latest lookup, or the request of
    sequence `seq_id` (in `state`, the reducer state at the cursor) with that sequence's own lookup
    where it has one; else (none asked for, or not allocated by then) the newest lookup. `events`
    are the timeline's (to name an evicting event), `vocab` token id -> text."""
    explained = insights.explanations(position)
    requests = list(dict.fromkeys(x.request_id for x in explained))  # once each, in order of arrival
    chosen = chosen_lookup(insights, position, state=state, seq_id=seq_id, request_id=request_id)
    fallback = chosen is None and (request_id is not None or seq_id is not None)
    if chosen is None:
        chosen = explained[-1] if explained else None
    if chosen is None:
        return ExplainRecord(requests)
    vocab = vocab or {}
    rows = [LookupRow(b.index, short_hash(b.block_hash) if b.block_hash is not None else "",
                      [show_token(vocab.get(t, f"<{t}>")) for t in b.token_ids], b.verdict, b.block,
                      event_reference(events, b.evicted_by)
                      if b.verdict in (EVICTED, WINDOW_TAIL) and b.evicted_by is not None else None, b.detail,
                      event_reference(events, b.freed_by) if b.freed_by is not None else None)
            for b in chosen.blocks]
    miss = chosen.first_miss
    return ExplainRecord(requests, chosen.request_id, chosen.seq_id, chosen.num_prompt_tokens, chosen.recomputed,
                         chosen.block_size, rows, chosen.num_hit_blocks, chosen.num_hit_tokens,
                         None if miss is None else FirstMiss(miss.index, miss.verdict),
                         insights.explainer.caching, fallback,
                         RequestNames(state).request(chosen.request_id, (chosen.seq_id,)) if state is not None
                         else f"request {chosen.request_id}")


def chosen_lookup(insights: Insights, position: int, *, state: ReducerState | None = None,
                  seq_id: int | None = None, request_id: str | None = None) -> Explanation | None:
    """The lookup asked for at `position`: `request_id`'s latest (a request preempted by recompute
    looks up again when admitted), or that of sequence `seq_id`'s request (in `state`), the
    sequence's own where it has one (vLLM v1's n > 1 children); None when none was asked for or
    it was not allocated by then."""
    if request_id is None and seq_id is not None and state is not None:
        seq = state.seqs.get(seq_id)
        request_id = seq.request_id if seq is not None else None
    return insights.explanation_of(request_id, position, seq_id) if request_id is not None else None


def event_reference(events: list, seq_no: int) -> EventReference:
    """The event numbered `seq_no` as the log shows it (EventReference)."""
    index = seq_no if 0 <= seq_no < len(events) and events[seq_no].seq_no == seq_no else None
    if index is None:
        index = next((i for i, e in enumerate(events) if e.seq_no == seq_no), None)
    if index is None:
        return EventReference(seq_no, None, f"event seq_no {seq_no}")
    return EventReference(seq_no, event_number(seq_no), describe(events[index]))


# ------------------------------------------------------------------------------------ ledger


@dataclass(slots=True)
class LedgerRow(Record):
    """One preemption (blockviz.model.insights.Preemption) as of the cursor."""

    seq_no: int
    step: int
    request: str
    seqs: list[int]
    mode: str
    reason: str
    blocks_swapped: int
    blocks_freed: int
    tokens_lost: int
    resumed_step: int | None
    steps_until_resumed: int | None
    state: str  # where the request stands at the cursor, in words: every front end draws this one
    name: str = ""  # the request as the tables name it (blockviz.model.names), its sequences where it has several


def preempted_state(entry) -> str:
    """Where a preempted request stands (an insights.Preemption as of the cursor), in words: the
    ledger's one definition, drawn by the TUI and the notebook."""
    if entry.resumed_step is None:
        return "waiting"
    return f"+{entry.steps_until_resumed} steps"


@dataclass(slots=True)
class LedgerRecord(Record):
    """The preemptions by the cursor (the newest MAX_LEDGER_ROWS), how many in all, the totals line."""

    rows: list[LedgerRow]
    count: int
    totals: str


def ledger_record(insights: Insights, position: int, state: ReducerState | None = None) -> LedgerRecord:
    """The preemption ledger at `position` (`insights` synced); `state`, the reducer state there,
    names each request as the tables do (blockviz.model.names)."""
    entries = insights.ledger(position)
    names = RequestNames(state)
    rows = [LedgerRow(e.seq_no, e.step, e.request_id, list(e.seq_ids), e.mode, e.reason, e.blocks_swapped,
                      e.blocks_freed, e.tokens_lost, e.resumed_step, e.steps_until_resumed, preempted_state(e),
                      names.request(e.request_id, e.seq_ids))
            for e in entries[-MAX_LEDGER_ROWS:]]
    return LedgerRecord(rows, len(entries), ledger_totals(entries))


# ------------------------------------------------------------------------------------ memory


@dataclass(slots=True)
class PoolMemory(Record):
    num_blocks: int
    used_blocks: int
    slots_used: int
    slots_allocated: int
    block_utilization: float
    token_utilization: float


@dataclass(slots=True)
class SeqMemory(Record):
    seq: int
    num_tokens: int
    num_blocks: int
    empty_in_last_block: int
    reserved_slots: int
    name: str = ""  # the sequence as every panel names it (blockviz.model.names)


@dataclass(slots=True)
class GroupMemory(Record):
    """One KV-cache group's share of memory (a run with several): its label (view.group_label),
    the GPU blocks in use holding its K/V, and the table slots holding the null block (blocks a
    sliding window gave back to the pool while their requests ran)."""

    group: int
    label: str
    used_blocks: int
    null_slots: int


@dataclass(slots=True)
class MemoryRecord(Record):
    """Memory truth at the cursor: per pool, per sequence (the first MAX_MEMORY_SEQS by id), the
    totals, and `series`: [step, position, block utilization, token utilization] at each step end
    by the cursor (sparkline_points)."""

    block_size: int
    pools: dict[str, PoolMemory]
    seqs: list[SeqMemory]
    num_seqs: int
    internal_fragmentation: int
    reserved_slots: int
    held_tokens: int
    reservation_waste: float
    paged_waste: float
    series: list[list]
    groups: list[GroupMemory] = field(default_factory=list)


def memory_record(insights: Insights, state: ReducerState, position: int,
                  truth: MemoryTruth | None = None) -> MemoryRecord:
    """Memory truth at the cursor (`state`, `position`; `insights` synced); `truth` when the
    caller has it already (memory_truth of `state`)."""
    truth = truth if truth is not None else memory_truth(state, insights.max_tokens)
    pools = {device: PoolMemory(p.num_blocks, p.used_blocks, p.slots_used, p.slots_allocated, p.block_utilization,
                                p.token_utilization) for device, p in truth.pools.items()}
    names = RequestNames(state)
    seqs = [SeqMemory(s.seq_id, s.num_tokens, s.num_blocks, s.empty_in_last_block, s.reserved_slots,
                      names((s.seq_id,)))
            for s in sorted(truth.seqs.values(), key=lambda s: s.seq_id)[:MAX_MEMORY_SEQS]]
    return MemoryRecord(state.block_size, pools, seqs, len(truth.seqs), truth.internal_fragmentation,
                        truth.reserved_slots, sum(s.num_tokens for s in truth.seqs.values()),
                        truth.reservation_waste(), truth.paged_waste(), sparkline_points(insights, position),
                        group_memory(state, truth))


def group_memory(state: ReducerState, truth: MemoryTruth) -> list[GroupMemory]:
    """Each KV-cache group's blocks in use and null slots (GroupMemory), for the groups that hold
    blocks (ReducerState.groups_holding_blocks); [] for one group."""
    if not has_groups(state):
        return []
    return [GroupMemory(g, group_label(state, g), truth.blocks_per_group.get(g, 0),
                        sum(table.count(("gpu", 0)) for table in state.tables_of(g).values()))
            for g in state.groups_holding_blocks()]


def sparkline_points(insights: Insights, position: int, limit: int = MAX_SPARK_POINTS) -> list[list]:
    """[step, position, block utilization, token utilization] at each step end by `position`,
    thinned evenly to at most `limit` points (the newest always kept)."""
    series = insights.memory_series(position)
    if len(series) > limit:
        stride = -(-len(series) // limit)
        series = series[len(series) - 1::-stride][::-1]
    return [[p.step, p.position, round(p.block_utilization, 4), round(p.token_utilization, 4)] for p in series]


def memory_fields(truth: MemoryTruth | MemoryRecord) -> list[tuple[int, str]]:
    """The memory line's fields, each with its rank (a narrow status bar drops the highest first),
    from memory truth or its record."""
    gpu = truth.pools["gpu"]
    waste = truth.reservation_waste if isinstance(truth, MemoryRecord) else truth.reservation_waste()
    fields = [(0, f"{GPU_BLOCKS_IN_USE} {gpu.block_utilization:.0%}"),
              (0, f"tokens fill {gpu.token_utilization:.0%} of slots" if gpu.slots_allocated
               else "no slots in use"),
              (2, f"{plural(truth.internal_fragmentation, 'slot')} empty in last blocks")]
    if truth.reserved_slots:
        fields.append((1, f"max-length reservation {1 - waste:.0%} used"))
    return fields


def memory_line(truth: MemoryTruth | MemoryRecord) -> str:
    """The memory figures in one line (the status bar's, the memory panel's first)."""
    return " · ".join(text for _, text in memory_fields(truth))
