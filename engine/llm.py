"""LLM: the vLLM-shaped front door (`vllm.LLM`): build an engine, generate for a batch of prompts."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from engine.events import EventBus
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.model_source import DEFAULT_MODEL
from engine.outputs import RequestOutput
from engine.sequence import SamplingParams


class LLM:
    """`LLM(model).generate(prompts, sampling_params)` -> RequestOutputs in input order.

    Every block operation of the run is on `llm.events`; `llm.engine` is the LLMEngine underneath.
    """

    def __init__(self, model: str = DEFAULT_MODEL, **options) -> None:
        """`options` are EngineConfig's (engine/config.py): block_size, num_gpu_blocks,
        num_cpu_blocks, enable_prefix_caching, preemption_mode, device, dtype, seed, ..."""
        unknown = sorted(set(options) - set(EngineConfig.option_names()))
        if unknown:
            raise ValueError(f"unknown engine option(s) {', '.join(unknown)}; the options are "
                             f"{', '.join(EngineConfig.option_names())}")
        self.engine = LLMEngine(EngineConfig(model=model, **options))

    @classmethod
    def from_engine(cls, engine: LLMEngine) -> "LLM":
        """An LLM over an engine built elsewhere (several engines can share one loaded model:
        `LLMEngine(config, loaded=...)`)."""
        llm = cls.__new__(cls)
        llm.engine = engine
        return llm

    @property
    def events(self) -> EventBus:
        return self.engine.events

    @property
    def tokenizer(self):
        return self.engine.tokenizer

    def generate(
        self,
        prompts: str | dict | Iterable[str | dict],
        sampling_params: SamplingParams | list[SamplingParams] | None = None,
        on_step: Callable[[LLMEngine], None] | None = None,
    ) -> list[RequestOutput]:
        """Run every prompt to completion; `on_step(engine)` is called after each step.

        Atomic: every prompt is checked before any is queued, and if anything fails on the way
        (a step, `on_step`, Ctrl-C) the requests this call queued are aborted, their blocks freed,
        so the engine is left as it was."""
        if isinstance(prompts, (str, dict)):
            prompts = [prompts]
        prompts = list(prompts)
        if isinstance(sampling_params, list):
            if len(sampling_params) != len(prompts):
                raise ValueError(f"{len(sampling_params)} sampling params for {len(prompts)} prompts")
            params_list = sampling_params
        else:
            params_list = [sampling_params] * len(prompts)
        engine = self.engine
        for prompt, params in zip(prompts, params_list):
            engine.check_request(prompt, params)
        request_ids: list[str] = []
        finished: dict[str, RequestOutput] = {}
        try:
            for prompt, params in zip(prompts, params_list):
                request_ids.append(engine.add_request(prompt, params))
            while engine.has_unfinished_requests():
                for output in engine.step():
                    if output.finished:
                        finished[output.request_id] = output
                if on_step is not None:
                    on_step(engine)
        except BaseException:
            for request_id in request_ids:
                if request_id not in finished and engine.is_unfinished(request_id):
                    engine.abort_request(request_id, "aborted: generate() failed")
            raise
        return [finished[request_id] for request_id in request_ids]
