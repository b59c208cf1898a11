"""How things look, shared by every view: sequence colours, block-state colours, block tints, fill
glyphs, token text made visible, short hashes, event numbers.

Plain values (hex colours, strings), no rich or textual import: the TUI turns them into Rich styles
(blockviz/tui/styles.py), the Jupyter widgets send them to the page (PoolView's palette: the canvas
and the CSS read them there), and the SVG export (blockviz/model/svg.py) writes them, so every view
agrees on what colour a sequence or a cached block is.
"""

from __future__ import annotations

import codecs
import functools
import re

# Distinct, dark-on-light-readable hues for sequences (index = seq_id % len).
SEQ_COLOURS = (
    "#e06c75", "#61afef", "#98c379", "#e5c07b", "#c678dd", "#56b6c2",
    "#d19a66", "#ff79c6", "#8be9fd", "#b5e853", "#bd93f9", "#ffb86c",
)
# Projector mode: fewer, stronger colours.
SEQ_COLOURS_BOLD = ("#ff3b3b", "#2f8fff", "#2fd12f", "#ffd400", "#d25cff", "#00d8d8", "#ff8c1a", "#ff4fb8")
# How a block looks in each state (view.block_state: used, cached, free, null), in every view.
BLOCK_COLOURS = {
    "border": "#6b6b6b",  # a cell's border (dashed when the block is free)
    "cached": "#3c4a5a",  # a free-but-cached block's background (a used block's is its first owner's colour)
    "null": "#1e1a12",  # vLLM v1's null block's background
    "text": {"used": "#000000", "cached": "#e8e8e8", "free": "#6b6b6b", "null": "#b08a3e"},  # its number
    "bar": {"used": "#101010", "cached": "#e8e8e8", "free": "#101010", "null": "#101010"},  # its fill bar
    "touched": "#ffd400",  # the outline of a block the last event touched
    "selected": "#ff3b3b",  # the outline of the inspected block
    "head": "#ff8c1a",  # vLLM v1: the free queue's head (the next block taken), its number
    "used": "#4f9d69",  # a zoomed-out cell's bar: the share of its blocks in use (blockviz.model.pool_zoom)
}
# Background tints for "which block holds this token" (index = block number % len), two shades each.
BLOCK_TINTS = (
    ("#3b2f5c", "#4a3b73"), ("#23465c", "#2c5873"), ("#2f5c3b", "#3b734a"), ("#5c4a23", "#73602c"),
    ("#5c2f4e", "#733b62"), ("#2f5458", "#3b6a6e"), ("#503a2a", "#664a36"), ("#3f3f5c", "#4f4f73"),
)
CPU_TINTS = ("#454545", "#575757")
# A run with several KV-cache groups (a hybrid model's: vLLM kv_cache_group_id) marks each used or
# cached block with its group: the group's number as a subscript on a notch (TUI) or strip
# (notebook, SVG) of the group's colour, beside the state colours, which stay as they are. Light
# hues, black text on them: legible on a terminal and a projector. A one-group run has no mark.
GROUP_COLOURS = ("#e8e8e8", "#7fc8ff", "#ffb347", "#d9a0ff", "#a8e6a1", "#ff9eb8")
_SUBSCRIPTS = str.maketrans("0123456789", "₀₁₂₃₄₅₆₇₈₉")
FILL_GLYPHS = " ▁▂▃▄▅▆▇█"

_VISIBLE = {" ": "·", "\n": "⏎", "\t": "⇥", "\r": "␍", "Ġ": "·", "Ċ": "⏎", "▁": "·"}


def seq_colour(seq_id: int, projector: bool = False) -> str:
    colours = SEQ_COLOURS_BOLD if projector else SEQ_COLOURS
    return colours[seq_id % len(colours)]


def group_colour(group: int) -> str:
    """The colour of KV-cache group `group`'s mark (GROUP_COLOURS)."""
    return GROUP_COLOURS[group % len(GROUP_COLOURS)]


def group_mark(group: int) -> str:
    """KV-cache group `group`'s mark: its number as subscript digits ("₁")."""
    return str(group).translate(_SUBSCRIPTS)


def block_tint(device: str, number: int, shade: int = 0) -> str:
    if device == "cpu":
        return CPU_TINTS[shade % 2]
    return BLOCK_TINTS[number % len(BLOCK_TINTS)][shade % 2]


@functools.lru_cache(maxsize=1 << 16)  # a run's pieces come back every frame (the block tables redraw them)
def show_token(text: str) -> str:
    """A token's text with spaces, newlines and tabs made visible ('·', '⏎', '⇥'); byte-level BPE
    markers (Ġ, Ċ), control characters (C0, DEL and C1: a piece that completes a split character
    can be one), Unicode line separators and bidi controls, and U+FFFD never reach the screen raw."""
    out = []
    for ch in text:
        if ch in _VISIBLE:
            out.append(_VISIBLE[ch])
        elif ord(ch) < 32 or 0x7f <= ord(ch) <= 0x9f:
            out.append(f"\\x{ord(ch):02x}")
        elif ch in "\u2028\u2029" or 0x202a <= ord(ch) <= 0x202e or 0x2066 <= ord(ch) <= 0x2069:
            out.append(f"\\u{ord(ch):04x}")  # line breaks and bidi controls a terminal would obey
        elif ch == "\ufffd":  # part of a multi-byte character (an old trace's text): never drawn as �
            out.append("◌")
        else:
            out.append(ch)
    return "".join(out) or "∅"


_BYTE = re.compile(r"(\\x[0-9a-f]{2})")  # one byte of a partial character, as token_texts writes it
_BYTE_RUN = re.compile(r"(?:\\x[89a-f][0-9a-f])+")  # consecutive non-ASCII bytes: parts of characters


def show_tokens(texts: list[str]) -> list[str]:
    """Token pieces side by side, each as show_token draws it, except where pieces hold the bytes of
    a multi-byte character ('\\xf0\\x9f' then '\\x8c\\xb9': an emoji or a CJK character split by
    byte-level BPE): the piece that completes the character draws it, the pieces before it '◌'.
    Bytes that never complete a character (a lone continuation byte such as '\\xa6', a character cut
    off by the end of the list) are drawn '◌' too, one per run of bytes: a part of a character, never
    an escape code; their values stay in the token pieces (a trace's `prompt_tokens_text` and `text`)."""
    out = [show_token(_BYTE_RUN.sub("◌", t)) for t in texts]
    if not any("\\x" in text for text in texts):  # no piece holds a byte of a split character
        return out
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    waiting: list[tuple[int, str]] = []  # pieces whose last bytes began a character not yet complete
    for index, text in enumerate(texts):
        if not _BYTE.search(text):
            decoder.reset()
            waiting = []
            continue
        raw = b"".join(bytes([int(part[2:], 16)]) if _BYTE.fullmatch(part) else part.encode()
                       for part in _BYTE.split(text) if part)
        try:
            done = decoder.decode(raw)
        except UnicodeDecodeError:  # not one character after all: these pieces' bytes stay '◌'
            decoder.reset()
            waiting = []
            continue
        if done:
            for earlier, before in waiting:
                out[earlier] = (show_token(before) if before else "") + "◌"
            out[index] = show_token(done)
            waiting = []
        if decoder.getstate()[0]:  # bytes still waiting for the rest of their character
            waiting.append((index, done))
    return out


def short_hash(block_hash: int | None, digits: int = 6) -> str:
    """A block hash as `digits` hex digits (the top bits of the 64-bit xxh64)."""
    if block_hash is None:
        return "—"
    return f"{block_hash & 0xFFFFFFFFFFFFFFFF:016x}"[:digits]


def fill_glyph(num_tokens: int, block_size: int) -> str:
    if num_tokens <= 0:
        return " "
    level = max(1, min(8, round(8 * num_tokens / block_size)))
    return FILL_GLYPHS[level]


_SUPERSCRIPT_DIGITS = "⁰¹²³⁴⁵⁶⁷⁸⁹"
WIDE_FILL, WIDE_EMPTY = "█", "░"  # a wide cell's fill bar: slots holding tokens, then empty slots


def ref_mark(ref: int, wide: bool = False) -> str:
    """How a cell marks a shared block's ref count: a superscript in a one-character mark (the
    TUI's narrow cells, the notebook's canvas, the SVG), "×N" in the TUI's wide cells; "" when the
    block is not shared."""
    if ref < 2:
        return ""
    if wide:
        return f"×{ref}"
    return _SUPERSCRIPT_DIGITS[ref] if ref < 10 else "⁺"


def fill_sample(wide: bool = False) -> str:
    """How a cell shows its fill (slots holding tokens / block_size), as the legend shows it: the
    narrow cell's one glyph of eighths, the wide cell's bar."""
    return f"{FILL_GLYPHS[1]}…{FILL_GLYPHS[8]}" if not wide else WIDE_FILL * 2 + WIDE_EMPTY * 2


def legend_line(wide: bool = False) -> str:
    """The pool grid's legend under it, in the marks its cells at that width draw."""
    return f"{fill_sample(wide)} fill · {ref_mark(2, wide)} refs · c cached"


def cell_legend(wide: bool = False) -> tuple[tuple[str, str], ...]:
    """The help's pool-grid legend, (key, meaning) rows, in the marks the pool's cells at that width
    draw (ref_mark, fill_sample): one source for the cells and every legend of them."""
    shape = ("two lines: block number and ref count, then the fill bar" if wide
             else "one line: block number, ref count, fill glyph")
    return (
        ("cell", f"{shape}; {ref_mark(2, wide)}, {ref_mark(3, wide)} = ref count when shared (more than one "
                 f"block table points at it); {fill_sample(wide)} = slots holding tokens / block_size"),
        ("colour", "the owning sequence; a shared block shows its first owner on the number and its second on the rest"),
        ("grey", "free block (on the free list)"),
        ("slate c", "free but cached: still in the prefix-cache hash map, a hit revives it "
                    "(nano-vllm BlockManager.hash_to_block_id)"),
        ("underline", "the block the last event touched"),
        ("reverse", "the selected block (see the inspector)"),
    )


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
