"""What a setting changes: one workload through the real engine once per configuration.

`configurations(base, block_size=[4, 16], num_gpu_blocks=[32, 64], enable_prefix_caching=[True,
False])` is every combination of the values given over a base EngineConfig; `run_all(prompts,
configs, params)` loads the model once and runs the prompts through a fresh engine per
configuration, in turn, keeping each run's header, events, figures and texts. The CLI prints the
figures (`blockviz compare`), the TUI shows the runs' pools side by side at the same engine step
(`blockviz compare --tui`), and the notebook a grid of pool widgets (`blockviz.jupyter.compare`).
Torch is imported only when the runs start.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from blockviz.session.engine_session import EngineSession
from blockviz.session.recorder import Recorder
from blockviz.session.spec import EngineSpec

SWEPT = ("block_size", "num_gpu_blocks", "enable_prefix_caching")


@dataclass(slots=True)
class CompareRun:
    """One configuration's run of the workload."""

    config: Any  # engine.config.EngineConfig
    header: dict[str, Any]
    events: list = field(repr=False)
    texts: list[list[str]]
    figures: dict[str, Any]  # steps, peak blocks, token utilization at the peak, hit rate, ...
    used_by_step: dict[int, int] = field(repr=False, default_factory=dict)  # GPU blocks in use after each step

    @property
    def label(self) -> str:
        """The swept settings, short: "block 4 · pool 32 · cache on"."""
        return (f"block {self.config.block_size} · pool {self.header['num_gpu_blocks']} · "
                f"cache {'on' if self.config.enable_prefix_caching else 'off'}")


def configurations(base, **swept: list) -> list:
    """Every combination of the swept values (keys from SWEPT; a missing one keeps base's)."""
    names = [name for name in SWEPT if swept.get(name)]
    return [replace(base, **dict(zip(names, values))) for values in itertools.product(*(swept[n] for n in names))]


def run_all(prompts: list[str], configs: list, params, *, loaded: Any = None,
            progress: Callable[[int, Any], None] | None = None) -> list[CompareRun]:
    """Run `prompts` through a fresh engine per configuration, the model loaded once (or `loaded`)."""
    from engine.llm_engine import LLMEngine
    from engine.model_loader import load_model

    if loaded is None:
        loaded = load_model(configs[0].model, configs[0].device)
    _warm_up(LLMEngine(configs[0], loaded=loaded), prompts[0], params)
    runs = []
    for index, config in enumerate(configs):
        if progress is not None:
            progress(index, config)
        runs.append(run_one(LLMEngine(config, loaded=loaded), prompts, params))
    compared = runs[0].texts
    for run in runs:
        run.figures["same_text_as_first"] = run.texts == compared
    return runs


def _start(engine, prompts: list[str], params) -> tuple[EngineSession, list[str]]:
    """A session over `engine` with `prompts` queued, each sampled with `params` (all checked
    first: a ValueError names one the engine refuses). Returns it and the request ids."""
    session = EngineSession(EngineSpec(engine.config, prompts=()), engine=engine)
    session.check_requests(prompts, params)
    return session, [session.add_request(prompt, sampling_params=params) for prompt in prompts]


def _warm_up(engine, prompt: str, params) -> None:
    """A short untimed generation first: the first forward pass in a process pays one-time setup
    that would otherwise count against the first configuration's tokens/s."""
    session, _ = _start(engine, [prompt], replace(params, n=1, max_tokens=2))
    session.run_to_completion()
    session.close()


def run_one(engine, prompts: list[str], params) -> CompareRun:
    """One run of the workload in an engine session: the Recorder's figures over its events, and
    the events themselves."""
    session, request_ids = _start(engine, prompts, params)
    header = session.header
    recorder = Recorder(header)
    events: list = []

    def keep(batch) -> None:
        recorder(batch)
        events.extend(batch)

    start = time.perf_counter()
    session.run_to_completion(on_events=keep)
    seconds = time.perf_counter() - start
    session.close()
    state, config = recorder.state, engine.config
    figures = {
        "block_size": config.block_size, "num_gpu_blocks": header["num_gpu_blocks"],
        "prefix_caching": config.enable_prefix_caching, "steps": session.num_steps,
        "peak_blocks": recorder.peak_used, "token_utilization_at_peak": round(recorder.token_utilization_at_peak, 4),
        "prefix_hit_rate": round(state.prefix_hit_rate(), 4), "preemptions": state.num_preemptions,
        "tokens": state.num_tokens_generated, "tokens_per_s": round(state.num_tokens_generated / seconds, 1),
    }
    texts = [[c.text for c in session.finished[request_id].outputs] for request_id in request_ids]
    return CompareRun(config, header, events, texts, figures, dict(recorder.used_by_step))


def same_step(runs: list[CompareRun]) -> int:
    """A step every run reached, half way through the shortest: where the pools are compared."""
    return min(run.figures["steps"] for run in runs) // 2 or 1
