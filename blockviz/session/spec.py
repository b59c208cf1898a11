"""What a live run runs, and the checks made before any UI opens or any model loads.

`EngineSpec` is an EngineConfig plus the requests (the CLI's engine options); `check_model`,
`EngineSpec.check` and `EngineSpec.check_prompt_lengths` turn what can be known wrong up front into
one line (UsageError). An EngineSession (engine_session.py) runs a spec. No torch and no textual
import here.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from typing import Any

from blockviz.errors import UsageError
from blockviz.model.safe_text import safe_line
from engine.designs import get_design
from blockviz.session.scenario import Arrival, scenario
from blockviz.session.tiny_hybrid import TINY_HYBRID, resolve
from engine.config import EngineConfig

DEFAULT_PROMPTS = ("ROMEO:", "JULIET:")
# The EngineConfig fields (engine/config.py) a command line sets, each an option named after it
# (--block-size ...); n, max tokens and temperature are the requests' (SamplingParams).
ENGINE_CONFIG_OPTIONS = ("model", "block_size", "num_gpu_blocks", "num_cpu_blocks", "enable_prefix_caching",
                         "preemption_mode", "device", "seed", "attention_backend", "raw_prompt", "kv_manager",
                         "enforce_eager", "scheduler_reserve_full_isl", "async_scheduling")


def one_line(exc: BaseException) -> str:
    """An exception as one line of text (its first line, else its type), every control character
    in it written visibly (blockviz/model/safe_text.py: a message may quote data)."""
    text = str(exc).strip()
    return safe_line(text.splitlines()[0]) if text else type(exc).__name__


@dataclass(slots=True)
class EngineSpec:
    """What to run: an EngineConfig (engine/config.py: model, block size, pools, prefix caching,
    preemption mode, device, seed...) and the requests: `prompts` at once, `arrivals` as the engine
    steps (blockviz/session/scenario.py), each sampled with `n`, `max_tokens` and `temperature`."""

    config: EngineConfig = field(default_factory=EngineConfig)
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    n: int = 1
    max_tokens: int = 32
    temperature: float = 0.0
    arrivals: tuple[Arrival, ...] = ()

    @classmethod
    def of(cls, **options: Any) -> "EngineSpec":
        """A spec from keyword options: EngineConfig's by their names, the rest the spec's own.
        The model "tiny-hybrid" is its checkpoint directory (tiny_hybrid.resolve: built on first use)."""
        names = EngineConfig.option_names()
        if "model" in options:
            options = {**options, "model": resolve(options["model"], options.get("kv_manager"))}
        config = EngineConfig(**{k: v for k, v in options.items() if k in names})
        return cls(config, **{k: v for k, v in options.items() if k not in names})

    @classmethod
    def for_scenario(cls, name: str, **options: Any) -> "EngineSpec":
        """A named scenario's spec (scenario.SCENARIOS): its arrivals, on its engine and sampling
        settings except where `options` (EngineConfig's and the spec's own, as `of` takes them)
        say otherwise (`vllm_options` on top of the story's). A ValueError names an unknown scenario
        or option. The story under `kv_manager="v1"` is vLLM v1's story ("story-v1"), as `blockviz run
        --kv-manager v1` plays, and under `kv_manager="vllm"` with a CPU tier (the vllm option
        kv_offloading_size) the CPU tier's ("story-cpu-tier")."""
        arrivals, settings = scenario(_story_of(name, options.get("kv_manager"), options.get("vllm_options")))
        known = {*EngineConfig.option_names(), "n", "max_tokens", "temperature"}
        unknown = sorted(set(options) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(sorted(known))}")
        if not _swaps(options.get("kv_manager")) and "preemption_mode" not in options:
            settings = {**settings, "preemption_mode": None}  # the story's swap is v0's; v1 recomputes
        if settings.get("vllm_options") and options.get("vllm_options") is not None:  # the story's size unless given
            options = {**options, "vllm_options": {**settings["vllm_options"], **options["vllm_options"]}}
        if settings.get("sglang_options"):  # the story's SGLang options under those given, its page the block size
            options = {**options, "sglang_options": _story_sglang_options(
                settings, options.get("block_size", settings.get("block_size")), options.get("sglang_options"))}
        return cls.of(**{**settings, **options}, prompts=(), arrivals=arrivals)

    @classmethod
    def from_args(cls, args: Any, default_arrivals: tuple[Arrival, ...] = ()) -> "EngineSpec":
        """The spec of the parsed CLI options; with no --prompt, `default_arrivals` when given (the
        scenario `blockviz run` plays), else the default prompts."""
        if args.prompts:
            prompts, arrivals = tuple(args.prompts), ()
        else:
            prompts, arrivals = ((), default_arrivals) if default_arrivals else (DEFAULT_PROMPTS, ())
        options = {name: getattr(args, name) for name in ENGINE_CONFIG_OPTIONS}
        if getattr(args, "vllm_options", None):  # --vllm-option KEY=VALUE ..., for --kv-manager vllm
            options["vllm_options"] = dict(args.vllm_options)
        if getattr(args, "sglang_options", None):  # --sglang-option KEY=VALUE ..., for --kv-manager sglang
            options["sglang_options"] = dict(args.sglang_options)
        if not _swaps(options["kv_manager"]) and not getattr(args, "preemption_mode_given", False):
            options["preemption_mode"] = None  # a command's default swap is v0's; v1 recomputes
        try:
            options["model"] = resolve(options["model"], options["kv_manager"])  # "tiny-hybrid": built on first use
            config = EngineConfig(**options)
        except ValueError as exc:
            raise UsageError(one_line(exc)) from None
        return cls(config, prompts=prompts, arrivals=arrivals, n=args.n, max_tokens=args.max_tokens,
                   temperature=args.temperature)

    @classmethod
    def for_story_args(cls, args: Any) -> "EngineSpec":
        """`blockviz run`'s spec: `from_args`, playing the story when no --prompt is given (the
        story of the KV cache manager --kv-manager names, vLLM v1's on its own per-step token
        budget, as `for_scenario` picks it); the story's engine settings are the options' defaults
        (scenario.DEFAULT_SCENARIO_OPTIONS). On --model tiny-hybrid it plays the hybrid story
        ("story-hybrid"), under vLLM v1's manager unless --kv-manager names another (v0 cannot
        run it: check_all says so in one line); with --kv-manager vllm and --kv-offloading-size, the
        CPU tier's ("story-cpu-tier")."""
        name = "story"
        if args.model == TINY_HYBRID:
            name = "story-hybrid"
            if not getattr(args, "kv_manager_given", False):
                args = argparse.Namespace(**{**vars(args), "kv_manager": scenario(name)[1]["kv_manager"]})
        arrivals, settings = scenario(_story_of(name, args.kv_manager, dict(getattr(args, "vllm_options", None) or ())))
        spec = cls.from_args(args, default_arrivals=arrivals)
        if spec.arrivals and "max_num_batched_tokens" in settings:
            spec.config = replace(spec.config, max_num_batched_tokens=settings["max_num_batched_tokens"])
        if spec.arrivals and settings.get("sglang_options"):
            try:
                spec.config = replace(spec.config, sglang_options=_story_sglang_options(
                    settings, spec.config.block_size, spec.config.sglang_options))
            except ValueError as exc:
                raise UsageError(one_line(exc)) from None
        return spec

    @property
    def model(self) -> str:
        return self.config.model

    def check(self, *, device: bool = True) -> None:
        """Raise UsageError (one line) for what can be known wrong before the engine starts:
        an empty prompt, a CUDA device this machine does not have (device=False leaves that
        check, the one that imports torch, to the caller)."""
        for prompt in (*self.prompts, *(a.prompt for a in self.arrivals)):
            if not prompt:
                raise UsageError("--prompt is empty: give at least one character")
        if device and self.config.device is not None:
            check_device(self.config.device)

    def check_all(self, *, device: bool = True):
        """Every check made before an engine starts, as one line each (UsageError): `check()`, the
        model (check_model), the sampling parameters, the prompts' lengths, each request's n
        against max_num_seqs. Returns check_model's result. Imports no torch unless a CUDA device
        was asked for (and `device` is True)."""
        self.check(device=device)
        try:
            if self.config.vllm_options:  # names and values vLLM refuses, before the engine starts
                from engine.vllm_core import quiet_vllm_logs
                from engine.vllm_core.config import check_options

                with quiet_vllm_logs():  # vLLM's import warnings stay off the terminal
                    check_options(self.config.vllm_options)
            source = check_model(self.model, self.config.kv_manager)
            self.sampling_params()
        except (OSError, ValueError) as exc:  # ModelNotFoundError is a ValueError
            raise UsageError(one_line(exc)) from None
        self.check_prompt_lengths(source)
        try:  # the engine's own check of n (LLMEngine.check_request), before the model loads
            for n in ([self.n] if self.prompts else []) + [a.n for a in self.arrivals]:
                self.config.check_n(n)
        except ValueError as exc:
            raise UsageError(one_line(exc)) from None
        return source

    def check_prompt_lengths(self, source) -> None:
        """Raise UsageError when a prompt is as long as the model's context, before the engine
        starts: the checkpoint's tokenizer.json and config.json alone (the tokenizers library,
        no torch). `source` is what engine.model_source.check_model returned. Skipped when those
        files are not on this machine; the engine checks again when the request is added."""
        import json

        from engine.model_source import checkpoint_file

        config_path, tokenizer_path = checkpoint_file(source, "config.json"), checkpoint_file(source, "tokenizer.json")
        if config_path is None or tokenizer_path is None:
            return
        try:
            from tokenizers import Tokenizer

            context = json.loads(config_path.read_text()).get("n_positions")
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception:  # noqa: BLE001 - a file this cannot read: the engine checks again
            return
        if not isinstance(context, int):
            return
        for prompt in (*self.prompts, *(a.prompt for a in self.arrivals)):
            length = len(tokenizer.encode(prompt, add_special_tokens=False).ids)
            if length >= context:
                raise UsageError(f"a prompt has {length} tokens but the model's context is {context}: "
                                 f"shorten it to at most {context - 1}")

    def sampling_params(self, n: int | None = None):
        from engine.sequence import SamplingParams

        return SamplingParams(n=self.n if n is None else n, temperature=self.temperature,
                              max_tokens=self.max_tokens, seed=self.config.seed)

    def make_engine(self):
        """Build the engine (loads the model: seconds). Imports torch."""
        from engine import LLMEngine

        return LLMEngine(self.config)

    def run_header(self) -> dict[str, Any]:
        """The run's settings for a trace header."""
        mode = self.config.preemption_mode
        header = {"prompts": list(self.prompts), "n": self.n, "max_tokens": self.max_tokens,
                  "seed": self.config.seed, "temperature": self.temperature,
                  "preemption_mode": mode.value if mode is not None else None}
        if self.arrivals:
            header["arrivals"] = [{"step": a.step, "prompt": a.prompt, "n": a.n} for a in self.arrivals]
        return header

    def as_dict(self) -> dict[str, Any]:
        """The spec's fields by name (the config stays an EngineConfig): `type(spec)(**spec.as_dict())`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _story_of(name: str, kv_manager: str | None, vllm_options: dict[str, Any] | None = None) -> str:
    """The scenario to play for `name` under `kv_manager`: the story under vLLM v1's manager is
    v1's own ("story-v1": chunked prefill and recompute, never a fork or a swap), under SGLang's
    radix cache SGLang's ("story-sglang": a split, locks, whole-leaf eviction, pages, lpm), and with a CPU
    tier (the vllm option kv_offloading_size, under a design that has one) the CPU tier's
    ("story-cpu-tier": v1's story, its prefix loaded back from the tier)."""
    design = get_design(kv_manager)
    if name == "story" and design.radix_tree:
        return "story-sglang"
    if name == "story" and design.cpu_tier and (vllm_options or {}).get("kv_offloading_size") is not None:
        return "story-cpu-tier"
    return "story-v1" if name == "story" and design.chunked_prefill else name


def _story_sglang_options(settings: dict, block_size: int | None, given: dict | None) -> dict:
    """A story's SGLang options (its settings' "sglang_options") with `given` on top; the story's
    page_size follows the run's block size (SGLang's page is one block), so --block-size alone
    changes both."""
    story = dict(settings["sglang_options"])
    if "page_size" in story and block_size is not None:
        story["page_size"] = block_size
    return {**story, **(given or {})}


def _swaps(kv_manager: str | None) -> bool:
    """Whether the design may preempt by swap (v0): the others recompute only."""
    return get_design(kv_manager).swap


def check_device(device: str) -> None:
    """Raise UsageError when `device` (cpu, cuda, cuda:N) names a CUDA device this machine lacks."""
    if not device.startswith("cuda"):
        return
    import torch

    index = int(device.partition(":")[2] or 0)
    if not torch.cuda.is_available():
        raise UsageError(f"--device {device}: this machine has no CUDA device (torch "
                         f"{torch.__version__}); omit --device to run on the CPU")
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")


def check_model(name: str, kv_manager: str | None = None):
    """Raise engine.model_source.ModelNotFoundError or ValueError (one line) now, before any UI
    opens, when `name` cannot be loaded: engine.model_source.check_model resolves a bundled name or
    a local directory on disk and a hub name in the local cache (or with one quick probe of the
    hub), and refuses a config.json no model here runs (or whose sliding layers `kv_manager`
    cannot serve). Imports neither torch nor transformers: the UI process never loads them."""
    from engine.model_source import check_model as check

    return check(name, kv_manager)


def quiet_model_loading() -> None:
    """No progress bars or hub chatter from Hugging Face libraries on the user's terminal (the CLI
    prints its own one-line progress; a TUI owns the terminal)."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
