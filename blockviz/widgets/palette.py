"""How things look, shared by every view: sequence colours, block tints, token text, short hashes.

Pure functions over the reducer's state (no textual import), so they are cheap to test and the
pool grid, block tables, text view and inspector agree on what colour a sequence is.
"""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from engine.reducer import USED, BlockState, ReducerState

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


def sorted_owners(block: BlockState) -> list[int]:
    return sorted(block.owners)


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


def seq_label(state: ReducerState, seq_id: int) -> Text:
    seq = state.seqs.get(seq_id)
    label = Text(f" seq {seq_id} ", style=seq_style(seq_id))
    if seq is not None:
        label.append(f" req {seq.request_id} · {seq.status}", style="bold" if seq.status == "running" else "dim")
    return label


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
