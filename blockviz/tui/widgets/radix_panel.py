"""SGLang's radix tree (kv_manager "sglang"): the record blockviz.model.radix_view computes at the
cursor, drawn as an indented tree, one node a line (its id, length, lock_ref and holders or
"evictable", last access, pages, then its tokens, so a narrow panel cuts the tokens), then the
last split, the last eviction and why, and each running request's match. The rows of the requests a
card is about (their pages: their block tables) and an eviction in the cursor's step (the leaves its
evict call took, tokens asked and freed) stay above the tree; the tree scrolls to the first
node the cursor's event or card is about."""

from __future__ import annotations

from rich.console import Group
from rich.text import Text
from textual.app import ComposeResult
from textual.widgets import Static

from blockviz.model.insights import Insights
from blockviz.model.narration import plural
from blockviz.model.radix_view import RadixEviction, RadixMatch, RadixNodeRow, RadixRecord, number_ranges, radix_record
from blockviz.model.reducer import ReducerState
from blockviz.tui.widgets.panels import StatePanel

__all__ = ["RadixPanel", "eviction_line", "radix_lines", "request_line"]


class RadixPanel(StatePanel):
    """The radix tree at the cursor (SGLang RadixCache: match_prefix, _split_node, inc_lock_ref /
    dec_lock_ref, evict), from blockviz.model.radix_view.radix_record, drawn."""

    DEFAULT_CSS = """
    RadixPanel > .radix-requests {
        dock: top;
        height: auto;
        display: none;
    }
    RadixPanel > .radix-requests.-shown {
        display: block;
    }
    """

    TITLE = "Radix tree (SGLang RadixCache)"
    policy = "lru"  # SGLang's radix_eviction_policy (the app sets it from the trace header)

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.requests = Static("", classes="radix-requests")

    def compose(self) -> ComposeResult:
        yield self.requests  # docked: it stays while the tree scrolls
        yield from super().compose()

    def draw(self, insights: Insights, state: ReducerState, position: int, event, about_seqs: tuple[int, ...],
             vocab: dict[int, str]) -> None:
        record = radix_record(state, insights.radix, position, event=event, about_seqs=about_seqs, vocab=vocab,
                              policy=self.policy)
        lines, first_about = radix_lines(record)
        head = [request_line(row, mark=True) for row in record.requests]
        if record.last_evicted is not None and record.last_evicted.recent:  # this step's eviction, kept in view
            head.append(eviction_line(record.last_evicted, wrap=False))
        self.requests.set_class(bool(head), "-shown")
        self.requests.update(Group(*head))
        self.set_rows(lines, "")
        if first_about is not None:  # once the new lines are laid out (before, the old height bounds the scroll)
            self.call_after_refresh(self.scroll_to, y=max(0, first_about - 1), animate=False)


def radix_lines(record: RadixRecord) -> tuple[list[Text], int | None]:
    """The record as Rich lines, and the index of the first line about the cursor (None: none)."""
    lines = [Text(f"evictable {record.evictable_size} · protected {record.protected_size} tokens", "bold",
                  no_wrap=True, overflow="ellipsis"),
             Text(f"{plural(record.num_nodes, 'node')} · {plural(record.num_tokens, 'token')} · page_size "
                  f"{record.page_size} · @ last access step", "dim", no_wrap=True, overflow="ellipsis"),
             Text("root" if record.nodes else "root (empty: a prompt enters the tree after its prefill)", "dim")]
    first_about = None
    last_of_depth: dict[int, bool] = {}
    for index, row in enumerate(record.nodes):
        later = record.nodes[index + 1:]
        last = next((False for other in later if other.depth == row.depth and other.parent == row.parent), True)
        last_of_depth[row.depth] = last
        if row.about and first_about is None:
            first_about = len(lines)
        lines.append(_node_line(row, last_of_depth))
    if record.num_more:
        lines.append(Text(f"… {record.num_more} more nodes", "dim"))
    split = record.last_split
    if split is not None:
        line = Text(f"split (step {split.step}): #{split.new_node} took {split.at} tokens ", "magenta",
                    no_wrap=True, overflow="ellipsis")
        line.append("".join(split.head), "italic")
        line.append(f" | #{split.node} kept ", "magenta")
        line.append("".join(split.tail), "italic")
        lines.append(line)
    if record.last_evicted is not None and not record.last_evicted.recent:
        lines.append(eviction_line(record.last_evicted))
    lines.extend(request_line(match) for match in record.matches)
    return lines, first_about


def eviction_line(evicted: RadixEviction, wrap: bool = True) -> Text:
    """The last leaf evicted: its evict call (the leaves it took, tokens asked and freed), then the
    leaf's tokens, slots and pages, and why it went first; `wrap` False: one line, cut at the edge."""
    line = Text("evicted " + ", ".join(f"#{n}" for n in evicted.taken), "red",
                no_wrap=not wrap, overflow="fold" if wrap else "ellipsis")
    if evicted.asked is not None:
        line.append(f" · asked {evicted.asked}, freed {evicted.freed}", "bold red")
    line.append(f" · step {evicted.step} · #{evicted.node}: {plural(evicted.num_tokens, 'token')}, slots {number_ranges(evicted.slots)} "
                f"(blocks {number_ranges(evicted.blocks)}): ", "red")
    line.append(evicted.why)
    return line


def request_line(match: RadixMatch, mark: bool = False) -> Text:
    """A request's row: its name, then (`mark`: a card is about it, pointed at with ▶) its status and
    the pages its table holds, then what it matched in the tree."""
    line = Text(no_wrap=True, overflow="ellipsis")
    if mark:
        line.append("▶ ", "bold yellow")
        line.append(f"{match.name} · {match.status or 'gone'} · pages {number_ranges(match.pages)} · ", "bold cyan")
    else:
        line.append(f"{match.name} ", "cyan")
    line.append(f"matched {plural(match.num_tokens, 'token')}", "cyan")
    if match.num_tokens:
        line.append(f": slots {number_ranges(match.slots)} in " + ", ".join(f"#{n}" for n in match.nodes))
    return line


def _node_line(row: RadixNodeRow, last_of_depth: dict[int, bool]) -> Text:
    guides = "".join("  " if last_of_depth.get(depth) else "│ " for depth in range(row.depth))  # the ancestors' lines
    line = Text(guides + ("└ " if last_of_depth[row.depth] else "├ "), "dim", no_wrap=True, overflow="ellipsis")
    line.append(f"#{row.id}", "bold reverse" if row.about else "bold")
    line.append(f" {row.num_tokens}t ")
    if row.lock_ref:
        line.append(f"lock {row.lock_ref}", "bold red")
        if row.holders:
            line.append(f" ({', '.join(row.holders)})", "red")
    else:
        line.append("evictable" if row.evictable else "unlocked", "green" if row.evictable else "dim green")
    if row.last_access is not None:
        line.append(f" @{row.last_access}", "dim")
    line.append(f" b{number_ranges(row.blocks)} ", "dim")
    line.append("".join(row.tokens) + ("…" if row.num_tokens > len(row.tokens) else ""), "italic")
    return line
