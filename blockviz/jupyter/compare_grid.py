"""What a setting changes, in a notebook: `compare(prompts, kv_manager=["v0", "v1"], block_size=[4, 16])`
runs one workload through the real engine once per configuration (blockviz.session.compare.run_all:
the model loaded once, a fresh engine per configuration, in turn), varying only the settings given,
and returns a `CompareGrid`: one cell per configuration (its GPU and CPU pools at the same engine
step, and its figures at that step: each request's prefix hit in tokens and the free space as its
design counts it, blockviz/model/free_space.py), one step slider with ◂ / ▸ that moves every run
together, the figures table of `blockviz compare`, the line naming the figures that differ and the
requests one run hit more tokens of (a radix tree's pages beside whole blocks).

Each run's events go into a Timeline (blockviz/model/timeline.py), so moving the step is a seek (to
the run's end of that step, Timeline.step_ends) and the pools are snapshot()'s frame of the state
there.
"""

from __future__ import annotations

import html
from typing import Any, Iterable

import ipywidgets

from blockviz.model.free_space import free_space
from blockviz.session.compare import (DEFAULT_PROMPTS, CompareRun, configurations, differences_line, figure_text,
                                      hit_notes, hits_at, run_all, same_step)
from blockviz.model.pool_zoom import used_extent
from blockviz.model.timeline import Timeline
from blockviz.model.view import snapshot
from blockviz.jupyter.widgets import PoolView

FIGURE_COLUMNS = (("steps", "steps"), ("peak_blocks", "peak blocks"), ("token_utilization_at_peak", "util at peak"),
                  ("prefix_hits", "hits"), ("prefix_hit_rate", "hit rate"), ("forks", "forks"),
                  ("copies_on_write", "copies on write"), ("preemptions", "preemptions"),
                  ("tokens_recomputed", "tokens recomputed"), ("same_text_as_first", "same text"))


def _listed(value: Any) -> list | None:
    if value is None:
        return None
    return list(value) if isinstance(value, (list, tuple)) else [value]


def compare(prompts: str | Iterable[str] | None = None, *, kv_manager: Any = None, block_size: Any = None,
            num_gpu_blocks: Any = None, prefix_caching: Any = None, max_tokens: int = 16, temperature: float = 0.0,
            model: str | None = None, n: int = 1, loaded: Any = None, sglang_options: dict | None = None,
            **engine_options: Any) -> "CompareGrid":
    """Run `prompts` (default: `blockviz compare`'s two lines with one opening) once per combination
    of the settings given, each a value or a list: `kv_manager` ("v0", "v1", "vllm", "sglang"), `block_size`,
    `num_gpu_blocks`, `prefix_caching`. A setting left None is the engine's default, one value,
    so `compare(p, block_size=[4, 16])` is two runs (prefix caching left None is each manager's
    own: off in v0, on in v1). Returns the grid of the runs. `engine_options` are EngineConfig's
    others (num_cpu_blocks, preemption_mode, seed, ...); `loaded` a model already loaded
    (engine.model_loader.load_model) to skip loading it again. Greedy by default, so the texts
    of configurations that only move memory around are the same (figures["same_text_as_first"]).
    `sglang_options` (SGLang server arguments, docs/sglang.md: {"page_size": 1}) go to the runs of
    kv_manager "sglang" only, as `blockviz compare --sglang-option` does."""
    from blockviz.session.spec import EngineSpec, quiet_model_loading
    from engine.designs import get_design

    quiet_model_loading()
    prompts = [prompts] if isinstance(prompts, str) else list(DEFAULT_PROMPTS if prompts is None else prompts)
    options = dict(engine_options, **({"model": model} if model is not None else {}))
    spec = EngineSpec.of(max_tokens=max_tokens, temperature=temperature, n=n, **options)
    if sglang_options and not any(get_design(name).radix_tree for name in _listed(kv_manager) or ()):
        raise ValueError("sglang_options apply to kv_manager 'sglang' only")
    configs = configurations(spec.config, sglang_options, kv_manager=_listed(kv_manager),
                             block_size=_listed(block_size), num_gpu_blocks=_listed(num_gpu_blocks),
                             enable_prefix_caching=_listed(prefix_caching))
    return CompareGrid(run_all(prompts, configs, spec.sampling_params(), loaded=loaded))


class CompareGrid:
    """The runs side by side at one engine step: `seek_step(step)` (or the slider, or ◂ / ▸) moves
    every run's Timeline to the end of that step and redraws its pools; `figures()` is the table."""

    def __init__(self, runs: list[CompareRun]) -> None:
        if not runs:
            raise ValueError("nothing to compare: no run")
        self.runs = runs
        self.timelines = []
        for run in runs:
            timeline = Timeline.for_header(run.header)
            timeline.extend(run.events)
            self.timelines.append(timeline)
        self.extents = [used_extent(t) for t in self.timelines]  # the blocks each run ever holds: drawn
        self.num_steps = max(len(t.step_ends) for t in self.timelines)
        self.pools = [PoolView() for _ in runs]
        self.cell_figures = [ipywidgets.HTML() for _ in runs]
        self.slider = ipywidgets.IntSlider(value=same_step(runs), min=1, max=max(1, self.num_steps),
                                           description="step", continuous_update=False,
                                           layout=ipywidgets.Layout(width="60%"))
        back, on = ipywidgets.Button(description="◂", layout={"width": "3em"}), ipywidgets.Button(
            description="▸", layout={"width": "3em"})
        back.on_click(lambda _: self.seek_step(self.step - 1))
        on.on_click(lambda _: self.seek_step(self.step + 1))
        cells = [ipywidgets.VBox([ipywidgets.HTML(f"<b>{html.escape(run.label)}</b>"), pool, figures],
                                 layout=ipywidgets.Layout(border="1px solid #8886", padding="2px", min_width="0"))
                 for run, pool, figures in zip(runs, self.pools, self.cell_figures)]
        columns = min(len(runs), 2 if len(runs) == 4 else 3)
        grid = ipywidgets.GridBox(cells, layout=ipywidgets.Layout(
            grid_template_columns=f"repeat({columns}, minmax(0, 1fr))", grid_gap="6px", width="100%"))
        self.table = ipywidgets.HTML(self.figures_html())
        notes = "".join(f"<div>{html.escape(note)}</div>" for note in hit_notes(runs))
        self.differences = ipywidgets.HTML(f"<div class='bv-compare-differences'>"
                                           f"{html.escape(differences_line(runs))}</div>"
                                           f"<div class='bv-compare-hit-notes'>{notes}</div>")
        self.widget = ipywidgets.VBox([ipywidgets.HBox([back, self.slider, on]), grid, self.table, self.differences],
                                      layout=ipywidgets.Layout(width="100%"))
        self.widget.add_class("blockviz")
        self.slider.observe(lambda change: self._show(change["new"]), names="value")
        self._show(self.slider.value)

    @property
    def step(self) -> int:
        """The engine step every cell shows (its end)."""
        return self.slider.value

    def seek_step(self, step: int) -> None:
        """Show every run at the end of engine `step` (clamped to 1 .. the longest run's steps; a
        run that finished sooner shows its end)."""
        step = max(self.slider.min, min(int(step), self.slider.max))
        if step == self.slider.value:
            self._show(step)
        else:
            self.slider.value = step  # the observer redraws

    def _show(self, step: int) -> None:
        for index, (timeline, pool) in enumerate(zip(self.timelines, self.pools)):
            timeline.seek(timeline.step_end(step))
            pool.show(snapshot(timeline.state, ranges={"gpu": (0, self.extents[index])}))
            self.cell_figures[index].value = self._cell_html(index, step)

    def _cell_html(self, index: int, step: int) -> str:
        state, run = self.timelines[index].state, self.runs[index]
        done = self.timelines[index].num_steps_done()
        space = free_space(state)
        at = f"step {min(step, done)} of {run.figures['steps']}" + (" (finished)" if done < step else "")
        return (f"<span class='bv-compare-cell' data-step='{step}' data-used='{state.num_used('gpu')}'>"
                f"{html.escape(at)} · GPU blocks in use {state.num_used('gpu')}/{run.header['num_gpu_blocks']} · "
                f"token utilization {state.kv_utilization():.0%} · peak {run.figures['peak_blocks']} · "
                f"hits {state.num_prefix_hits} · preemptions {state.num_preemptions}</span>"
                f"<div class='bv-compare-hits'>hit tokens: {html.escape(hits_at(state))}</div>"
                f"<div class='bv-compare-free' data-free='{space.counted_free}' data-budget='{space.budget}'>"
                f"{html.escape(space.line())}</div>")

    def figures(self) -> list[dict[str, Any]]:
        """Each run's figures (blockviz compare's), with its label."""
        return [dict(run.figures, label=run.label) for run in self.runs]

    def figures_html(self) -> str:
        head = "".join(f"<th style='padding:0 8px'>{html.escape(name)}</th>" for _, name in FIGURE_COLUMNS)
        rows = []
        for run in self.runs:
            values = "".join(f"<td style='padding:0 8px;text-align:right'>{html.escape(_shown(run.figures[key]))}</td>"
                             for key, _ in FIGURE_COLUMNS)
            rows.append(f"<tr><td>{html.escape(run.label)}</td>{values}</tr>")
        return f"<table class='bv-compare-figures'><tr><th></th>{head}</tr>{''.join(rows)}</table>"

    def summary(self) -> str:
        """The figures as plain text (a notebook without widgets)."""
        lines = [f"{len(self.runs)} configurations, at step {self.step}:"]
        for row in self.figures():
            lines.append(f"  {row['label']}: " + ", ".join(f"{name} {_shown(row[key])}" for key, name in FIGURE_COLUMNS))
        return "\n".join(lines + [differences_line(self.runs)])

    def __repr__(self) -> str:
        return self.summary()

    def _repr_mimebundle_(self, **kwargs: Any) -> dict[str, Any]:
        bundle = dict(self.widget._repr_mimebundle_(**kwargs) or {})
        bundle["text/plain"] = self.summary()
        return bundle

    def close(self) -> None:
        self.widget.close()
        for pool in self.pools:
            pool.close()


def _shown(value: Any) -> str:
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else figure_text(value)
