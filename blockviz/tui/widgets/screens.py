"""Modal screens: help (keys, legend, where each idea comes from) and the add-request prompt."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from blockviz.model.glossary import BASICS, GLOSSARY
from blockviz.model.palette import cell_legend


def _table(title: str, rows) -> Table:
    """Two columns, the first bold: a key or term, then what it means."""
    table = Table(title=title, show_header=False, box=None, padding=(0, 2), title_justify="left")
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    for row in rows:
        table.add_row(*row)
    return table


class HelpScreen(ModalScreen[None]):
    """Keys (from the app's bindings), the grid legend and a glossary keyed to vLLM and nano-vllm functions."""

    DEFAULT_CSS = """
    HelpScreen {
        align: center middle;
    }
    HelpScreen > VerticalScroll {
        width: 90%;
        max-width: 110;
        height: 90%;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    """

    AUTO_FOCUS = "VerticalScroll"
    BINDINGS = [
        Binding("escape,q,question_mark,f1", "dismiss", "Close help"),
    ]

    def __init__(self, bindings: list[tuple[str, str]], wide: bool = False) -> None:
        """`wide`: the pool draws wide cells (×2, a bar), so the legend says those marks."""
        super().__init__()
        self.key_rows = bindings
        self.wide = wide

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("blockviz — every picture is the engine's real block-manager state", "bold"))
            yield Static(_table("The words, first", BASICS))
            yield Static(_table("Keys", self.key_rows))
            yield Static(_table("Pool grid legend", cell_legend(self.wide)), id="legend")
            yield Static(_table("What you are looking at", GLOSSARY))
            yield Static(Text("escape closes this help", "dim"))

    def action_dismiss(self) -> None:
        self.dismiss(None)


class AskScreen(ModalScreen[str | None]):
    """Ask for one line (a prompt, the breakpoint kinds); dismisses with it, or None on escape."""

    DEFAULT_CSS = """
    AskScreen {
        align: center middle;
    }
    AskScreen > Vertical {
        width: 70;
        height: auto;
        border: thick $accent;
        background: $surface;
        padding: 0 1;
    }
    """

    AUTO_FOCUS = "Input"
    BINDINGS = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, question: str, placeholder: str = "", value: str = "") -> None:
        super().__init__()
        self.question, self.placeholder, self.value = question, placeholder, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.question)
            yield Input(value=self.value, placeholder=self.placeholder, id="answer")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.dismiss(event.value or None)

    def action_cancel(self) -> None:
        self.dismiss(None)
