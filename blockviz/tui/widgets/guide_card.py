"""The guide's card: what just happened, the blocks involved, why, and the upstream function that did
it, labelled by whose it is ("vLLM: ", "SGLang: "; blockviz/model/guide.py computes the Card; this
only draws it). Shown while guided playback rests
on a card; the app's CSS makes it large in projector mode."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.widgets import Static

from blockviz.model.guide import Card


class GuideCard(Static):
    """One card at a time; `show(None)` hides it."""

    DEFAULT_CSS = """
    GuideCard {
        display: none;
        height: auto;
        max-height: 10;
        border: round $warning;
        border-title-color: $warning;
        border-title-style: bold;
        padding: 0 1;
    }
    GuideCard.-shown {
        display: block;
    }
    GuideCard.-opening {
        max-height: 14;
    }
    """

    def show(self, card: Card | None, counter: str = "") -> None:
        """Draw `card` under its counter (Guide.counter: "card 2 of 6"), or hide."""
        self.card = card
        self.set_class(card is not None, "-shown")
        self.set_class(card is not None and card.idea == "kv-cache", "-opening")  # nothing else on screen yet
        if card is None:
            return
        self.border_title = f"{counter}: {card.title}" if counter else card.title
        self.border_subtitle = "space or ] plays on"
        self.update(Group(  # the blocks are named in `what` and highlighted in the pools
            Text(card.what),
            Text.assemble(("why: ", "bold"), card.why),
            Text.assemble((f"{card.upstream}: ", "bold"), (card.function, "italic")),
            *([Text.assemble(("words (? defines them): ", "bold"), " · ".join(card.terms))]
              if card.terms else []),
        ))
