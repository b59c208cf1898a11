"""How things look, shared by every view: sequence colours, block tints, token text, short hashes,
and each event in words (`describe`, the log's filters).

Pure functions over the reducer's state (no textual import), so they are cheap to test and the
TUI and the Jupyter widgets (blockviz/jupyter) agree on what colour a sequence is.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from engine import events as ev
from blockviz.model.reducer import USED, BlockState, ReducerState

# Distinct, dark-on-light-readable hues for sequences (index = seq_id % len).
SEQ_COLOURS = (
    "#e06c75", "#61afef", "#98c379", "#e5c07b", "#c678dd", "#56b6c2",
    "#d19a66", "#ff79c6", "#8be9fd", "#b5e853", "#bd93f9", "#ffb86c",
)
# Projector mode: fewer, stronger colours.
SEQ_COLOURS_BOLD = ("#ff3b3b", "#2f8fff", "#2fd12f", "#ffd400", "#d25cff", "#00d8d8", "#ff8c1a", "#ff4fb8")
# Background tints for "which block holds this token" (index = block number % len), two shades each.
BLOCK_TINTS = (
    ("#3b2f5c", "#4a3b73"), ("#23465c", "#2c5873"), ("#2f5c3b", "#3b734a"), ("#5c4a23", "#73602c"),
    ("#5c2f4e", "#733b62"), ("#2f5458", "#3b6a6e"), ("#503a2a", "#664a36"), ("#3f3f5c", "#4f4f73"),
)
CPU_TINTS = ("#454545", "#575757")
FILL_GLYPHS = " ▁▂▃▄▅▆▇█"

FREE_STYLE = Style(color="#6b6b6b")
CACHED_STYLE = Style(color="#e8e8e8", bgcolor="#3c4a5a", italic=True)
SELECTED_STYLE = Style(reverse=True, bold=True)
TOUCHED_STYLE = Style(underline=True, bold=True)

_VISIBLE = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍", "Ġ": "·", "Ċ": "⏎", "▁": "·"}


def seq_colour(seq_id: int, projector: bool = False) -> str:
    colours = SEQ_COLOURS_BOLD if projector else SEQ_COLOURS
    return colours[seq_id % len(colours)]


def seq_style(seq_id: int, projector: bool = False) -> Style:
    return Style(color="#000000", bgcolor=seq_colour(seq_id, projector), bold=projector)


def block_tint(device: str, number: int, shade: int = 0) -> str:
    if device == "cpu":
        return CPU_TINTS[shade % 2]
    return BLOCK_TINTS[number % len(BLOCK_TINTS)][shade % 2]


def show_token(text: str) -> str:
    """A token's text with spaces, newlines and tabs made visible ('·', '⏎', '⇥'); byte-level BPE
    markers (Ġ, Ċ) and control characters never reach the screen raw."""
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32 or ch == "\x7f":
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    return "".join(out) or "∅"


def short_hash(block_hash: int | None, digits: int = 6) -> str:
    """A block hash as `digits` hex digits (the top bits of the 64-bit xxh64)."""
    if block_hash is None:
        return "—"
    return f"{block_hash & 0xFFFFFFFFFFFFFFFF:016x}"[:digits]


def is_cached_free(block: BlockState) -> bool:
    """Free but still hashed: a prefix-cache hit can revive it until it is evicted."""
    return block.state != USED and block.block_hash is not None


def block_state_name(block: BlockState) -> str:
    if block.state == USED:
        return "used"
    return "cached-free" if is_cached_free(block) else "free"


def fill_glyph(num_tokens: int, block_size: int) -> str:
    if num_tokens <= 0:
        return " "
    level = max(1, min(8, round(8 * num_tokens / block_size)))
    return FILL_GLYPHS[level]


def event_number(seq_no: int) -> int:
    """The number every view shows for the event `seq_no`: counted from 1, as the status bar's
    "event N/total" and Visualizer.seek(N), which land just after it."""
    return seq_no + 1


def sparkline(values, top: float) -> str:
    """One glyph per value, its height value / top (a zero or less: the lowest bar, so a point is
    always drawn). The TUI's memory sparklines (top 1.0) and attach's counts (top their largest)."""
    if top <= 0:
        return FILL_GLYPHS[1] * len(values)
    return "".join(FILL_GLYPHS[max(1, min(8, round(8 * v / top)))] for v in values)


def block_token_texts(state: ReducerState, block: BlockState, vocab: dict[int, str] | None = None) -> list[str]:
    """The text piece of each token in `block`, read from an owner sequence when there is one
    (its position gives the exact piece), else from the id -> text map of the run."""
    for seq_id in sorted(block.owners):
        table = state.tables.get(seq_id)
        seq = state.seqs.get(seq_id)
        if not table or seq is None:
            continue
        for index, where in enumerate(table):
            if where == (block.device, block.number):
                start = index * state.block_size
                texts = seq.token_texts[start:start + len(block.token_ids)]
                if len(texts) == len(block.token_ids):
                    return texts
    vocab = vocab or {}
    return [vocab.get(token_id, f"<{token_id}>") for token_id in block.token_ids]


def tokens_text(texts: list[str], style_a: Style | str = "", style_b: Style | str = "") -> Text:
    """Token pieces side by side, alternating two styles so each token's edge shows."""
    text = Text()
    for index, piece in enumerate(texts):
        text.append(show_token(piece), style_a if index % 2 == 0 else style_b)
    return text


def touched_blocks(event) -> dict[str, frozenset[int]]:
    """The blocks an event changed, per device (the views underline them)."""
    if event is None:
        return {}
    kind = event.type
    if kind == "copy_on_write":
        return {event.device: frozenset((event.src_block, event.dst_block))}
    if kind == "fork":
        return {event.device: frozenset(event.blocks)}
    if kind in ("swap_out", "swap_in"):
        src, dst = ("gpu", "cpu") if kind == "swap_out" else ("cpu", "gpu")
        return {src: frozenset(a for a, _ in event.mapping), dst: frozenset(b for _, b in event.mapping)}
    block = getattr(event, "block", None)
    if block is not None:
        return {event.device: frozenset((block,))}
    return {}


def pool_counts(state: ReducerState) -> dict[str, tuple[int, int, int]]:
    """Per device: (used, cached-free, free) blocks, in one pass over each pool."""
    counts = {}
    for device, pool in state.pools.items():
        used = cached = 0
        for block in pool:
            if block.state == USED:
                used += 1
            elif block.block_hash is not None:
                cached += 1
        counts[device] = (used, cached, len(pool) - used - cached)
    return counts


# ---------------------------------------------------------------- events in words (the TUI's log, the widgets' log)

MEMORY = frozenset({"block_allocated", "prefix_cache_hit", "block_hashed", "slot_appended", "copy_on_write",
                    "fork", "swap_out", "swap_in", "block_freed", "sequence_freed", "block_evicted"})
FILTERS: dict[str, frozenset[str] | None] = {
    "all events": None,
    "no slots/tokens/digests": frozenset(ev.EVENT_TYPES) - {"slot_appended", "token_generated", "kv_digest"},
    "memory (block manager)": MEMORY,
    "sharing: fork, CoW, hits": frozenset({"fork", "copy_on_write", "prefix_cache_hit", "block_hashed",
                                           "block_evicted"}),
    "swap & preemption": frozenset({"swap_out", "swap_in", "preempted", "kv_digest"}),
    "requests & steps": frozenset({"request_added", "step_started", "step_finished", "sequence_finished",
                                   "preempted"}),
    **{kind: frozenset({kind}) for kind in ev.EVENT_TYPES},
}


def _ids(ids) -> str:
    return ",".join(str(i) for i in ids)


def describe(event: ev.Event, vocab: dict[int, str] | None = None) -> str:
    """One line of plain words for an event."""
    e = event
    kind = e.type
    if kind == "block_allocated":
        return (f"allocate {e.device} {e.block} → seq {_ids(e.seq_ids)} L{e.logical_index} "
                f"ref {e.ref_count} ({len(e.token_ids)} tokens)")
    if kind == "prefix_cache_hit":
        return (f"prefix-cache HIT {e.device} {e.block} #{short_hash(e.block_hash)} → seq {_ids(e.seq_ids)} "
                f"L{e.logical_index} ref {e.ref_count}")
    if kind == "block_hashed":
        parent = f"#{short_hash(e.parent_hash)}" if e.parent_hash is not None else "root"
        return (f"hash {e.device} {e.block} #{short_hash(e.block_hash)} ← {parent}"
                + ("" if e.registered else " (duplicate: map unchanged)"))
    if kind == "slot_appended":
        piece = show_token((vocab or {}).get(e.token_id, f"<{e.token_id}>"))
        return f"append_slot seq {e.seq_id} L{e.logical_index} → {e.device} {e.block}[{e.offset}] '{piece}'"
    if kind == "copy_on_write":
        return (f"copy-on-write seq {e.seq_id} L{e.logical_index}: {e.device} {e.src_block} → "
                f"{e.device} {e.dst_block} (src ref {e.src_ref_count})")
    if kind == "fork":
        return f"fork seq {e.parent_seq_id} → seq {e.child_seq_id} shares {e.device} {_ids(e.blocks)}"
    if kind in ("swap_out", "swap_in"):
        src, dst = ("gpu", "cpu") if kind == "swap_out" else ("cpu", "gpu")
        pairs = " ".join(f"{a}→{b}" for a, b in e.mapping)
        return f"{kind} req {e.request_id} seq {_ids(e.seq_ids)}: {src}→{dst} {pairs}"
    if kind == "block_freed":
        left = "free-but-cached" if e.cached and e.ref_count == 0 else ("free" if e.ref_count == 0 else "kept")
        return f"free {e.device} {e.block} by seq {e.seq_id}: ref {e.ref_count} ({left})"
    if kind == "sequence_freed":
        return f"seq {e.seq_id}: block table freed"
    if kind == "block_evicted":
        return f"evict {e.device} {e.block} #{short_hash(e.block_hash)} (LRU)"
    if kind == "request_added":
        prompt = show_token(e.prompt)[:40]
        return (f"request {e.request_id} added: '{prompt}' ({len(e.prompt_token_ids)} tokens, "
                f"seq {_ids(e.seq_ids)}, n {e.n}, max {e.max_tokens})")
    if kind == "step_started":
        return f"── step {e.step} {e.kind}: seq {_ids(e.seq_ids)} ({e.num_tokens} tokens)"
    if kind == "token_generated":
        return f"seq {e.seq_id} sampled '{show_token(e.text)}' at position {e.position}"
    if kind == "preempted":
        return (f"PREEMPT req {e.request_id} seq {_ids(e.seq_ids)} by {e.mode}: {e.reason}"
                + (f" ({e.num_tokens_lost} tokens to recompute)" if e.num_tokens_lost else ""))
    if kind == "sequence_finished":
        return f"seq {e.seq_id} finished: {e.reason}" + (f" ({e.detail})" if e.detail else "")
    if kind == "kv_digest":
        return f"K/V digest {e.device} {e.block} = {e.digest}"
    if kind == "step_finished":
        return f"── step {e.step} {e.kind} done ({e.num_tokens} tokens)"
    return kind
