"""What a setting changes: one workload through the real engine once per configuration.

`configurations(base, kv_manager=["v0", "v1"], block_size=[4, 16])` is every combination of the
values given over a base EngineConfig, and only of those: a setting not given keeps the base's
value (prefix caching, when not given, is each manager's own default: off in v0, on in v1, as
vLLM has it). `run_all(prompts, configs, params)` loads the model once and runs the prompts through
a fresh engine per configuration, in turn, keeping each run's header, events, figures and texts;
`differences(runs)` names the figures that differ between them. The CLI prints the figures
(`blockviz compare`), the TUI shows the runs' pools side by side at the same engine step
(`blockviz compare --tui`), and the notebook a grid of pool widgets (`blockviz.jupyter.compare`).

No tokens/s here: one run of a small workload on a shared machine gives a figure that moves by
several times from run to run (benchmarks/ measures speed, side by side and repeated).
Torch is imported only when the runs start.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from blockviz.model.free_space import free_space
from blockviz.session.engine_session import EngineSession
from blockviz.session.recorder import Recorder
from blockviz.session.spec import EngineSpec
from engine import events as ev

SWEPT = ("kv_manager", "block_size", "num_gpu_blocks", "enable_prefix_caching")
_OPENING = "ROMEO: But soft, what light through yonder window breaks? It is the east, and Juliet is the sun."
# compare's workload when no --prompt is given: two requests with one opening (31 tokens of the
# bundled model's tokenizer, so a whole block of 16 is shared), so prefix caching has a hit to show
DEFAULT_PROMPTS = (f"{_OPENING} Arise, fair sun, and kill the envious moon,",
                   f"{_OPENING} Who is already sick and pale with grief,")
# The figures `differences` compares, in the order a table shows them, with their names.
COMPARED = (("peak_blocks", "peak blocks"), ("prefix_hits", "prefix hits"), ("prefix_hit_rate", "hit rate"),
            ("forks", "forks"), ("copies_on_write", "copies on write"), ("preemptions", "preemptions"),
            ("tokens_recomputed", "tokens recomputed"), ("tokens_computed", "tokens computed"), ("steps", "steps"),
            ("same_text_as_first", "same text"))


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
        """The swept settings, short: "block 4 · pool 32 · cache on · v1"."""
        return (f"block {self.config.block_size} · pool {self.header['num_gpu_blocks']} · "
                f"cache {'on' if self.config.enable_prefix_caching else 'off'} · {self.config.kv_manager}")


def configurations(base, sglang_options: dict | None = None, **swept: list) -> list:
    """Every combination of the swept values (keys from SWEPT; a missing or empty one keeps base's,
    so only what is given varies). A prefix-caching value of None is the manager's default; when
    the managers vary and prefix caching is not given, each gets its own default too.
    `sglang_options` go to the runs of a radix-tree design (kv_manager "sglang") only: its
    page_size may differ from the other runs' block size.
    A ValueError names a combination the engine refuses (v1 with swap preemption)."""
    names = [name for name in SWEPT if swept.get(name)]
    if "kv_manager" in names and "enable_prefix_caching" not in names:
        names, swept = [*names, "enable_prefix_caching"], {**swept, "enable_prefix_caching": [None]}
    configs = [replace(base, **dict(zip(names, values))) for values in itertools.product(*(swept[n] for n in names))]
    return [replace(config, sglang_options=sglang_options) if sglang_options and config.design.radix_tree else config
            for config in configs]


def differences(runs: list["CompareRun"]) -> list[tuple[str, list]]:
    """The figures (COMPARED's names) whose values are not the same in every run, each with the
    runs' values in order: what the settings changed."""
    out = []
    for key, name in COMPARED:
        values = [run.figures.get(key) for run in runs]
        if len(set(map(repr, values))) > 1:
            if key == "prefix_hit_rate":  # v0 counts prompt blocks, v1 tokens (reducer.prefix_hit_unit)
                units = [run.figures.get("prefix_hit_unit", "blocks") for run in runs]
                name = f"{name} (of {' | '.join(units) if len(set(units)) > 1 else units[0]})"
            out.append((name, values))
    return out


def why_lines(runs: list["CompareRun"]) -> list[str]:
    """A line for each figure that looks surprising, saying why it differs: a run that found more
    prefix-cache hits yet computed more tokens than another (vLLM v1 beside v0 with n > 1: v0 forks
    the samples from one prefill, v1 prefills each sample and its cache serves only full blocks)."""
    lines = []
    for a in runs:
        for b in runs:
            fa, fb = a.figures, b.figures
            if fa["prefix_hits"] > fb["prefix_hits"] and fa["tokens_computed"] > fb["tokens_computed"]:
                more = fa["tokens_computed"] - fb["tokens_computed"]
                if fb["forks"] and not fa["forks"]:
                    reason = (f"{b.config.kv_manager} forks each request's samples from one prefill (their prompt "
                              f"computed once), while {a.config.kv_manager} prefills every sample as a sequence of its "
                              "own and its cache serves only full blocks: each sample computes the prompt's partial "
                              "last block (and at least its last token) again")
                else:
                    reason = ("a hit serves only full blocks, and a prompt's last block is always computed (a token to "
                              "sample from), so the hits save less than the other run's work differs by")
                names = ((a.config.kv_manager, b.config.kv_manager) if a.config.design is not b.config.design
                         else (a.label, b.label))
                lines.append(f"why {names[0]} computes {more} more tokens than {names[1]} despite "
                             f"{fa['prefix_hits']} prefix hits to {fb['prefix_hits']}: {reason}")
    return lines


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

    session.run_to_completion(on_events=keep)
    session.close()
    state, config = recorder.state, engine.config
    work = Work(config.block_size)
    moments = RequestMoments(header)
    for event in events:
        work.feed(event)
        moments.feed(event)
    figures = {
        "kv_manager": config.kv_manager, "block_size": config.block_size, "num_gpu_blocks": header["num_gpu_blocks"],
        "prefix_caching": config.enable_prefix_caching, "steps": session.num_steps,
        "peak_blocks": recorder.peak_used, "token_utilization_at_peak": round(recorder.token_utilization_at_peak, 4),
        "prefix_hits": state.num_prefix_hits, "prefix_hit_rate": round(state.prefix_hit_rate(), 4),
        "prefix_hit_unit": state.prefix_hit_unit,
        "forks": work.forks, "copies_on_write": work.copies_on_write,
        "preemptions": state.num_preemptions, "tokens_recomputed": work.tokens_recomputed,
        "tokens_computed": work.tokens_computed, "tokens": state.num_tokens_generated,
        # per request (in the workload's order), the prompt tokens the cache served at its admission
        "hit_tokens": [session.finished[request_id].num_cached_tokens for request_id in request_ids],
        # per request: the GPU's free space as the design counts it when the request first got blocks
        # (free_space.FreeSpace.to_json, None if it never did), and each eviction made for it
        "free_at_admission": [moments.free_at_admission.get(request_id) for request_id in request_ids],
        "evicted": [moments.evicted.get(request_id, []) for request_id in request_ids],
        "evicted_leaves": moments.evicted_leaves,
    }
    texts = [[c.text for c in session.finished[request_id].outputs] for request_id in request_ids]
    return CompareRun(config, header, events, texts, figures, dict(recorder.used_by_step))


def run_name(figures: dict[str, Any]) -> str:
    """A run's short name in per-request lines: its design and block (page) size, "sglang/1"."""
    return f"{figures['kv_manager']}/{figures['block_size']}"


def partial_hit_note(runs: list[dict[str, Any]], index: int) -> str:
    """Request `index`'s note when the runs' prefix hits differ and the run that hit more shares
    smaller units (SGLang's tree at page_size 1 beside vLLM's blocks of 4): the extra tokens are
    those of a partial block the other cannot share, since vLLM caches full blocks only. "" when
    there is nothing to say. `runs` are the runs' figures."""
    hits = [run["hit_tokens"][index] if index < len(run["hit_tokens"]) else 0 for run in runs]
    if len(runs) < 2 or max(hits) == min(hits):
        return ""
    best, worst = runs[hits.index(max(hits))], runs[hits.index(min(hits))]
    if best["block_size"] >= worst["block_size"]:
        return ""
    return (f"{run_name(best)} hits {max(hits) - min(hits)} more: tokens of a partial block "
            f"{run_name(worst)} cannot share")


def hit_notes(runs: list[CompareRun]) -> list[str]:
    """Every request's partial_hit_note, named as the compare table names it ("r1: ...")."""
    figures = [run.figures for run in runs]
    count = max(len(f["hit_tokens"]) for f in figures)
    notes = ((index, partial_hit_note(figures, index)) for index in range(count))
    return [f"r{index}: {note}" for index, note in notes if note]


def hits_at(state) -> str:
    """The prefix hit of each request a reducer state knows, in tokens, as of that state ("r0 0 ·
    r1 46 · r2 –": – for a request still waiting for its first step)."""
    parts = []
    for request_id, seq_ids in state.requests.items():
        seqs = [state.seqs[seq_id] for seq_id in seq_ids if seq_id in state.seqs]
        waiting = all(seq.status == "waiting" and seq.seq_id not in state.tables for seq in seqs)
        hit = max((seq.num_cached_tokens for seq in seqs), default=0)
        parts.append(f"r{request_id} {'–' if waiting and not hit else hit}")
    return " · ".join(parts)


def figure_text(value: Any) -> str:
    """A figure as the tables show it: yes / no, a rate as a percentage, a count as it is."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    return f"{value:.0%}" if isinstance(value, float) else str(value)


def differences_line(runs: list["CompareRun"]) -> str:
    """`differences` in one line, each figure's values in the runs' order ("" for one run)."""
    if len(runs) < 2:
        return ""
    differ = differences(runs)
    if not differ:
        return "the runs' figures are the same"
    return "differ: " + " · ".join(f"{name} {' | '.join(map(figure_text, values))}" for name, values in differ)


class Work:
    """What the forward passes did, from a run's events: tokens computed (StepStarted.num_tokens:
    prompt tokens not served by the cache, chunks, decode tokens), forks and copies on write (v0),
    and tokens recomputed after recompute preemptions: each preemption's computed tokens
    (Preempted.num_tokens_lost) less those its request got back as prefix-cache hits when it was
    scheduled again (vLLM v1 revives a preempted request's cached blocks; v0 only with caching on)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.tokens_computed = self.tokens_recomputed = self.forks = self.copies_on_write = 0
        self._resuming: dict[str, list[int]] = {}  # request -> [tokens lost, tokens hit since]
        self._request_of: dict[int, str] = {}

    def feed(self, event: ev.Event) -> None:
        if isinstance(event, ev.StepStarted):
            self.tokens_computed += event.num_tokens
        elif isinstance(event, ev.Forked):
            self.forks += 1
            self._request_of[event.child_seq_id] = self._request_of.get(event.parent_seq_id, "")
        elif isinstance(event, ev.CopyOnWrite):
            self.copies_on_write += 1
        elif isinstance(event, ev.RequestAdded):
            self._request_of.update(dict.fromkeys(event.seq_ids, event.request_id))
        elif isinstance(event, ev.Preempted) and event.mode == "recompute":
            self._settle(event.request_id, upto=event.num_tokens_lost)  # preempted again before a token
            self._resuming[event.request_id] = [event.num_tokens_lost, 0]
        elif isinstance(event, ev.PrefixCacheHit):
            for request_id in {self._request_of.get(seq_id) for seq_id in event.seq_ids}:
                if request_id in self._resuming:
                    self._resuming[request_id][1] += self.block_size
        elif isinstance(event, ev.TokenGenerated):
            self._settle(self._request_of.get(event.seq_id, ""))
        elif isinstance(event, ev.SequenceFinished):  # ended without running again: nothing recomputed
            self._resuming.pop(event.request_id, None)

    def _settle(self, request_id: str, upto: int | None = None) -> None:
        """The request ran again: its lost tokens not hit were computed again (`upto` of them when
        it was preempted again before sampling a token)."""
        lost, hit = self._resuming.pop(request_id, (0, 0))
        self.tokens_recomputed += max(0, min(lost, lost if upto is None else upto) - hit)


class RequestMoments:
    """Per request, from a run's events: the GPU's free space (free_space.free_space) at the start
    of the step that gave the request its first block (allocated or hit), and what was evicted for it: the evictions of
    a step (BlockEvicted on the GPU: vLLM popping a cached block from its free queue, SGLang's
    RadixCache.evict deleting leaves) go to the request whose allocation comes next in that step,
    as [step, blocks, tokens] (a cached block holds block_size tokens in both designs: vLLM caches
    full blocks only, SGLang's tree whole pages). `evicted_leaves` counts SGLang's deleted tree
    nodes (RadixNodeEvicted)."""

    def __init__(self, header: dict[str, Any]) -> None:
        from blockviz.model.reducer import ReducerState

        self.state = ReducerState.from_header(header)
        self.block_size = self.state.block_size
        self.step = 1
        self.free_at_admission: dict[str, dict[str, Any]] = {}
        self.evicted: dict[str, list[list[int]]] = {}
        self.evicted_leaves = 0
        self._pending = 0  # blocks evicted this step, not yet given to a request
        self._request_of: dict[int, str] = {}
        self._at_step_start = free_space(self.state).to_json()

    def feed(self, event: ev.Event) -> None:
        if isinstance(event, ev.RequestAdded):
            self._request_of.update(dict.fromkeys(event.seq_ids, event.request_id))
        elif isinstance(event, ev.Forked):
            self._request_of[event.child_seq_id] = self._request_of.get(event.parent_seq_id, "")
        elif isinstance(event, ev.BlockEvicted) and event.device == "gpu":
            self._pending += 1
        elif isinstance(event, ev.RadixNodeEvicted):
            self.evicted_leaves += 1
        elif isinstance(event, (ev.BlockAllocated, ev.PrefixCacheHit)) and event.device == "gpu":
            request_id = self._request_of.get(event.seq_ids[0], "")
            self.free_at_admission.setdefault(request_id, self._at_step_start)
            if self._pending and isinstance(event, ev.BlockAllocated):
                self.evicted.setdefault(request_id, []).append(
                    [self.step, self._pending, self._pending * self.block_size])
                self._pending = 0
        elif isinstance(event, ev.StepFinished):
            if self._pending:  # no allocation followed in the step: evicted for no request
                self.evicted.setdefault("", []).append([self.step, self._pending, self._pending * self.block_size])
            self.step += 1
            self._pending = 0
        self.state.apply(event)
        if isinstance(event, ev.StepFinished):
            self._at_step_start = free_space(self.state).to_json()


def same_step(runs: list[CompareRun]) -> int:
    """A step every run reached, half way through the shortest: where the pools are compared."""
    return min(run.figures["steps"] for run in runs) // 2 or 1
