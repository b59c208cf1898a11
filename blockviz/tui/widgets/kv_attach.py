"""The views of `blockviz attach`: vLLM's hash-chain forest, the cache over time, the gaps, and
what vLLM does not send.

Each is handed the model layer (blockviz/kvevents/state.py: KVEventState) from above and renders
from it alone; none reads a socket.
"""

from __future__ import annotations

from typing import Sequence

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.widgets import Tree
from textual.widgets.tree import TreeNode

from blockviz.kvevents.protocol import MEDIUM_GPU, BlockHash
from blockviz.kvevents.state import NOT_SENT, NOT_SENT_BY_VLLM, KVEventState, tier_label
from blockviz.kvevents.tokens import TokenText
from blockviz.model.narration import plural
from blockviz.model.palette import short_hash, sparkline
from blockviz.tui.widgets.panels import StatePanel

MAX_LABEL_TOKENS_CHARS = 48


def hash_label(block_hash: BlockHash, digits: int = 8) -> str:
    """A hash's first hex digits: an int as every view shows one (palette.short_hash), bytes as they are."""
    if isinstance(block_hash, bytes):
        return block_hash.hex()[:digits]
    return short_hash(block_hash, digits)


def recent_sparkline(values: Sequence[int], width: int) -> str:
    """The last `width` values as bars scaled to the largest of them."""
    values = list(values)[-width:]
    return sparkline(values, max(values, default=0))


class ForestTree(Tree):
    """The hash-chain forest: each stored block under its parent, with its tokens' text. Cached
    blocks are bold with the ranks holding them; removed ones dim, marked removed."""

    DEFAULT_CSS = """
    ForestTree {
        border: round $secondary;
        border-title-color: $text;
        height: 1fr;
    }
    ForestTree:focus {
        border: round $accent;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__("hash-chain forest", id=id)
        self.border_title = "hash-chain forest (what vLLM stored)"
        self.show_root = True
        self.guide_depth = 2
        self._drawn: dict[BlockHash, TreeNode] = {}
        self._drawn_labels: dict[BlockHash, str] = {}
        self._num_forgotten = 0

    def show(self, state: KVEventState, tokens: TokenText) -> None:
        """Add the blocks not drawn yet under their parents, relabel those that changed, and drop
        those the state forgot (the oldest removed ones: the forest is bounded)."""
        if self._num_forgotten != state.num_forgotten:
            self._num_forgotten = state.num_forgotten
            self._drop_forgotten(state)
        for block_hash, node in state.nodes.items():
            if block_hash not in self._drawn:
                parent = self._drawn.get(node.parent_hash) if node.parent_hash is not None else None
                self._drawn[block_hash] = (parent or self.root).add("", expand=True, data=block_hash)
            label = self._label(state, block_hash, tokens)
            if self._drawn_labels.get(block_hash) != label.plain:
                self._drawn_labels[block_hash] = label.plain
                self._drawn[block_hash].set_label(label)
        forgotten = f", {state.num_forgotten} removed long ago not shown" if state.num_forgotten else ""
        self.root.set_label(Text(f"{plural(len(state.nodes), 'block')} seen, {state.num_cached} cached now{forgotten}"))
        self.root.expand()

    def _drop_forgotten(self, state: KVEventState) -> None:
        """Remove the tree nodes of forgotten blocks; when one still has children drawn under it,
        redraw the whole tree (its children now hang from the root)."""
        gone = [h for h in self._drawn if h not in state.nodes]
        if any(self._drawn[h].children for h in gone):
            self.root.remove_children()
            self._drawn.clear()
            self._drawn_labels.clear()
            return
        for block_hash in gone:
            self._drawn.pop(block_hash).remove()
            self._drawn_labels.pop(block_hash, None)

    @staticmethod
    def _label(state: KVEventState, block_hash: BlockHash, tokens: TokenText) -> Text:
        node = state.nodes[block_hash]
        text = tokens.text(node.token_ids)
        if len(text) > MAX_LABEL_TOKENS_CHARS:
            text = text[: MAX_LABEL_TOKENS_CHARS - 1] + "…"
        label = Text(hash_label(block_hash), style="bold" if node.cached else "dim")
        label.append(f" {text!s}", style="" if node.cached else "dim")
        if node.cached:
            label.append("  rank " + ",".join(str(r) for r in sorted(node.ranks)), style="green")
            tiers = sorted(tier_label(t) for t in node.tiers)
            if tiers != [MEDIUM_GPU]:  # the usual place is not repeated on every block
                label.append(" " + ", ".join(tiers), style="cyan")
        else:
            label.append("  removed", style="dim red")
        if node.times_stored > 1:
            label.append(f"  stored ×{node.times_stored}", style="dim")
        if node.session_id:
            label.append(f"  session {node.session_id[:24]}", style="dim")
        return label


class CachePanel(StatePanel):
    """Per data-parallel rank: cache size (per tier when there is more than the GPU), stores,
    removals, churn, both over time, and the wire format the batches came in."""

    TITLE = "cache, per data-parallel rank"
    SPARK_WIDTH = 32

    def draw(self, state: KVEventState) -> None:  # type: ignore[override]
        if not state.ranks:
            self.set_body(Text("no batch yet", style="dim"))
            return
        table = Table.grid(padding=(0, 1))
        for column in ("rank", "cached", "stored", "removed", "churn", "batches"):
            table.add_column(column, justify="left" if column == "rank" else "right")
        table.add_row(*(Text(c, style="bold") for c in ("rank", "cached", "stored", "removed", "churn", "batches")))
        for rank, stats in sorted(state.ranks.items()):
            table.add_row(str(rank), str(stats.num_cached), str(stats.num_stored), str(stats.num_removed),
                          f"{stats.churn:.2f}", str(stats.num_batches))
            if set(stats.cached_by_tier) - {(MEDIUM_GPU, None)}:
                for tier, count in sorted(stats.cached_by_tier.items(), key=lambda item: tier_label(item[0])):
                    table.add_row(Text(f"  {tier_label(tier)}", style="cyan"), str(count), "", "", "", "")
        rows: list = [table, Text("")]
        for rank, stats in sorted(state.ranks.items()):
            points = [p for p in state.timeline if p.rank == rank]
            rows.append(Text.assemble((f"rank {rank} cached  ", "bold"),
                                      recent_sparkline([p.num_cached for p in points], self.SPARK_WIDTH)))
            rows.append(Text.assemble(("       stored  ", "green"), recent_sparkline([p.num_stored for p in points], self.SPARK_WIDTH)))
            rows.append(Text.assemble(("       removed ", "red"), recent_sparkline([p.num_removed for p in points], self.SPARK_WIDTH)))
            if stats.group_kinds:
                groups = ", ".join(f"{group} {kind}" for group, kind in sorted(stats.group_kinds.items()))
                rows.append(Text(f"       KV-cache groups: {groups}", style="dim"))
        rows.append(Text.assemble(("wire ", "bold"), state.wire_summary()))
        if state.num_unknown_events:
            rows.append(Text(f"{plural(state.num_unknown_events, 'event')} of unknown types ignored", style="dim"))
        if state.num_removed_unseen:
            rows.append(Text(f"{state.num_removed_unseen} removals of blocks stored before we joined", style="dim"))
        self.set_body(Group(*rows))


class GapPanel(StatePanel):
    """Sequence gaps (and whether replay filled them) and notices about the stream (restarts,
    numbers not followed, bad payloads, replays that did not end): the newest MAX_LINES of each."""

    TITLE = "gaps"
    MAX_LINES = 100

    def draw(self, state: KVEventState) -> None:  # type: ignore[override]
        gaps, notices = list(state.gaps)[-self.MAX_LINES:], list(state.notices)[-self.MAX_LINES:]
        lines = [Text(gap.describe(), style="yellow" if gap.num_lost or not gap.replay_ended else "") for gap in gaps]
        if state.num_gaps > len(gaps):
            lines.insert(0, Text(f"{state.num_gaps} gaps, the last {len(gaps)}:", style="dim"))
        if state.num_notices > len(notices):
            lines.append(Text(f"{state.num_notices} notices, the last {len(notices)}:", style="dim"))
        lines += [Text(notice, style="dim") for notice in notices]
        if not lines:
            lines = [Text("none: every batch arrived in order" if state.num_batches else "none yet", style="dim")]
        self.set_body(Group(*lines))


class NotSentPanel(StatePanel):
    """What the teaching engine shows and vLLM's events do not carry: said, never invented."""

    TITLE = NOT_SENT_BY_VLLM

    def on_mount(self) -> None:
        table = Table.grid(padding=(0, 1))
        table.add_column()
        table.add_column()
        for what, _ in NOT_SENT:
            table.add_row(Text(what, style="bold"), Text(NOT_SENT_BY_VLLM, style="yellow"))
        self.set_body(table)
        self.tooltip = "\n".join(f"{what}: {why}" for what, why in NOT_SENT)
