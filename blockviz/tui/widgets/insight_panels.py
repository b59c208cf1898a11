"""The panels that answer questions: why a prefix lookup hit or missed (the explainer), what
preemption cost (the ledger), and where memory goes (utilization, fragmentation, the contiguous
reservation, and a sparkline over the steps). Each is drawn from blockviz.model.insights at the cursor."""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from blockviz.model import explain as ex
from blockviz.model.insights import Insights, MemoryTruth, ledger_totals
from blockviz.model.narration import plural
from blockviz.model.palette import event_number, short_hash, show_token, sparkline
from blockviz.tui.styles import seq_style
from blockviz.tui.widgets.panels import StatePanel
from blockviz.model.reducer import ReducerState

VERDICT_STYLES = {ex.HIT: "bold green", ex.PARTIAL: "yellow", ex.LAST_BLOCK: "yellow", ex.EVICTED: "bold red",
                  ex.DIFFERENT_PARENT: "bold magenta", ex.DIFFERENT_TOKENS: "bold red",
                  ex.NOT_CACHED: "yellow"}


class ExplainPanel(StatePanel):
    """The selected sequence's request: its prefix lookup block by block, against the cache as it
    was when the request was allocated (BlockSpaceManager.allocate), and why the first miss missed."""

    TITLE = "Why hit or miss (prefix lookup)"

    def draw(self, insights: Insights, state: ReducerState, position: int, seq_id: int | None,
             vocab: dict[int, str]) -> None:
        seq = state.seqs.get(seq_id) if seq_id is not None else None
        chosen = insights.explanation_of(seq.request_id, position, seq.seq_id) if seq is not None else None
        if chosen is None:  # no selection, or not allocated yet: the newest request explained
            explained = insights.explanations(position)
            chosen = explained[-1] if explained else None
        if chosen is None:
            self.set_body(Text("no request allocated yet: each one's lookup shows here once it is", style="dim"))
            return
        head = Text(f"request {chosen.request_id} ")
        head.append(f" seq {chosen.seq_id} ", seq_style(chosen.seq_id))
        what = "tokens again after a recompute preemption" if chosen.recomputed else "prompt tokens"
        head.append(f"  {chosen.num_prompt_tokens} {what} in {len(chosen.blocks)} "
                    f"block{'s' if len(chosen.blocks) != 1 else ''} of "
                    f"{chosen.block_size}" + ("" if seq is None or chosen.request_id == seq.request_id
                                              else "  (n selects a sequence)"), "dim")
        rows = []
        for block in chosen.blocks:  # verdict before the tokens, so a narrow panel cuts the tokens
            row = Text(f"L{block.index:<2} ", "dim", no_wrap=True, overflow="ellipsis")
            row.append(f"{short_hash(block.block_hash) if block.block_hash is not None else '—':<6} ")
            row.append_text(_verdict(block))
            row.append("  " + "".join(show_token(vocab.get(t, f"<{t}>")) for t in block.token_ids), "italic")
            rows.append(row)
        miss = chosen.first_miss
        summary = Text(f"hit {plural(chosen.num_hit_blocks, 'block')} = {plural(chosen.num_hit_tokens, 'token')}", "bold")
        if miss is not None and miss.verdict == ex.CACHING_OFF:
            summary.append(" · prefix caching is off (--prefix-caching turns it on)")
        elif miss is not None:
            summary.append(f" · first miss L{miss.index}: ")
            summary.append(miss.verdict, VERDICT_STYLES.get(miss.verdict, ""))
        self.set_body(Group(head, *rows, summary))


def _verdict(block: ex.BlockVerdict) -> Text:
    if block.verdict == ex.HIT:
        return Text(f"hit → gpu {block.block}", VERDICT_STYLES[ex.HIT])
    text = Text(block.verdict, VERDICT_STYLES.get(block.verdict, "dim"))
    if block.evicted_by is not None:
        text.append(f" (event {event_number(block.evicted_by)})", "dim")
    return text


class LedgerPanel(StatePanel):
    """Each preemption (Scheduler._preempt) up to the cursor: its victim, mode, the blocks it
    swapped out or freed, the computed tokens it lost, and the steps until it ran again."""

    TITLE = "Preemption ledger"

    def draw(self, insights: Insights, position: int) -> None:
        entries = insights.ledger(position)
        if not entries:
            self.set_body(Text("no preemptions yet: they come when the GPU pool runs out "
                               "(try --num-gpu-blocks 16)", style="dim"))
            return
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
        for column in ("step", "request", "seqs", "mode", "GPU blocks", "tokens lost", "resumed"):
            table.add_column(column, justify="left" if column in ("request", "mode", "seqs") else "right")
        for e in entries:
            resumed = "waiting" if e.steps_until_resumed is None else f"+{e.steps_until_resumed} steps"
            table.add_row(str(e.step), e.request_id, ",".join(map(str, e.seq_ids)),
                          Text(e.mode, "bold red" if e.mode != "swap" else "yellow"),
                          # a swap copies its blocks out, then frees them: one count, said once
                          f"{e.blocks_swapped} to CPU" if e.mode == "swap" else f"{e.blocks_freed} freed",
                          str(e.tokens_lost), resumed)
        self.set_body(Group(Text(ledger_totals(entries), "bold"), table))


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
    sequence."""

    TITLE = "Memory: blocks vs tokens"

    def draw(self, insights: Insights, truth: MemoryTruth, position: int) -> None:
        series, gpu = insights.memory_series(position), truth.pools["gpu"]
        # each step's end, then the cursor when it is inside a step: the last figure is the memory line's
        now = [] if series and series[-1].position == position else [gpu.block_utilization, gpu.token_utilization]
        table = Table(box=None, padding=(0, 1), show_edge=False, header_style="bold")
        for column in ("", "blocks", "block util", "token util", "empty in last"):
            table.add_column(column, justify="left" if not column else "right")
        for device, pool in truth.pools.items():
            table.add_row(device.upper(), f"{pool.used_blocks}/{pool.num_blocks}", f"{pool.block_utilization:.0%}",
                          f"{pool.token_utilization:.0%}" if pool.slots_allocated else "—", "")
        for seq in truth.seqs.values():
            used = seq.num_tokens / (seq.num_blocks * insights.state.block_size) if seq.num_blocks else 0.0
            table.add_row(Text(f"seq {seq.seq_id}", seq_style(seq.seq_id)), str(seq.num_blocks), "",
                          f"{used:.0%}", str(seq.empty_in_last_block))
        self.set_body(Group(
            Text(memory_line(truth), "bold"),
            Sparkline(f"{GPU_BLOCKS_IN_USE:<19}", [p.block_utilization for p in series] + now[:1], "#61afef"),
            Sparkline("slots with a token ", [p.token_utilization for p in series] + now[1:], "#98c379"),
            table))


GPU_BLOCKS_IN_USE = "GPU blocks in use"  # the figure's one label: the status bar's memory line and the sparkline


def memory_fields(truth: MemoryTruth) -> list[tuple[int, str]]:
    """The memory line's fields, each with its rank (a narrow status bar drops the highest first)."""
    gpu = truth.pools["gpu"]
    fields = [(0, f"{GPU_BLOCKS_IN_USE} {gpu.block_utilization:.0%}"),
              (0, f"tokens fill {gpu.token_utilization:.0%} of slots" if gpu.slots_allocated
               else "no slots in use"),
              (2, f"{truth.internal_fragmentation} slots empty in last blocks")]
    if truth.reserved_slots:
        fields.append((1, f"max-length reservation {1 - truth.reservation_waste():.0%} used"))
    return fields


def memory_line(truth: MemoryTruth) -> str:
    return " · ".join(text for _, text in memory_fields(truth))
