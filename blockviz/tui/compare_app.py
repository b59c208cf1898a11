"""`blockviz compare --tui`: the runs of one workload side by side, their GPU pools at the same
engine step. One column per configuration (blockviz/session/compare.py's CompareRun): its settings, its
figures for the whole run, what it had done by the step (hits, forks, copies on write, preemptions),
the memory line, each request's prefix hit in tokens and the free space as its design counts it
(blockviz/model/free_space.py: vLLM counts cached blocks free, SGLang counts free + evictable) at
the step, and its pool as the step left it; above them, the figures that differ
between the runs (`--kv-manager v0,v1`: v0 forks and copies on write where v1 hits the cache) and
the requests whose hits differ by a partial block's tokens (`--kv-manager vllm,sglang`). The
keys move every run together, so a manager, a block size or a pool size is compared at the same
moment of the same workload; columns that do not fit the terminal scroll sideways."""

from __future__ import annotations

from pathlib import Path

from rich.text import Text
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import HorizontalScroll, Vertical
from textual.widgets import Footer, Static

from blockviz.model.free_space import free_space
from blockviz.session.compare import CompareRun, differences_line, hit_notes, hits_at, same_step
from blockviz.model.pool_zoom import used_extent
from blockviz.model.timeline import Timeline
from blockviz.model.insights import max_tokens_of, memory_truth
from blockviz.model.view import pool_counts
from blockviz.tui.widgets.insight_panels import memory_fields
from blockviz.tui.widgets.pool_grid import PoolGrid

PLAY_INTERVAL_S = 0.5  # one engine step per tick while playing
MIN_COLUMN = 30  # columns: enough for the figures' lines


def _null_note(state) -> str:
    """The pool's first block when no request ever gets it: vLLM v1's null block, SGLang's padding page."""
    if not state.design.null_block:
        return ""
    return " · page 0: SGLang's padding page" if state.design.radix_tree else " · block 0: the null block"


class CompareApp(App[None]):
    """The runs' pools side by side, stepped together; starts at the step the table compares."""

    CSS = """
    #runs { height: 1fr; }
    .run { width: 1fr; }
    .run > PoolGrid { max-height: 1fr; }
    .figures { height: auto; padding: 0 1; }
    #compare-status { height: 1; background: $boost; padding: 0 1; }
    #differences { height: auto; max-height: 4; padding: 0 1; color: $warning; }
    #hit-notes { height: auto; max-height: 3; padding: 0 1; }
    Screen.-projector PoolGrid { border: heavy $accent; background: #000000; }
    """
    CSS_PATH = Path(__file__).with_name("app.tcss")  # the main app's look for shared widgets
    TITLE = "blockviz compare"

    BINDINGS = [
        Binding("s", "move(1)", "Step", tooltip="Every run one engine step forward"),
        Binding("b", "move(-1)", "Back", tooltip="Every run one engine step back"),
        Binding("space", "toggle_play", "Play", tooltip="Play/pause, a step at a time"),
        Binding("g", "to(0)", "Start", show=False),
        Binding("G", "to_end", "End", show=False),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, runs: list[CompareRun], *, projector: bool = False, step: int | None = None) -> None:
        if not runs:
            raise ValueError("CompareApp needs at least one run")
        super().__init__()
        self.runs = runs
        self.projector = projector
        self.timelines = [Timeline.for_header(r.header)
                          for r in runs]
        self.max_tokens = [max_tokens_of(r.events) for r in runs]
        for timeline, run in zip(self.timelines, runs):
            timeline.extend(run.events)
        self.last_step = max(run.figures["steps"] for run in runs)
        self.step = same_step(runs) if step is None else step
        self._timer = None

    def compose(self) -> ComposeResult:
        yield Static(self._title(), id="title")
        yield Static(differences_line(self.runs), id="differences")
        yield Static("\n".join(hit_notes(self.runs)), id="hit-notes")
        with HorizontalScroll(id="runs"):
            for index, run in enumerate(self.runs):
                with Vertical(classes="run"):
                    yield Static(Text(run.label, "bold"), classes="figures", id=f"label-{index}")
                    yield Static("", classes="figures", id=f"figures-{index}")
                    yield PoolGrid("gpu", id=f"gpu-{index}")
        yield Static("", id="compare-status")
        yield Footer(compact=True)

    def _title(self) -> str:
        return f"blockviz · compare · {len(self.runs)} configurations · one workload, the same engine step"


    def on_resize(self, event) -> None:
        """Share the width among the runs, but no column under MIN_COLUMN (the rest scroll)."""
        width = max(MIN_COLUMN, event.size.width // len(self.runs))
        for column in self.query(".run"):
            column.styles.width = width

    def on_mount(self) -> None:
        self.screen.set_class(self.projector, "-projector")
        for grid in self.query(PoolGrid):
            grid.projector = self.projector
        self.show_step()
        for index, timeline in enumerate(self.timelines):  # only the blocks the run ever holds (pool known now)
            self.query_one(f"#gpu-{index}", PoolGrid).zoom_to(0, used_extent(timeline))

    # ------------------------------------------------------------------ drawing

    def show_step(self) -> None:
        """Every run's pool, figures and memory line as engine step `self.step` left it."""
        for index, (run, timeline, max_tokens) in enumerate(zip(self.runs, self.timelines, self.max_tokens)):
            timeline.seek(timeline.step_end(self.step) if self.step else 0)  # step 0: before the first
            state = timeline.state
            used, cached, free = pool_counts(state)["gpu"]
            grid = self.query_one(f"#gpu-{index}", PoolGrid)
            grid.show(state, frozenset(), title=f"GPU · {used}/{used + cached + free} used{_null_note(state)}")
            f = run.figures
            text = Text(f"{f['steps']} steps · peak {f['peak_blocks']} blocks\n"
                        f"util at peak {f['token_utilization_at_peak']:.0%} · hits {f['prefix_hits']} "
                        f"({f['prefix_hit_rate']:.0%})\n"
                        f"forks {f['forks']} · copies on write {f['copies_on_write']}\n"
                        f"preemptions {f['preemptions']} · recomputed {f['tokens_recomputed']} tokens\n"
                        f"text {'same as' if f.get('same_text_as_first', True) else 'differs from'} the first\n")
            done = " (finished)" if self.step >= f["steps"] else ""
            text.append(f"at step {min(self.step, f['steps'])}{done}:\n", "bold")
            text.append(f"hits {state.num_prefix_hits} · preemptions {state.num_preemptions}\n")
            text.append(f"hit tokens: {hits_at(state)}\n")
            text.append(free_space(state).line() + "\n")
            text.append("\n".join(field for _, field in memory_fields(memory_truth(state, max_tokens))))
            self.query_one(f"#figures-{index}", Static).update(text)
        playing = "▶ playing" if self._timer is not None else "‖ paused"
        self.query_one("#compare-status", Static).update(
            f"{playing} │ step {self.step} of {self.last_step} │ s/b step every run · space plays · q quits")

    # ------------------------------------------------------------------ keys

    def action_move(self, steps: int) -> None:
        self.step = max(0, min(self.last_step, self.step + steps))
        self.show_step()

    def action_to(self, step: int) -> None:
        self.step = step
        self.show_step()

    def action_to_end(self) -> None:
        self.action_to(self.last_step)

    def action_toggle_play(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None
        else:
            if self.step >= self.last_step:
                self.step = 0
            self._timer = self.set_interval(PLAY_INTERVAL_S, self._tick)
        self.show_step()

    def _tick(self) -> None:
        if self.step >= self.last_step:
            self.action_toggle_play()
            return
        self.action_move(1)

