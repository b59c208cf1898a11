"""The palette (blockviz/model/palette.py) as Rich styles: the looks of free, cached, selected and
touched cells, a sequence's label, token pieces side by side."""

from __future__ import annotations

from rich.style import Style
from rich.text import Text

from blockviz.model.palette import BLOCK_COLOURS, group_colour, seq_colour, show_token

_TEXT = BLOCK_COLOURS["text"]
FREE_STYLE = Style(color=_TEXT["free"])
CACHED_STYLE = Style(color=_TEXT["cached"], bgcolor=BLOCK_COLOURS["cached"], italic=True)
SELECTED_STYLE = Style(reverse=True, bold=True)
TOUCHED_STYLE = Style(underline=True, bold=True)
NULL_STYLE = Style(color=_TEXT["null"], bgcolor=BLOCK_COLOURS["null"], bold=True)  # vLLM v1's null block (block 0)
QUEUE_HEAD_STYLE = Style(color=BLOCK_COLOURS["head"], bold=True)  # v1: the free queue's head, the next block taken


def seq_style(seq_id: int, projector: bool = False) -> Style:
    return Style(color=_TEXT["used"], bgcolor=seq_colour(seq_id, projector), bold=projector)


def group_style(group: int) -> Style:
    """A KV-cache group's mark: black on the group's colour (palette.group_colour)."""
    return Style(color="#000000", bgcolor=group_colour(group), bold=True)


def tokens_text(texts: list[str], style_a: Style | str = "", style_b: Style | str = "") -> Text:
    """Token pieces side by side, alternating two styles so each token's edge shows."""
    text = Text()
    for index, piece in enumerate(texts):
        text.append(show_token(piece), style_a if index % 2 == 0 else style_b)
    return text
