"""The panels that answer questions: why a prefix lookup hit or missed (the explainer), what
preemption cost (the ledger), and where memory goes (utilization, fragmentation, the contiguous
reservation, and a sparkline over the steps). Each draws the record blockviz.model.insight_view
computes at the cursor, the record the notebook's insight views draw too; `render_*` turn a record
into Rich text."""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.style import Style
from rich.table import Table
from rich.text import Text

from blockviz.model import explain as ex
from blockviz.model.insight_view import (GPU_BLOCKS_IN_USE, ExplainRecord, LedgerRecord, LookupRow, MemoryRecord,
                                         explain_record, ledger_record, memory_fields, memory_line, memory_record)
from blockviz.model.insights import Insights, MemoryTruth
from blockviz.model.narration import plural
from blockviz.model.palette import group_colour, group_mark, sparkline
from blockviz.model.reducer import ReducerState
from blockviz.tui.styles import seq_style
from blockviz.tui.widgets.panels import StatePanel

__all__ = ["ExplainPanel", "LedgerPanel", "MemoryPanel", "memory_fields", "memory_line"]

VERDICT_STYLES = {ex.HIT: "bold green", ex.PARTIAL: "yellow", ex.LAST_BLOCK: "yellow", ex.EVICTED: "bold red",
                  ex.DIFFERENT_PARENT: "bold magenta", ex.DIFFERENT_TOKENS: "bold red",
                  ex.NOT_CACHED: "yellow", ex.WINDOW_TAIL: "bold red"}


class ExplainPanel(StatePanel):
    """The selected sequence's request: its prefix lookup block by block, against the cache as it
    was when the request was allocated (BlockSpaceManager.allocate), and why the first miss missed
    (blockviz.model.insight_view.explain_record, drawn)."""

    TITLE = "Why hit or miss (prefix lookup)"

    def draw(self, insights: Insights, state: ReducerState, position: int, seq_id: int | None,
             events: list, vocab: dict[int, str]) -> None:
        self.set_body(render_explain(explain_record(insights, position, state=state, seq_id=seq_id,
                                                    events=events, vocab=vocab)))


def render_explain(record: ExplainRecord) -> RenderableType:
    """The explainer's record as Rich text: a head line, one line per block, the hit summary."""
    if record.request is None:
        return Text("no request allocated yet: each one's lookup shows here once it is", style="dim")
    head = Text(f" {record.name} ", seq_style(record.seq))
    what = "tokens again after a recompute preemption" if record.recomputed else "prompt tokens"
    head.append(f"  {record.num_prompt_tokens} {what} in {len(record.blocks)} "
                f"block{'s' if len(record.blocks) != 1 else ''} of {record.block_size}"
                + ("  (n selects a sequence)" if record.fallback else ""), "dim")
    rows = []
    for block in record.blocks:  # verdict before the tokens, so a narrow panel cuts the tokens
        row = Text(f"L{block.index:<2} ", "dim", no_wrap=True, overflow="ellipsis")
        row.append(f"{block.hash or '—':<6} ")
        row.append_text(_verdict(block))
        row.append("  " + "".join(block.tokens), "italic")
        rows.append(row)
    miss = record.first_miss
    summary = Text(f"hit {plural(record.hit_blocks, 'block')} = {plural(record.hit_tokens, 'token')}", "bold")
    if miss is not None and miss.verdict == ex.CACHING_OFF:
        summary.append(" · prefix caching is off (--prefix-caching turns it on)")
    elif miss is not None:
        summary.append(f" · first miss L{miss.index}: ")
        summary.append(miss.verdict, VERDICT_STYLES.get(miss.verdict, ""))
    return Group(head, *rows, summary)


def _verdict(block: LookupRow) -> Text:
    if block.verdict == ex.HIT:
        return Text(f"hit → gpu {block.block}", VERDICT_STYLES[ex.HIT])
    text = Text(block.verdict, VERDICT_STYLES.get(block.verdict, "dim"))
    if block.freed_by is not None:  # a window tail: the slide that let the block go, then its eviction
        text.append(f" (window slide: {_event_words(block.freed_by)})", "dim")
    if block.evicted_by is not None:
        evicted = _event_words(block.evicted_by)
        text.append(f" (evicted: {evicted})" if block.freed_by is not None else f" ({evicted})", "dim")
    if block.detail:  # a window tail's miss: which group lost which block
        text.append(f" · {block.detail}", "dim")
    return text


def _event_words(ref) -> str:
    """An event as a panel names it: its number in the log, else its words (the log dropped it)."""
    return f"event {ref.number}" if ref.number is not None else ref.text


class LedgerPanel(StatePanel):
    """Each preemption (Scheduler._preempt) up to the cursor: its victim, mode, the blocks it
    swapped out or freed, the computed tokens it lost, and the steps until it ran again
    (blockviz.model.insight_view.ledger_record, drawn)."""

    TITLE = "Preemption ledger"

    def draw(self, insights: Insights, position: int, state: ReducerState | None = None) -> None:
        self.set_body(render_ledger(ledger_record(insights, position, state)))


def render_ledger(record: LedgerRecord) -> RenderableType:
    """The ledger's record as Rich text: the totals line over a table of the preemptions."""
    if not record.count:
        return Text("no preemptions yet: they come when the GPU pool runs out (try --num-gpu-blocks 16)",
                    style="dim")
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for column in ("step", "request", "mode", "GPU blocks", "tokens lost", "resumed"):
        table.add_column(column, justify="left" if column in ("request", "mode") else "right")
    for row in record.rows:
        table.add_row(str(row.step), row.name,
                      Text(row.mode, "bold red" if row.mode != "swap" else "yellow"),
                      # a swap copies its blocks out, then frees them: one count, said once
                      f"{row.blocks_swapped} to CPU" if row.mode == "swap" else f"{row.blocks_freed} freed",
                      str(row.tokens_lost), row.state)
    return Group(Text(record.totals, "bold"), table)


class Sparkline:
    """A one-line chart of values in [0, 1] on a fixed scale (so 50% always looks half full; Textual's
    Sparkline scales to the data's own range): a label, one glyph per step or per bucket of steps
    (the bucket's highest) as wide as the line allows, and the last value."""

    def __init__(self, label: str, values: list[float], style: str = "") -> None:
        self.label, self.values, self.style = label, values, style

    def __rich_console__(self, console, options):
        values = self.values
        last = f" {values[-1]:.0%}" if values else " —"
        room = max(1, options.max_width - len(self.label) - len(last) - 1)
        if len(values) > room:  # buckets of steps, each drawn at its highest value
            values = [max(values[i * len(values) // room:(i + 1) * len(values) // room]) for i in range(room)]
        line = Text(self.label + " ", "dim")
        line.append(sparkline(values, 1.0) or "·", self.style)
        line.append(last, "bold")
        yield line


class MemoryPanel(StatePanel):
    """Memory truth at the cursor (vLLM paper §3): GPU blocks in use beside slots holding tokens,
    the empty slots in last blocks, and what reserving prompt + max_tokens slots per sequence
    would hold; sparklines over the steps of block and token utilization, then per pool and per
    sequence (blockviz.model.insight_view.memory_record, drawn)."""

    TITLE = "Memory: blocks vs tokens"

    def draw(self, insights: Insights, state: ReducerState, truth: MemoryTruth, position: int) -> None:
        self.set_body(render_memory(memory_record(insights, state, position, truth), position))


def render_memory(record: MemoryRecord, position: int) -> RenderableType:
    """The memory record at cursor `position` as Rich text: the memory line, the two sparklines
    (each step's end, then the cursor when it is inside a step), a table per pool and sequence."""
    series, gpu = record.series, record.pools["gpu"]
    now = [] if series and series[-1][1] == position else [gpu.block_utilization, gpu.token_utilization]
    table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
    for column in ("", "blocks", "block util", "token util", "empty in last"):
        table.add_column(column, justify="left" if not column else "right")
    for device, pool in record.pools.items():
        table.add_row(device.upper(), f"{pool.used_blocks}/{pool.num_blocks}", f"{pool.block_utilization:.0%}",
                      f"{pool.token_utilization:.0%}" if pool.slots_allocated else "—", "")
    for seq in record.seqs:
        used = seq.num_tokens / (seq.num_blocks * record.block_size) if seq.num_blocks else 0.0
        table.add_row(Text(seq.name or f"seq {seq.seq}", seq_style(seq.seq)), str(seq.num_blocks), "",
                      f"{used:.0%}", str(seq.empty_in_last_block))
    if record.num_seqs > len(record.seqs):
        table.add_row(Text(f"… {record.num_seqs - len(record.seqs)} more", "dim"), "", "", "", "")
    for group in record.groups:  # a run with several KV-cache groups: each group's GPU blocks
        label = Text(f"{group_mark(group.group)}", Style(color="#000000", bgcolor=group_colour(group.group)))
        label.append(f" {group.label}" + (f" · {plural(group.null_slots, 'null slot')}" if group.null_slots else ""))
        table.add_row(label, str(group.used_blocks), "", "", "")
    return Group(
        Text(memory_line(record), "bold"),
        Sparkline(f"{GPU_BLOCKS_IN_USE:<19}", [p[2] for p in series] + now[:1], "#61afef"),
        Sparkline("slots with a token ", [p[3] for p in series] + now[1:], "#98c379"),
        table)
