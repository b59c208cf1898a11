"""What the keys a, f, p and n do: act on the live engine's present (add a request, fork a
sequence, swap a request out) and pick the sequence they act on; and ], [ and B: breakpoints.
Mixins of the App, kept apart so the App reads as layout, messages and playback."""

from __future__ import annotations

from engine import events as ev
from blockviz.tui.widgets.screens import AskScreen


class LiveActions:
    """The App's engine actions; they expect the App's `bridge`, `player`, `controller`,
    `selected_seq`, `notify`, `push_screen` and `render_views`."""

    def _live_engine(self, what: str) -> bool:
        """True when an engine is attached (and the cursor is brought to the live edge)."""
        if self.bridge is None:
            self.notify(f"Replay: no engine here to {what}. Run `blockviz run` to {what}.",
                        title="Replay", severity="warning")
            return False
        if self.controller is None:
            self.notify("The engine is still loading.", severity="warning")
            return False
        if not self.player.timeline.at_end:
            self.player.to_end()
            self.notify("Jumped to the live edge: the engine acts on its present.")
        self.player.follow()
        return True

    def action_add_request(self) -> None:
        if not self._live_engine("add a request"):
            return

        def added(prompt: str | None) -> None:
            if prompt:
                self.player.finished = False
                self.player.follow()
                self.bridge.add_request(prompt)

        self.push_screen(AskScreen("New request: type a prompt, enter to add it, escape to cancel",
                                   "e.g. ROMEO:"), added)

    def action_fork(self) -> None:
        if (seq_id := self._selected_sequence()) is not None and self._live_engine("fork a sequence"):
            self.bridge.fork(seq_id)

    def action_preempt(self) -> None:
        if (seq_id := self._selected_sequence()) is not None and self._live_engine("swap out a request"):
            self.bridge.preempt(self.player.timeline.state.seqs[seq_id].request_id)

    def _selected_sequence(self) -> int | None:
        seqs = self.player.timeline.state.seqs
        if self.selected_seq in seqs:
            return self.selected_seq
        running = [s for s, seq in sorted(seqs.items()) if seq.status == "running"]
        if running:
            self.selected_seq = running[0]
            return running[0]
        self.notify("No sequence selected: n picks one, or select a block it owns.", severity="warning")
        return None

    def action_next_sequence(self) -> None:
        ids = sorted(self.player.timeline.state.seqs)
        later = [s for s in ids if self.selected_seq is None or s > self.selected_seq]
        if ids:
            self.action_select_sequence(later[0] if later else ids[0])

    def action_select_sequence(self, seq_id: int) -> None:
        self.selected_seq = seq_id
        self.render_views()


class BreakpointActions:
    """Play to the next event of a chosen kind, back to the previous one, choose the kinds; they
    expect the App's `player`, `controller`, `break_on`, `notify`, `push_screen`, `render_views`."""

    def action_run_to_break(self) -> None:
        """Play until the next event of a breakpoint kind or, guided, the next card (a live engine
        steps as needed)."""
        if not self.player.break_on and self.player.guide is None:
            self.notify("No breakpoints: B sets the event kinds to stop at.", severity="warning")
            return
        self.player.run_to_break()
        self.controller.set_playing(True)
        self.render_views(full=False)

    def action_set_breakpoints(self) -> None:
        def chosen(answer: str | None) -> None:
            if answer is None:
                return
            try:
                kinds = ev.event_classes(answer) if answer.strip() else frozenset()
            except ValueError as exc:
                self.notify(str(exc), severity="error")
                return
            self.player.break_on = self.break_on = kinds
            self.notify(f"Breakpoints: {', '.join(ev.kind_names(kinds)) or 'none'}. ] plays to the next one.")

        example = ",".join(ev.kind_names((ev.CopyOnWrite, ev.SwappedOut)))
        self.push_screen(AskScreen("Stop at which events? Kinds, comma-separated (empty: none)",
                                   example, ",".join(ev.kind_names(self.player.break_on))), chosen)
