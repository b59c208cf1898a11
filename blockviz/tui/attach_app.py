"""`blockviz attach`: a Textual app that draws what a running vLLM's KV-cache events say.

A thread worker owns the ZMQ sockets (blockviz/kvevents/subscriber.py): it first asks the replay
socket for the past (when one is given), then polls, and posts each non-empty poll as a
KVEventsArrived message; the app applies it to the model layer (KVEventState) and redraws the
views (blockviz/tui/widgets/kv_attach.py). A replay in progress checks the worker's cancellation,
so q quits at once even while a publisher's replay never ends. Nothing here imports torch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from blockviz.kvevents.state import KVEventState
from blockviz.kvevents.subscriber import KVEventClient
from blockviz.kvevents.tokens import TokenText
from blockviz.tui.messages import KVEventsArrived
from blockviz.tui.widgets.kv_attach import CachePanel, ForestTree, GapPanel, NotSentPanel

POLL_MS = 100


class AttachApp(App):
    """The forest, the cache per rank over time, the gaps, and what vLLM does not send."""

    CSS_PATH = Path(__file__).with_name("attach_app.tcss")
    TITLE = "blockviz attach"
    BINDINGS = [
        Binding("q", "quit", "Quit"),
        Binding("r", "catch_up", "Replay missed batches"),
        Binding("tab", "focus_next", "Next panel", show=False),
    ]

    def __init__(self, endpoint: str, replay_endpoint: str | None = None, *, topic: str = "kv-events",
                 data_parallel_size: int = 1, tokens: TokenText | None = None,
                 client_factory: Callable[..., KVEventClient] = KVEventClient) -> None:
        super().__init__()
        self.endpoint, self.replay_endpoint, self.topic = endpoint, replay_endpoint, topic
        self.data_parallel_size = data_parallel_size
        self.tokens = tokens or TokenText()
        self.client_factory = client_factory
        self.state = KVEventState()
        self._catch_up_requested = False

    @property
    def listening_on(self) -> str:
        ranks = f" (+{self.data_parallel_size - 1} ranks on the next ports)" if self.data_parallel_size > 1 else ""
        return f"{self.endpoint}{ranks}, topic {self.topic!r}"

    def compose(self) -> ComposeResult:
        yield Static(f"waiting for events on {self.listening_on}", id="status")
        with Horizontal(id="main"):
            yield ForestTree(id="forest")
            with Vertical(id="side"):
                yield CachePanel(id="cache")
                yield GapPanel(id="gaps")
                yield NotSentPanel(id="not-sent")
        yield Footer()

    def on_mount(self) -> None:
        replay = f" · replay {self.replay_endpoint}" if self.replay_endpoint else " · no replay endpoint"
        tokens = f" · tokenizer {self.tokens.name}" if self.tokens.has_tokenizer else " · token ids (no --tokenizer)"
        self.sub_title = self.endpoint + replay + tokens
        self.query_one(CachePanel).show(self.state)
        self.query_one(GapPanel).show(self.state)
        self.listen()

    @work(thread=True, exclusive=True, name="kv-events")
    def listen(self) -> None:
        """Own the sockets: catch up through replay, then poll until the app exits."""
        worker = get_current_worker()
        client = self.client_factory(self.endpoint, self.replay_endpoint, topic=self.topic,
                                     data_parallel_size=self.data_parallel_size,
                                     should_stop=lambda: worker.is_cancelled)
        try:
            self._post(client.catch_up())
            while not worker.is_cancelled:
                if self._catch_up_requested:
                    self._catch_up_requested = False
                    self._post(client.catch_up())
                self._post(client.poll(POLL_MS))
        finally:
            client.close()

    def _post(self, update) -> None:
        if update.received or update.gaps or update.notices or update.replay_topic is not None:
            self.post_message(KVEventsArrived(update))

    @on(KVEventsArrived)
    def apply_events(self, message: KVEventsArrived) -> None:
        self.state.apply_update(message.update)
        self.query_one(ForestTree).show(self.state, self.tokens)
        self.query_one(CachePanel).show(self.state)
        self.query_one(GapPanel).show(self.state)
        self.query_one("#status", Static).update(self._status())

    def _status(self) -> str:
        state = self.state
        if not state.num_batches:
            return f"waiting for events on {self.listening_on}"
        ranks = ", ".join(f"rank {r} #{s.last_seq}" for r, s in sorted(state.ranks.items()))
        count = state.num_lost_batches
        lost = f" · {count} batch{'es' if count != 1 else ''} lost" if count else ""
        restarts = sum(s.num_restarts for s in state.ranks.values())
        restarted = f" · publisher restarted {restarts}×" if restarts else ""
        return f"{state.num_batches} batches from {self.listening_on} · last {ranks}{lost}{restarted}"

    def action_catch_up(self) -> None:
        """Ask the replay socket for what came after the last batch seen (the worker does it)."""
        if self.replay_endpoint is None:
            self.notify("no --replay endpoint was given", severity="warning")
            return
        self._catch_up_requested = True
