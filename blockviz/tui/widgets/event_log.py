"""The event log: every event up to the cursor, one line each, filterable by kind.

Each line is the view model's log row (blockviz/model/view.py log_row: the event's number and its
words, narration.describe), the same the notebook's log shows; which events a filter keeps is the
view model's LogIndex. The log is a Line API widget, so a trace of 100,000 events renders only the
lines on screen.
"""

from __future__ import annotations

from rich.segment import Segment
from rich.style import Style
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.strip import Strip
from textual.widgets import Select

from blockviz.model.names import RequestNames
from blockviz.model.narration import FILTERS
from blockviz.model.view import LogIndex, log_row
from blockviz.tui.widgets.panels import DrawnWhenShown
from engine import events as ev

_KIND_STYLES = {
    ev.PrefixCacheHit: Style(color="#000000", bgcolor="#ffd400", bold=True),
    ev.CopyOnWrite: Style(color="#ff79c6", bold=True),
    ev.Forked: Style(color="#bd93f9", bold=True),
    ev.SwappedOut: Style(color="#ff8c1a", bold=True),
    ev.SwappedIn: Style(color="#2fd12f", bold=True),
    ev.Preempted: Style(color="#ff3b3b", bold=True),
    ev.StepStarted: Style(color="#61afef", bold=True),
    ev.StepFinished: Style(color="#61afef"),
    ev.BlockEvicted: Style(color="#e5c07b"),
}


class EventLog(ScrollView, can_focus=True):
    """Events up to the cursor, filtered; the newest shown is the cursor's (highlighted)."""

    DEFAULT_CSS = """
    EventLog {
        height: 1fr;
        overflow-x: hidden;
        scrollbar-size-vertical: 1;
    }
    """

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.events: list[ev.Event] = []
        self.position = 0
        self.vocab: dict[int, str] = {}
        self.names = RequestNames()
        self._index = LogIndex()  # the events passing the filter
        self._visible = 0

    @property
    def kinds(self) -> frozenset[type[ev.Event]] | None:
        return self._index.kinds

    def set_filter(self, kinds: frozenset[type[ev.Event]] | None) -> None:
        self._index = LogIndex(kinds)
        self._update()

    def show(self, events: list[ev.Event], position: int, vocab: dict[int, str],
             names: RequestNames | None = None) -> None:
        """`names`: the requests at the cursor (blockviz.model.names), naming each line's sequences."""
        if events is not self.events:
            self.events, self._index = events, LogIndex(self._index.kinds)
        self.position = position
        self.vocab = vocab
        self.names = names or RequestNames()
        self._update()

    def _update(self) -> None:
        self._index.update(self.events)
        self._visible = self._index.visible(self.position)
        self.virtual_size = Size(self.scrollable_content_region.width, self._visible)
        self._follow_cursor()
        self.call_after_refresh(self._follow_cursor)  # again once laid out (a new or resized log)
        self.refresh()

    def _follow_cursor(self) -> None:
        """Keep the cursor's event (the newest shown) on the last line."""
        self.scroll_to(y=max(0, self._visible - self.scrollable_content_region.height), animate=False,
                       immediate=True)

    def on_resize(self) -> None:
        self._follow_cursor()

    def lines(self) -> list[str]:
        """The visible log as plain text (for tests)."""
        return [self._text(self._index.indices[i]) for i in range(self._visible)]

    def _text(self, index: int) -> str:
        number, _, words = log_row(self.events[index], self.vocab, self.names)
        return f"{number:>6} {words}"

    def render_line(self, y: int) -> Strip:
        width = self.scrollable_content_region.width
        line = y + self.scroll_offset.y
        if line >= self._visible:
            return Strip.blank(width, self.rich_style)
        index = self._index.indices[line]
        style = _KIND_STYLES.get(type(self.events[index]), Style())
        if index == self.position - 1:
            style = style + Style(reverse=True)
        text = self._text(index)[:width].ljust(width)
        return Strip([Segment(text, style)], width).apply_style(self.rich_style)


class EventLogPanel(DrawnWhenShown, Vertical):
    """The log with its filter (a Select of event kinds)."""

    DEFAULT_CSS = """
    EventLogPanel {
        border: round $secondary;
        border-title-color: $text;
        height: 1fr;
    }
    EventLogPanel:focus-within {
        border: round $accent;
    }
    EventLogPanel > Select {
        height: auto;
        margin: 0;
    }
    """

    def __init__(self, *, id: str | None = None, classes: str | None = None) -> None:
        super().__init__(id=id, classes=classes)
        self.border_title = "Event log"
        self.log_view = EventLog(id="event-log")

    def compose(self) -> ComposeResult:
        yield Select([(name, name) for name in FILTERS], value="all events", allow_blank=False,
                     compact=True, id="log-filter")
        yield self.log_view

    def on_select_changed(self, event: Select.Changed) -> None:
        event.stop()
        self.log_view.set_filter(FILTERS.get(str(event.value)))

    def draw(self, events: list[ev.Event], position: int, vocab: dict[int, str],
             names: RequestNames | None = None) -> None:
        """Show events up to `position` (DrawnWhenShown.show calls this once the panel is visible)."""
        self.log_view.show(events, position, vocab, names)
