"""Modal screens: help (keys, legend, where each idea comes from) and the add-request prompt."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

LEGEND = (
    ("cell", "block number, then the ref count as a superscript when shared (²), then the fill glyph ▁…█ (slots holding "
             "tokens / block_size)"),
    ("colour", "the owning sequence; a shared block shows its first owner on the number and its "
               "second on the rest"),
    ("grey", "free block (on the free list)"),
    ("slate c", "free but cached: still in the prefix-cache hash map, a hit revives it (nano-vllm BlockManager.hash_to_block_id)"),
    ("underline", "the block the last event touched"),
    ("reverse", "the selected block (see the inspector)"),
)

GLOSSARY = (
    ("allocate", "prefill: one block table per request, shared by its n sequences (vLLM v0 BlockSpaceManager.allocate)"),
    ("append_slot", "decode: the new token gets a slot; a fresh block when the last one is full"),
    ("copy-on-write", "the last block was shared (ref > 1): copy it before writing (vLLM v0 append_slots)"),
    ("fork", "n > 1: the child shares every block of its parent, ref count +1"),
    ("swap_out / swap_in", "preemption by swap: blocks move GPU ↔ CPU pool, K/V copied (vLLM v0 swap_out / swap_in)"),
    ("recompute", "preemption by recompute: blocks freed, the K/V is computed again later"),
    ("hash chain", "xxh64(parent hash, tokens) of each full block: equal hash = equal prefix (nano-vllm compute_hash)"),
    ("tokens fill", "token utilization: slots holding tokens / slots in used GPU blocks (the memory line)"),
    ("empty in last", "internal fragmentation: the unfilled slots of each sequence's last block, the only waste paging leaves"),
    ("max-length reservation", "what reserving prompt + max_tokens slots per sequence up front would hold: the vLLM paper's baseline"),
    ("why hit or miss", "a prompt's lookup block by block: different tokens, different parent, evicted (by event N), "
                        "last prompt block (always computed, to sample from), partial block (no hash yet)"),
    ("ledger", "each preemption: the victim, swap (its blocks to CPU) or recompute (blocks freed, tokens lost), "
               "steps until it ran again (vLLM v0 Scheduler._preempt)"),
    ("block count", "num_gpu_blocks = budget // (block_size × layers × 2 × K/V heads × head_dim × dtype) (vLLM determine_num_available_blocks; K/V heads, not query heads)"),
)


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

    def __init__(self, bindings: list[tuple[str, str]]) -> None:
        super().__init__()
        self.key_rows = bindings

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(Text("blockviz — every picture is the engine's real block-manager state", "bold"))
            yield Static(_table("Keys", self.key_rows))
            yield Static(_table("Pool grid legend", LEGEND))
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
