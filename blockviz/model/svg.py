"""A frame as an SVG picture for slides: the pools, block tables and hash chains at a cursor.

It draws the records of blockviz.model.view.snapshot() (the frame the notebook's widgets draw and a
Moment keeps, with its "cursor" line when there is one) in the notebook's look: the canvas pools of
blockviz/jupyter/static/pool_canvas.js (number, ref count², fill bar, owner colour, second owner's
strip, free dashed, cached slate, last touched and selected outlined), the block tables and the hash
chains, in palette.py's sequence colours (the projector's with `projector=True`). Every block is a
`<g class="block">` carrying data-device / data-block / data-state / data-ref / data-fill, every pool
a `<g class="pool">` with its data-states / data-refs, so a test can read the picture back and
compare it with the reducer state. In a run with several KV-cache groups (a hybrid model's) a used
or cached block carries a badge in its group's colour with the group's number (data-group), each
sequence draws one table per group under the group's label (a window's freed slots as the null
block: data-null), and the legend names the groups. Pure: a string out, no file, no UI import.
"""

from __future__ import annotations

import re
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from blockviz.model.palette import BLOCK_COLOURS, SEQ_COLOURS, SEQ_COLOURS_BOLD, group_colour, ref_mark
from blockviz.model.radix_view import number_ranges
from blockviz.model.pool_zoom import LEGEND as ZOOM_LEGEND, ZoomCells, cell_counts, cell_label, zoom_level
from blockviz.model.view import STATE_CODES, STATE_LABELS

WIDTH = 1280  # px: a 16:9 slide's width at 1x; the height follows the content
FONT_PX = 13  # the notebook's font size is 12 px; a slide is read from further away
PROJECTOR_SCALE = 1.5  # projector: every size this much bigger (fewer cells to a row)
MONO = "DejaVu Sans Mono, Menlo, Consolas, monospace"
CHAR_EM = 0.6  # a monospace character's advance, in em
CELL_EM = (2.9, 2.2)  # a pool cell's width and height in em, as pool_canvas.js
STRIP_EM = 1.3  # the second owner's strip, as pool_canvas.js
GAP, PAD, BAR = 3, 12, 4  # px between cells, around the picture, the fill bar's height
MAX_HASH_ROWS = 32  # chains shown on a slide; the rest summed up in one line
# What one picture draws at most, whatever a trace's header claims (pools of any size, blocks of
# 4,096 slots): the rest is summed up in one line. Limits for a slide, not measurements.
MAX_POOL_CELLS = 1024  # cells drawn per pool: a bigger pool (or range) is drawn zoomed out (pool_zoom)
ZOOM_CELL_EM, ZOOM_GAP = 1.2, 2  # a zoomed-out cell's side in em, the px between them
MAX_TABLE_ROWS = 32  # sequences' block tables
MAX_TABLE_BLOCKS = 32  # logical blocks drawn per table
MAX_SLOTS = 16  # slots drawn per logical block
MAX_SLOT_CHARS = 16  # characters of a slot's token text
# The block states' colours (palette.BLOCK_COLOURS, as the TUI and pool_canvas.js draw them), the
# outlines' widths, and the picture's own inks.
LOOK = {
    **BLOCK_COLOURS, "other": "#9a9a9a", "ink": "#222222", "dim": "#666666",
    "touched": (BLOCK_COLOURS["touched"], 2), "selected": (BLOCK_COLOURS["selected"], 3), "hit": "#ffd400",
    "slot": "#61afef",
}
CODE_NAMES = {code: name for name, code in STATE_CODES.items()}
_NOT_XML = re.compile("[^\t\n\r\u0020-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
_SUPERSCRIPT = str.maketrans("0123456789", "⁰¹²³⁴⁵⁶⁷⁸⁹")


def text_of(value: Any) -> str:
    """Text safe inside an XML element (characters XML cannot hold become '�')."""
    return escape(_NOT_XML.sub("\ufffd", str(value)))


def attr(value: Any) -> str:
    return quoteattr(_NOT_XML.sub("\ufffd", str(value)))


class _Canvas:
    """The picture being laid out top to bottom: SVG elements, a font size, the y reached."""

    def __init__(self, width: int, scale: float, projector: bool) -> None:
        self.width = width
        self.font = FONT_PX * scale
        self.char = CHAR_EM * self.font
        self.line = round(self.font * 1.45)
        self.colours = SEQ_COLOURS_BOLD if projector else SEQ_COLOURS
        self.ink = "#000000" if projector else LOOK["ink"]
        self.dim = "#000000" if projector else LOOK["dim"]
        self.weight = "bold" if projector else "normal"
        self.parts: list[str] = []
        self.y = PAD

    def colour(self, seq_id: int) -> str:
        return self.colours[seq_id % len(self.colours)]

    def text(self, x: float, y: float, words: Any, *, fill: str | None = None, size: float | None = None,
             bold: bool = False, anchor: str = "start", cls: str = "") -> None:
        weight = "bold" if bold else self.weight
        extra = f' class="{cls}"' if cls else ""
        self.parts.append(f'<text x="{x:.1f}" y="{y:.1f}" fill="{fill or self.ink}" font-size="{size or self.font:.1f}" '
                          f'font-weight="{weight}" text-anchor="{anchor}" dominant-baseline="hanging"{extra}>'
                          f"{text_of(words)}</text>")

    def fit(self, words: str, width: float) -> str:
        """`words` cut with '…' to fit `width` px."""
        most = max(1, int(width / self.char))
        return words if len(words) <= most else words[:most - 1] + "…"

    def wrap(self, words: str, width: float) -> list[str]:
        """`words` broken into lines that fit `width` px (nothing cut)."""
        import textwrap

        return textwrap.wrap(words, max(1, int(width / self.char)), break_long_words=True) or [""]

    def heading(self, words: str) -> None:
        self.text(PAD, self.y, words, bold=True)
        self.y += self.line


def frame_svg(frame: dict[str, Any], *, title: str = "", projector: bool = False, width: int = WIDTH) -> str:
    """The SVG picture of `frame` (view.snapshot()'s records, maybe with a "cursor" line): its
    title and cursor, the pools (and beside them a radix-tree run's tree, the frame's "radix":
    blockviz.model.radix_view's record), the block tables and the hash chains, top to bottom."""
    canvas = _Canvas(width, PROJECTOR_SCALE if projector else 1.0, projector)
    _draw_title(canvas, frame, title)
    radix = frame.get("radix")
    top = canvas.y
    if radix is not None:  # a radix-tree run: the pools in the left half, the tree beside them
        canvas.width = width // 2
    for device in ("gpu", "cpu"):
        pool = (frame.get("pools") or {}).get(device)
        if pool and pool["n"]:
            _draw_pool(canvas, device, pool, frame)
    if radix is not None:
        canvas.width, left = width, canvas.y
        canvas.y = top
        _draw_radix(canvas, radix, width // 2 + PAD)
        canvas.y = max(canvas.y, left)
    _draw_legend(canvas, frame)
    _draw_tables(canvas, frame)
    _draw_hashes(canvas, frame)
    height = round(canvas.y + PAD)
    return "\n".join([
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        f'font-family={attr(MONO)} data-step="{frame.get("step", 0)}" data-position="{_cursor(frame).get("position", "")}">',
        f'<rect class="background" x="0" y="0" width="{width}" height="{height}" fill="#ffffff"/>',
        *canvas.parts,
        "</svg>",
    ]) + "\n"


def _cursor(frame: dict[str, Any]) -> dict[str, Any]:
    return frame.get("cursor") or {}


def _draw_title(canvas: _Canvas, frame: dict[str, Any], title: str) -> None:
    cursor = _cursor(frame)
    name = cursor.get("title") or title or "blockviz"
    canvas.text(PAD, canvas.y, canvas.fit(name, canvas.width - 2 * PAD), bold=True, cls="title")
    canvas.y += canvas.line
    if cursor:
        where = f"event {cursor['position']}/{cursor['length']} · {cursor['step']} (of {cursor['num_steps']})"
        caption = cursor.get("current") or "start: no event applied yet"
    else:
        where = f"step {frame.get('step', 0)}" + (f" ({frame['step_kind']})" if frame.get("step_kind") else "")
        caption = ""
    canvas.text(PAD, canvas.y, canvas.fit(where, canvas.width - 2 * PAD), fill=canvas.dim, cls="cursor")
    canvas.y += canvas.line
    # the caption: what the event at the cursor did, whole, on as many lines as it takes
    for line in canvas.wrap(caption, canvas.width - 2 * PAD) if caption else ():
        canvas.text(PAD, canvas.y, line, cls="caption")
        canvas.y += canvas.line
    canvas.y += canvas.line * 0.4


def _draw_legend(canvas: _Canvas, frame: dict[str, Any]) -> None:
    """One row under the pools: a swatch for each block state the picture can show (the null block
    only where a pool has one), the marks, and how a cell reads."""
    pools = [pool for pool in (frame.get("pools") or {}).values() if pool and pool["n"] and not pool.get("empty_line")]
    if not pools:
        return
    states = ["used", "cached", "free"] + (["null"] if any(STATE_CODES["null"] in pool["state"] for pool in pools)
                                           else [])
    size = round(canvas.font)
    x = PAD
    canvas.parts.append('<g class="legend">')
    for name in states:
        fill = (canvas.colour(0) if name == "used" else LOOK["cached"] if name == "cached"
                else LOOK["null"] if name == "null" else "none")
        dash = ' stroke-dasharray="3 3"' if name == "free" else ""
        canvas.parts.append(f'<rect class="swatch" data-state="{name}" x="{x:.1f}" y="{canvas.y:.1f}" width="{size}" '
                            f'height="{size}" rx="2" fill="{fill}" stroke="{LOOK["border"]}" stroke-width="1"{dash}/>')
        label = STATE_LABELS[name] + (" (a sequence's colour)" if name == "used" else "")
        canvas.text(x + size + 4, canvas.y, label, fill=canvas.dim)
        x += size + 4 + (len(label) + 3) * canvas.char
    key = f"cell: block number, {ref_mark(2)}/{ref_mark(3)} = ref count, c = cached, bar = slots filled"
    canvas.text(x, canvas.y, canvas.fit(key, max(canvas.char, canvas.width - PAD - x)), fill=canvas.dim)
    canvas.parts.append("</g>")
    canvas.y += canvas.line * 1.4
    groups = frame.get("kv_cache_groups") or []
    if groups:  # a run with several KV-cache groups: each group's badge colour and label
        x = PAD
        canvas.parts.append('<g class="legend groups">')
        for group in groups:
            canvas.parts.append(f'<rect class="swatch" data-group="{group["group"]}" x="{x:.1f}" y="{canvas.y:.1f}" '
                                f'width="{size}" height="{size}" rx="2" fill="{group["colour"]}" stroke="{LOOK["border"]}"/>')
            canvas.text(x + size + 4, canvas.y, group["label"], fill=canvas.dim)
            x += size + 4 + (len(group["label"]) + 3) * canvas.char
        canvas.parts.append("</g>")
        canvas.y += canvas.line * 1.4


# ------------------------------------------------------------------------------------ pools


def _draw_pool(canvas: _Canvas, device: str, pool: dict[str, Any], frame: dict[str, Any]) -> None:
    """A pool's header line and its grid of cells, one per block; a pool (or the range of it a
    frame is zoomed into: view.pool_record's start and stop) of more than MAX_POOL_CELLS blocks
    zoomed out (_draw_zoomed); a pool with an `empty_line` is only that line."""
    n = pool["n"]
    start, stop = pool.get("start", 0), pool.get("stop", n)
    per_cell = pool.get("per_cell", 1)
    if per_cell > 1:
        cells = ZoomCells(start, stop, per_cell, *(pool["cells"][key] for key in ("used", "cached", "free", "null")))
        return _draw_zoomed(canvas, device, pool, frame, cells)
    if stop - start > MAX_POOL_CELLS:  # exact columns, too many for a slide: zoomed out here
        return _draw_zoomed(canvas, device, pool, frame, cell_counts(
            pool["state"], start, zoom_level(stop - start, MAX_POOL_CELLS, MAX_POOL_CELLS)))
    drawn = stop - start
    ranged = f' data-start="{start}" data-stop="{stop}"' if "start" in pool else ""
    canvas.parts.append(f'<g class="pool" data-device="{device}" data-n="{n}" data-drawn="{drawn}"{ranged} '
                        f'data-states={attr(pool["state"])} data-refs="{",".join(map(str, pool["ref"]))}" '
                        f'data-collapsed="{str(bool(pool.get("empty_line"))).lower()}">')
    if _draw_empty_line(canvas, pool):
        return
    canvas.text(PAD, canvas.y, _pool_line(device, pool) + (f" · blocks {start}-{stop - 1}" if ranged else ""),
                bold=True, cls="pool-line")
    canvas.y += canvas.line
    cw, ch = round(CELL_EM[0] * canvas.font), round(CELL_EM[1] * canvas.font)
    cols = max(1, int((canvas.width - 2 * PAD + GAP) // (cw + GAP)))
    touched = set((frame.get("touched") or {}).get(device, ()))
    selected = frame.get("selected")
    chosen = selected[1] if selected and selected[0] == device else -1
    block_size = frame.get("block_size") or 1
    for i in range(drawn):
        x = PAD + (i % cols) * (cw + GAP)
        y = canvas.y + (i // cols) * (ch + GAP)
        number = start + i
        mark = LOOK["selected"] if number == chosen else LOOK["touched"] if number in touched else None
        canvas.parts.append(_cell(canvas, device, i, number, pool, x, y, cw, ch, block_size, mark))
    canvas.y += ((drawn + cols - 1) // cols) * (ch + GAP) - GAP + canvas.line
    canvas.parts.append("</g>")


def _draw_empty_line(canvas: _Canvas, pool: dict[str, Any]) -> bool:
    """A pool with an `empty_line` is only that line (and its group closed): whether it was one."""
    if not pool.get("empty_line"):
        return False
    canvas.text(PAD, canvas.y, pool["empty_line"], fill=canvas.dim, cls="pool-line")
    canvas.y += canvas.line * 1.4
    canvas.parts.append("</g>")
    return True


def _pool_line(device: str, pool: dict[str, Any]) -> str:
    """The pool's counts as the TUI's status bar says them: free counts the cached blocks too."""
    return (f"{device.upper()} pool · {pool['n']} blocks · {pool['used']} used · {pool['cached'] + pool['free']} free"
            + (f" ({pool['cached']} cached)" if pool["cached"] else ""))


def _draw_zoomed(canvas: _Canvas, device: str, pool: dict[str, Any], frame: dict[str, Any], cells: ZoomCells) -> None:
    """A pool zoomed out (blockviz.model.pool_zoom): a square per `cells.per_cell` blocks, its bar
    the share of them in use, its ground the state most of the rest are in, outlined when it holds
    the selected or a touched block; each a `<g class="cell">` with the blocks it covers
    (data-first, data-last) and its counts (data-used, data-cached, data-free, data-null)."""
    codes = cells.codes()
    canvas.parts.append(f'<g class="pool zoomed" data-device="{device}" data-n="{pool["n"]}" data-start="{cells.start}" '
                        f'data-stop="{cells.stop}" data-per-cell="{cells.per_cell}" data-cells="{cells.num_cells}" '
                        f'data-states={attr(codes)} data-collapsed="{str(bool(pool.get("empty_line"))).lower()}">')
    if _draw_empty_line(canvas, pool):
        return
    whole = cells.start == 0 and cells.stop == pool["n"]
    canvas.text(PAD, canvas.y, canvas.fit(_pool_line(device, pool) + ("" if whole else f" · blocks {cells.start}-{cells.stop - 1}")
                                          + f" · {cell_label(cells.per_cell)}", canvas.width - 2 * PAD), bold=True, cls="pool-line")
    canvas.y += canvas.line
    canvas.text(PAD, canvas.y, canvas.fit(f"{cell_label(cells.per_cell)} · {ZOOM_LEGEND}", canvas.width - 2 * PAD),
                fill=canvas.dim, cls="pool-legend")
    canvas.y += canvas.line
    side = round(ZOOM_CELL_EM * canvas.font)
    cols = max(1, int((canvas.width - 2 * PAD + ZOOM_GAP) // (side + ZOOM_GAP)))
    marks = {}
    for number in (frame.get("touched") or {}).get(device, ()):
        if (cell := cells.cell_of(number)) is not None:
            marks[cell] = LOOK["touched"]
    selected = frame.get("selected")
    if selected and selected[0] == device and (cell := cells.cell_of(selected[1])) is not None:
        marks[cell] = LOOK["selected"]
    for i in range(cells.num_cells):
        x = PAD + (i % cols) * (side + ZOOM_GAP)
        y = canvas.y + (i // cols) * (side + ZOOM_GAP)
        canvas.parts.append(_zoom_cell(device, cells, i, x, y, side, marks.get(i)))
    canvas.y += ((cells.num_cells + cols - 1) // cols) * (side + ZOOM_GAP) - ZOOM_GAP + canvas.line
    canvas.parts.append("</g>")


def _zoom_cell(device: str, cells: ZoomCells, i: int, x: float, y: float, side: int,
               mark: tuple[str, int] | None) -> str:
    blocks = cells.blocks_of(i)
    used, cached, free, null = cells.used[i], cells.cached[i], cells.free[i], cells.null[i]
    eighths, ground = cells.look(i)
    title = (f"{device} blocks {blocks.start}-{blocks.stop - 1} · {used} used · {cached} cached · {free} free"
             + (f" · {null} null" if null else ""))
    fill = {"cached": LOOK["cached"], "null": LOOK["null"]}.get(ground, "none")
    out = [f'<g class="cell" data-device="{device}" data-first="{blocks.start}" data-last="{blocks.stop - 1}" '
           f'data-used="{used}" data-cached="{cached}" data-free="{free}" data-null="{null}">',
           f"<title>{text_of(title)}</title>",
           f'<rect x="{x:.1f}" y="{y:.1f}" width="{side}" height="{side}" fill="{fill}" stroke="{LOOK["border"]}" '
           f'stroke-width="1"/>']
    if eighths:
        height = (side - 2) * eighths / 8
        out.append(f'<rect class="fill" x="{x + 1:.1f}" y="{y + side - 1 - height:.1f}" width="{side - 2}" '
                   f'height="{height:.1f}" fill="{LOOK["used"]}"/>')
    if mark is not None:
        colour, width = mark
        out.append(f'<rect class="mark" x="{x + width / 2:.1f}" y="{y + width / 2:.1f}" width="{side - width}" '
                   f'height="{side - width}" fill="none" stroke="{colour}" stroke-width="{width}"/>')
    out.append("</g>")
    return "".join(out)


def _cell(canvas: _Canvas, device: str, i: int, number: int, pool: dict[str, Any], x: float, y: float, cw: int,
          ch: int, block_size: int, mark: tuple[str, int] | None) -> str:
    """One block (`number`, at index `i` of the pool's columns): background (owner colour, cached
    slate, nothing when free), the fill bar, the second owner's strip, the border (dashed when
    free), number and ref count, an outline when marked."""
    code = pool["state"][i]
    name = CODE_NAMES.get(code, code)
    ref, fill, owner, owner2 = pool["ref"][i], pool["fill"][i], pool["owner"][i], pool["owner2"][i]
    group = pool["group"][i] if "group" in pool else -1
    look = name if name in LOOK["text"] else "free"
    out = [f'<g class="block" data-device="{device}" data-block="{number}" data-state={attr(name)} data-ref="{ref}" '
           f'data-fill="{fill}" data-owner="{owner}" data-owner2="{owner2}"'
           + (f' data-group="{group}"' if "group" in pool else "") + ">",
           f"<title>{text_of(_block_title(device, number, name, ref, fill, block_size, owner, owner2))}</title>"]
    background = (canvas.colour(owner) if name == "used" and owner >= 0 else LOOK["cached"] if name == "cached"
                  else LOOK["null"] if name == "null" else LOOK["other"] if name not in LOOK["text"] else "none")
    dash = ' stroke-dasharray="3 3"' if look == "free" else ""
    out.append(f'<rect x="{x:.1f}" y="{y:.1f}" width="{cw}" height="{ch}" rx="3" fill="{background}" '
               f'stroke="{LOOK["border"]}" stroke-width="1"{dash}/>')
    if name == "used" and owner >= 0 and owner2 >= 0:
        strip = STRIP_EM * canvas.font
        out.append(f'<rect x="{x + cw - 1 - strip:.1f}" y="{y + 1:.1f}" width="{strip:.1f}" height="{ch - 2}" '
                   f'fill="{canvas.colour(owner2)}"/>')
    if fill > 0 and look != "free":
        bar = (cw - 2) * min(fill, block_size) / block_size
        out.append(f'<rect class="fill" x="{x + 1:.1f}" y="{y + ch - 1 - BAR:.1f}" width="{bar:.1f}" height="{BAR}" '
                   f'fill="{LOOK["bar"][look]}"/>')
    size = canvas.font * 0.92
    out.append(f'<text x="{x + 4:.1f}" y="{y + 3:.1f}" fill="{LOOK["text"][look]}" font-size="{size:.1f}" '
               f'font-weight="bold" dominant-baseline="hanging">{number}</text>')
    sup = str(ref).translate(_SUPERSCRIPT) if ref > 1 else ("c" if name == "cached" else "")
    if sup:
        out.append(f'<text x="{x + cw - 4:.1f}" y="{y + 2:.1f}" fill="{LOOK["text"][look]}" font-size="{size:.1f}" '
                   f'font-weight="bold" text-anchor="end" dominant-baseline="hanging">{sup}</text>')
    if group >= 0:  # its KV-cache group's badge, bottom right, above the fill bar
        side = round(canvas.font)
        bx, by = x + cw - 2 - side, y + ch - 2 - BAR - side
        out.append(f'<rect class="group" x="{bx:.1f}" y="{by:.1f}" width="{side}" height="{side}" rx="2" '
                   f'fill="{group_colour(group)}"/><text x="{bx + side / 2:.1f}" y="{by + 1:.1f}" fill="#000000" '
                   f'font-size="{size * 0.8:.1f}" font-weight="bold" text-anchor="middle" '
                   f'dominant-baseline="hanging">{group}</text>')
    if mark is not None:
        colour, width = mark
        inset = width / 2
        out.append(f'<rect class="mark" x="{x + inset:.1f}" y="{y + inset:.1f}" width="{cw - width}" '
                   f'height="{ch - width}" rx="2" fill="none" stroke="{colour}" stroke-width="{width}"/>')
    out.append("</g>")
    return "".join(out)


def _block_title(device: str, i: int, name: str, ref: int, fill: int, block_size: int, owner: int, owner2: int) -> str:
    """A block's tooltip, as the notebook's (blockviz.js blockTitle)."""
    owners = [str(s) for s in (owner, owner2) if s >= 0]
    return (f"{device} block {i} · {STATE_LABELS.get(name, name)} · ref {ref} · {fill}/{block_size} slots"
            + (f" · seq {','.join(owners)}" if owners else ""))


# ------------------------------------------------------------------------------------ tables and chains


def _draw_tables(canvas: _Canvas, frame: dict[str, Any]) -> None:
    """Each sequence's block table: its chip and status, then logical block -> physical block boxes
    holding the token in each slot, wrapped to the width."""
    rows = frame.get("tables") or []
    canvas.heading("Block tables (logical → physical)")
    if not rows:
        canvas.text(PAD, canvas.y, "no sequences yet", fill=canvas.dim)
        canvas.y += canvas.line * 1.4
        return
    block_size = frame.get("block_size") or 1
    for row in rows[:MAX_TABLE_ROWS]:
        chip = row.get("name") or f"seq {row['seq']}"
        chip_w = len(chip) * canvas.char + 8
        canvas.parts.append(f'<g class="table" data-seq="{row["seq"]}">')
        canvas.parts.append(f'<rect x="{PAD}" y="{canvas.y - 1:.1f}" width="{chip_w:.1f}" height="{canvas.line}" rx="3" '
                            f'fill="{canvas.colour(row["seq"])}"/>')
        canvas.text(PAD + 4, canvas.y + 1, chip, fill="#000000")
        label = f" · {row['status']}" + (f" ({row['finish']})" if row.get("finish") else "")
        canvas.text(PAD + chip_w, canvas.y + 1, label, fill=canvas.dim)
        canvas.y += canvas.line + 2
        tables = [(0, row.get("label", ""), row["blocks"], row.get("skipped", [])),
                  *((g["group"], g["label"], g["blocks"], g["skipped"]) for g in row.get("groups", []))]
        for group, label, blocks, skipped in tables:
            if label:  # one table per KV-cache group
                canvas.parts.append(f'<g class="group-table" data-group="{group}">')
                canvas.parts.append(f'<rect x="{PAD}" y="{canvas.y:.1f}" width="{canvas.font:.1f}" height="{canvas.font:.1f}" '
                                    f'rx="2" fill="{group_colour(group)}"/>')
                canvas.text(PAD + canvas.font + 4, canvas.y, label, fill=canvas.dim, cls="group-label")
                canvas.y += canvas.line
            _draw_lblocks(canvas, {"blocks": blocks, "skipped": skipped}, block_size)
            if label:
                canvas.parts.append("</g>")
        canvas.parts.append("</g>")
    if len(rows) > MAX_TABLE_ROWS:
        canvas.text(PAD, canvas.y, f"… {len(rows) - MAX_TABLE_ROWS} more sequences", fill=canvas.dim)
        canvas.y += canvas.line
    canvas.y += canvas.line * 0.4


def _draw_lblocks(canvas: _Canvas, row: dict[str, Any], block_size: int) -> None:
    if not row["blocks"]:
        canvas.text(PAD, canvas.y, "no blocks", fill=canvas.dim)
        canvas.y += canvas.line * 1.3
        return
    x, box_h = PAD, 2 * canvas.line + 4
    skipped = set(row.get("skipped", ()))
    for index, (device, number, ref, texts) in enumerate(row["blocks"][:MAX_TABLE_BLOCKS]):
        null = index in skipped  # a slot a sliding window let go: the null block
        head = f"L{index} → ∅ null block" if null else f"L{index} → {device} {number}" + (f" ×{ref}" if ref > 1 else "")
        slots = [canvas.fit(str(texts[s]), MAX_SLOT_CHARS * canvas.char) if s < len(texts) else "·"
                 for s in range(min(block_size, MAX_SLOTS))]
        if block_size > MAX_SLOTS:
            slots.append(f"+{block_size - MAX_SLOTS}")
        widths = [max(1, len(piece)) * canvas.char + 4 for piece in slots]
        box_w = max(len(head) * canvas.char, sum(widths) + len(widths) - 1) + 8
        if x > PAD and x + box_w > canvas.width - PAD:
            x, canvas.y = PAD, canvas.y + box_h + 4
        dash = ' stroke-dasharray="2 2"' if device == "cpu" else ""
        canvas.parts.append(f'<g class="lblock" data-device="{device}" data-block="{number}" data-ref="{ref}" '
                            f'data-logical="{index}"' + (' data-null="true"' if null else "")
                            + f'><rect x="{x:.1f}" y="{canvas.y:.1f}" width="{box_w:.1f}" '
                            f'height="{box_h}" rx="3" fill="{LOOK["null"] if null else "none"}" stroke="#888888"{dash}/>')
        canvas.text(x + 4, canvas.y + 2, head, fill=LOOK["text"]["null"] if null else canvas.dim, size=canvas.font * 0.92)
        sx = x + 4
        for s, (piece, w) in enumerate(zip(slots, widths)):
            filled = s < len(texts)
            if filled:
                canvas.parts.append(f'<rect x="{sx:.1f}" y="{canvas.y + canvas.line + 1:.1f}" width="{w:.1f}" '
                                    f'height="{canvas.line - 2}" rx="2" fill="{LOOK["slot"]}" fill-opacity="0.25"/>')
            canvas.text(sx + 2, canvas.y + canvas.line + 2, piece, fill=canvas.ink if filled else "#999999")
            sx += w + 1
        canvas.parts.append("</g>")
        x += box_w + 4
    if len(row["blocks"]) > MAX_TABLE_BLOCKS:
        canvas.text(x, canvas.y + 2, f"… {len(row['blocks']) - MAX_TABLE_BLOCKS} more blocks", fill=canvas.dim)
    canvas.y += box_h + 8


def _draw_hashes(canvas: _Canvas, frame: dict[str, Any]) -> None:
    """The hash chains: each hashed block's hash after its parent's, indented where a chain branches,
    hits lit; at most MAX_HASH_ROWS rows."""
    rows = frame.get("hashes") or []
    summary = frame.get("hash_summary") or {}
    if not rows and not summary.get("in_map"):
        return
    canvas.heading("Hash chains (prefix cache)")
    canvas.text(PAD, canvas.y, f"{summary.get('in_map', 0)} hashes in the map · hits {summary.get('hits', 0)}"
                               f"/{summary.get('looked_up', 0)} prompt blocks looked up", fill=canvas.dim)
    canvas.y += canvas.line
    for row in rows[:MAX_HASH_ROWS]:
        x = PAD + row["depth"] * 2 * canvas.char
        lead = f"{row['branch']} " if row["branch"] else ""
        hash_x = x + len(lead) * canvas.char
        hit = row["hits"] > 0
        canvas.parts.append(f'<g class="hash" data-block="{row["block"]}" data-hits="{row["hits"]}" '
                            f'data-state={attr(row["state"])}>')
        if hit or row["hit_now"]:
            stroke = ' stroke="#000000" stroke-width="2"' if row["hit_now"] else ""
            canvas.parts.append(f'<rect x="{hash_x - 1:.1f}" y="{canvas.y - 1:.1f}" width="{len(row["hash"]) * canvas.char + 2:.1f}" '
                                f'height="{canvas.line - 2}" fill="{LOOK["hit"] if hit else "none"}"{stroke}/>')
        canvas.text(x, canvas.y, lead, fill=canvas.dim)
        canvas.text(hash_x, canvas.y, row["hash"], bold=True)
        rest = (f" ← {row['parent'] or 'root'} · block {row['block']} · ref {row['ref']}"
                + (f" · {row['hits']} hit{'s' if row['hits'] > 1 else ''}" if hit else "")
                + (" · cached" if row["state"] == "cached" else "") + "  " + " ".join(row["tokens"]))
        rest_x = hash_x + (len(row["hash"]) + 0.5) * canvas.char
        canvas.text(rest_x, canvas.y, canvas.fit(rest, canvas.width - PAD - rest_x), fill=canvas.ink)
        canvas.parts.append("</g>")
        canvas.y += canvas.line
    if len(rows) > MAX_HASH_ROWS:
        canvas.text(PAD, canvas.y, f"… {len(rows) - MAX_HASH_ROWS} more hashed blocks", fill=canvas.dim)
        canvas.y += canvas.line


# ------------------------------------------------------------------------------------ radix tree


def _draw_radix(canvas: _Canvas, radix: dict[str, Any], x0: float) -> None:
    """SGLang's radix tree (blockviz.model.radix_view.RadixRecord as JSON) from `x0` to the right
    edge: the sizes, one line per node indented by depth (a `<g class="radix-node">` carrying
    data-node / data-parent / data-tokens / data-lock / data-slots / data-evictable), the nodes not
    drawn counted, the last split and eviction, each running request's match."""
    width = canvas.width - PAD - x0
    canvas.parts.append(f'<g class="radix" data-nodes="{radix["num_nodes"]}" data-more="{radix["num_more"]}" '
                        f'data-evictable="{radix["evictable_size"]}" data-protected="{radix["protected_size"]}">')
    canvas.text(x0, canvas.y, canvas.fit("Radix tree (SGLang RadixCache)", width), bold=True)
    canvas.y += canvas.line
    canvas.text(x0, canvas.y, canvas.fit(f"evictable {radix['evictable_size']} · protected {radix['protected_size']} "
                                         f"tokens · {radix['num_nodes']} nodes · page_size {radix['page_size']} · "
                                         "@ last access step", width), fill=canvas.dim)
    canvas.y += canvas.line
    for node in radix["nodes"]:
        x = x0 + (node["depth"] + 1) * 2 * canvas.char
        canvas.parts.append(f'<g class="radix-node" data-node="{node["id"]}" data-parent="{node["parent"] if node["parent"] is not None else ""}" '
                            f'data-tokens="{node["num_tokens"]}" data-lock="{node["lock_ref"]}" '
                            f'data-slots="{",".join(map(str, node["slots"]))}" data-evictable="{str(node["evictable"]).lower()}">')
        if node["about"]:
            canvas.parts.append(f'<rect x="{x - 2:.1f}" y="{canvas.y - 1:.1f}" width="{(canvas.width - PAD) - x + 2:.1f}" '
                                f'height="{canvas.line - 2}" fill="none" stroke="{LOOK["touched"][0]}" stroke-width="2"/>')
        lock = (f"lock {node['lock_ref']}" + (f" ({', '.join(node['holders'])})" if node["holders"] else "")
                if node["lock_ref"] else "evictable" if node["evictable"] else "unlocked")
        words = (f"#{node['id']} {node['num_tokens']}t {lock}"
                 + (f" @{node['last_access']}" if node["last_access"] is not None else "")
                 + f" b{number_ranges(node['blocks'])}  " + "".join(node["tokens"]))
        canvas.text(x, canvas.y, canvas.fit(words, (canvas.width - PAD) - x),
                    fill="#b00020" if node["lock_ref"] else canvas.ink)
        canvas.parts.append("</g>")
        canvas.y += canvas.line
    if radix["num_more"]:
        canvas.text(x0, canvas.y, f"… {radix['num_more']} more nodes", fill=canvas.dim)
        canvas.y += canvas.line
    split, evicted = radix.get("last_split"), radix.get("last_evicted")
    lines = []
    if split:
        lines.append(("split", f"split (step {split['step']}): #{split['new_node']} took {split['at']} tokens "
                               f"{''.join(split['head'])} | #{split['node']} kept {''.join(split['tail'])}"))
    if evicted:
        call = f" (evict asked {evicted['asked']}, freed {evicted['freed']})" if evicted.get("asked") is not None else ""
        lines.append(("evicted", f"evicted (step {evicted['step']}): #{evicted['node']}{call}, {evicted['num_tokens']} tokens, "
                                 f"slots {number_ranges(evicted['slots'])}: {evicted['why']}"))
    for match in radix.get("matches") or []:
        lines.append(("match", f"{match['name']} matched {match['num_tokens']} tokens"
                               + (f": slots {number_ranges(match['slots'])}" if match["num_tokens"] else "")))
    for cls, words in lines:
        for line in canvas.wrap(words, width):
            canvas.text(x0, canvas.y, line, fill=canvas.dim, cls=f"radix-{cls}")
            canvas.y += canvas.line
    canvas.parts.append("</g>")
