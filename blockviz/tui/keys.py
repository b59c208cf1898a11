"""The TUI's keys, as data: the Footer shows the short descriptions (they fit 80 columns), the
help screen and the command palette show the tooltips."""

from __future__ import annotations

from textual.binding import Binding

KEYS = [
    Binding("space", "toggle_play", "Play", tooltip="Play/Pause"),
    Binding("s", "travel('step_engine')", "Step", tooltip="Step the engine (schedule → run → postprocess)"),
    Binding("b", "travel('back_step')", "Back", tooltip="Step back (to the previous engine step)"),
    Binding("full_stop", "travel('step_event')", "Event", key_display=".", tooltip="One event forward"),
    Binding("comma", "travel('back_event')", "◂ Event", key_display=",", show=False, tooltip="One event back"),
    Binding("question_mark,f1", "help", "Help", key_display="?", tooltip="Help (keys, legend, glossary)"),
    Binding("a", "add_request", "Add", tooltip="Add a request (live)"),
    Binding("f", "fork", "Fork", tooltip="Fork the selected sequence (live)"),
    Binding("p", "preempt", "Swap", tooltip="Swap out the selected sequence's request (live)"),
    Binding("P", "toggle_projector", "Projector", show=False, tooltip="Projector mode"),
    Binding("plus,equals_sign", "travel('faster')", "Faster", key_display="+", show=False, tooltip="Play faster"),
    Binding("minus", "travel('slower')", "Slower", key_display="-", show=False, tooltip="Play slower"),
    Binding("g", "travel('to_start')", "Go to start", show=False, tooltip="Go to the first event"),
    Binding("G", "travel('to_end')", "Go to end", show=False, tooltip="Go to the last event"),
    Binding("right_square_bracket", "run_to_break", "Break ▸", key_display="]", show=False,
            tooltip="Play to the next breakpoint: a fork, copy-on-write, prefix hit, swap, eviction unless B set others; guided, the next card too"),
    Binding("left_square_bracket", "travel('back_to_break')", "◂ Break", key_display="[", show=False,
            tooltip="Back to the previous breakpoint event"),
    Binding("B", "set_breakpoints", "Breakpoints", show=False, tooltip="Set breakpoints: the event kinds to stop at"),
    Binding("n", "next_sequence", "Next sequence", show=False, tooltip="Select the next sequence"),
    Binding("v", "next_view", "Next view", show=False, tooltip="Next view on the right"),
    Binding("q", "quit", "Quit", tooltip="Quit (also while the engine loads)"),
    Binding("ctrl+c", "quit", "Quit", show=False, tooltip="Quit"),
]

# Actions that move through the timeline: refused until it exists (a live engine still loading).
PLAYBACK_ACTIONS = frozenset({"toggle_play", "travel", "run_to_break", "set_breakpoints", "next_sequence",
                              "fork", "preempt"})
# The engine's keys: a replay has no engine, so they are not offered there.
LIVE_ACTIONS = frozenset({"add_request", "fork", "preempt"})
# Live commands vLLM v1's engine has no counterpart for (n > 1 is separate requests; preemption is
# the scheduler's): not offered when the run's KV manager is v1.
V0_ONLY_ACTIONS = frozenset({"fork", "preempt"})
# Moves of the Player (blockviz/model/timeline.py) that pause playback first: going back in time.
PAUSING_MOVES = frozenset({"back_event", "back_step", "to_start", "back_to_break"})


def key_rows(bindings: list[Binding]) -> list[tuple[str, str]]:
    """(keys, what they do) for each binding: its key display and its tooltip (else its description)."""
    return [((binding.key_display or binding.key).replace("question_mark", "?"), binding.tooltip or binding.description)
            for binding in bindings]
