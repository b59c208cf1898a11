"""The command line's option parsers and shared options, for every subcommand in blockviz/commands/.

argparse types that name the option in their one-line error (`int_at_least`, `positive`,
`non_negative`, `non_negative_number`), the engine options every engine command shares
(`add_engine_options`, their defaults EngineConfig's and SamplingParams'), the TUI commands'
options (`add_break_on_option`, `add_guided_option`, `add_keep_events_option`), the parser whose
usage error is one line (`OneLineParser`) and the check `blockviz` runs before any command
(`check_attention_backend`). blockviz/cli.py only builds the parser from these and dispatches.
"""

from __future__ import annotations

import argparse
import math
import re

from blockviz.errors import UsageError, did_you_mean
from blockviz.session.spec import DEFAULT_PROMPTS, ENGINE_CONFIG_OPTIONS
from blockviz.session.tiny_hybrid import TINY_HYBRID
from engine.model_source import DEFAULT_MODEL  # the bundled checkpoint


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (with where to find help) and exit code 2."""

    def error(self, message: str):  # type: ignore[override]
        choice = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
        if choice:  # a mistyped value of an option with choices: the nearest one
            message += did_you_mean(choice.group(1), re.findall(r"'([^']*)'", choice.group(2)))
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def int_at_least(name: str, minimum: int, maximum: int | None = None):
    """An argparse type: an integer >= minimum (and <= maximum), with a message naming the option."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{name} must be at least {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{name} must be at most {maximum}, got {value}")
        return value

    return parse


def positive(name: str):
    """An argparse type: an integer >= 1, with a message naming the option."""
    return int_at_least(name, 1)


def non_negative(name: str):
    """An argparse type: an integer >= 0, with a message naming the option."""
    return int_at_least(name, 0)


CLI_MAX_TOKENS = 32  # longer completions than SamplingParams' default: there is more to watch


def engine_option_defaults() -> dict:
    """Defaults of the engine options: EngineConfig's and SamplingParams', not restated here."""
    from dataclasses import fields

    from engine.config import EngineConfig
    from engine.sequence import SamplingParams

    config = EngineConfig.defaults()
    sampling = {f.name: f.default for f in fields(SamplingParams)}
    return {**{name: config[name] for name in ENGINE_CONFIG_OPTIONS}, "n": sampling["n"],
            "temperature": sampling["temperature"], "max_tokens": CLI_MAX_TOKENS}


def add_engine_options(parser: argparse.ArgumentParser, *, skip: tuple[str, ...] = (), **overrides) -> None:
    """The options shared by the engine commands; `overrides` change their defaults (pool sizes
    default to the memory budget, as vLLM sizes them); `skip` names options a command defines its
    own way (compare takes lists)."""
    from engine.config import ATTENTION_BACKENDS, KV_MANAGERS, PreemptionMode

    d = {**engine_option_defaults(), **overrides}
    parser.add_argument("--model", default=d["model"],
                        help=f"bundled '{DEFAULT_MODEL}' (default, offline), '{TINY_HYBRID}' (a tiny Llama with "
                             "sliding-window and full-attention layers and random weights: its text is noise, its "
                             "memory real; built offline on first use; `run` plays its story under v1), 'smollm2' "
                             "(SmolLM2-135M-Instruct, offline once installed), a local GPT-2 / Llama / Qwen2 / Qwen3 "
                             "checkpoint directory or "
                             ".gguf file, or a Hugging Face name such as gpt2 (from its cache)")
    parser.add_argument("--raw-prompt", action="store_true", default=d["raw_prompt"],
                        help="give an instruct model the prompt as it is, not inside its chat template")
    prompts = d.get("prompts_help") or " / ".join(DEFAULT_PROMPTS)
    parser.add_argument("--prompt", action="append", dest="prompts", metavar="TEXT",
                        help=f"a prompt; repeat for several requests (default: {prompts})")
    parser.add_argument("--n", type=positive("--n"), default=d["n"], action=_GivenChoice,
                        help="completions per prompt; n > 1 forks the sequence (copy-on-write)")
    parser.add_argument("--max-tokens", type=positive("--max-tokens"), default=d["max_tokens"],
                        help=f"tokens to generate per completion (default {d['max_tokens']})")
    if "block_size" not in skip:
        parser.add_argument("--block-size", type=positive("--block-size"), default=d["block_size"],
                            help=f"tokens per KV-cache block (default {d['block_size']})")
    if "num_gpu_blocks" not in skip:
        parser.add_argument("--num-gpu-blocks", type=positive("--num-gpu-blocks"), default=d["num_gpu_blocks"],
                            help="size of the device block pool (default: "
                                 f"{d['num_gpu_blocks'] or 'from the memory budget'})")
    cpu = d["num_cpu_blocks"]
    parser.add_argument("--num-cpu-blocks", type=non_negative("--num-cpu-blocks"), default=cpu,
                        help=f"size of the CPU swap pool (default: {cpu if cpu is not None else 'from the swap space'})")
    caching = d["enable_prefix_caching"]
    if "enable_prefix_caching" not in skip:
        shown = "off in v0, on in v1" if caching is None else "on" if caching else "off"
        parser.add_argument("--prefix-caching", action=argparse.BooleanOptionalAction, default=caching,
                            dest="enable_prefix_caching",
                            help=f"share identical prompt prefixes through the chained-hash cache (default {shown})")
    mode = d["preemption_mode"]
    parser.add_argument("--preemption-mode", choices=[m.value for m in PreemptionMode], default=mode,
                        action=_GivenChoice,
                        help="how to preempt when blocks run out (default: "
                             f"{mode or 'recompute a lone sequence, swap a group, as vLLM'}; v1: recompute)")
    parser.add_argument("--scheduler-reserve-full-isl", action=argparse.BooleanOptionalAction,
                        default=d["scheduler_reserve_full_isl"],
                        help="v1 and vllm: admit a waiting request only when its whole prompt fits the free "
                             "blocks, not just its first chunk (vLLM 0.33's scheduler_reserve_full_isl) "
                             f"(default {'on' if d['scheduler_reserve_full_isl'] else 'off'})")
    parser.add_argument("--async-scheduling", action=argparse.BooleanOptionalAction, default=d["async_scheduling"],
                        help="v1 and vllm: schedule the next step while the last one's sampled tokens are in "
                             "flight (vLLM 0.33's default order; --no-async-scheduling: each step after the last "
                             "one's output, as vLLM's --no-async-scheduling) (default: on; v0 has no such order)")
    if "kv_manager" not in skip:
        parser.add_argument("--kv-manager", choices=list(KV_MANAGERS), default=d["kv_manager"],
                            action=_GivenChoice,
                            help="the KV cache manager and scheduler: v0 (vLLM's BlockSpaceManager: swap, "
                                 "copy-on-write), v1 (vLLM's KVCacheManager: free queue, chunked prefill, "
                                 "recompute only), vllm (vLLM's own Scheduler and KVCacheManager: pip install -e "
                                 "'.[vllm]'; docs/vllm-core.md) or sglang (SGLang's own RadixCache and scheduling "
                                 f"policy: pip install -e '.[sglang]'; docs/sglang.md) (default {d['kv_manager']})")
        parser.add_argument("--sglang-option", action="append", type=_sglang_option, dest="sglang_options",
                            metavar="KEY=VALUE",
                            help="with --kv-manager sglang: an SGLang server argument: page_size (sets "
                                 "--block-size), schedule_policy, chunked_prefill_size, max_prefill_tokens, "
                                 "radix_eviction_policy, schedule_conservativeness; repeatable")
        parser.add_argument("--vllm-option", action="append", type=_vllm_option, dest="vllm_options", metavar="KEY=VALUE",
                            help="with --kv-manager vllm: a field of vLLM's SchedulerConfig or CacheConfig, e.g. "
                                 "scheduler_reserve_full_isl=false, watermark=0.01, policy=priority; repeatable")
        from blockviz.session.scenario import CPU_TIER_GIB

        parser.add_argument("--kv-offloading-size", action="append", type=_offloading_size, dest="vllm_options",
                            nargs="?", const=("kv_offloading_size", CPU_TIER_GIB), metavar="GiB",
                            help="with --kv-manager vllm: vLLM's CPU tier of this many GiB (vLLM's "
                                 "--kv-offloading-size; the same as --vllm-option kv_offloading_size=GiB; "
                                 f"with no number, the CPU-tier story's {CPU_TIER_GIB * 1024:g} MiB: 64 blocks of "
                                 f"the bundled model's); `run` plays the CPU-tier story (docs/vllm-core.md)")
    parser.add_argument("--temperature", type=_temperature, default=d["temperature"],
                        help=f"0 is greedy (default {d['temperature']:g})")
    parser.add_argument("--seed", type=int_at_least("--seed", 0), default=d["seed"],
                        help=f"sampling seed (default {d['seed']})")
    parser.add_argument("--device", type=_device, default=d["device"],
                        help="cuda, cuda:N or cpu (default: cuda when available)")
    parser.add_argument("--attention-backend", choices=ATTENTION_BACKENDS, default=d["attention_backend"],
                        help="torch (gather + SDPA, the reference) or triton (paged kernels; on the CPU only "
                             "under TRITON_INTERPRET=1) (default: triton on CUDA when installed, else torch)")
    parser.add_argument("--enforce-eager", action="store_true", default=d["enforce_eager"],
                        help="no CUDA graphs for decode steps (on CUDA they are on by default; the CPU never uses them)")


MAX_VLLM_OPTION_CHARS = 4096  # KEY=VALUE: vLLM's scheduler and cache fields are numbers, names and short lists
MAX_VLLM_OPTION_NESTING = 64


def _vllm_option(text: str) -> tuple[str, object]:
    """KEY=VALUE with the value as JSON reads it (true, 0.01, 8) or else as text (priority)."""
    import json

    key, sep, value = text.partition("=")
    shown = text if len(text) <= 60 else text[:60] + "…"
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"--vllm-option takes KEY=VALUE, got {shown!r}")
    if len(text) > MAX_VLLM_OPTION_CHARS:
        raise argparse.ArgumentTypeError(f"--vllm-option {shown!r} is {len(text):,} characters long: "
                                         f"at most {MAX_VLLM_OPTION_CHARS:,}")
    if value.count("[") + value.count("{") > MAX_VLLM_OPTION_NESTING:  # only then can it nest too deep to parse
        raise argparse.ArgumentTypeError(f"--vllm-option {shown!r} opens more than {MAX_VLLM_OPTION_NESTING} "
                                         "lists or objects: vLLM's scheduler and cache options are plain values")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def _sglang_option(text: str) -> tuple[str, object]:
    """--sglang-option KEY=VALUE, read as --vllm-option reads its value."""
    try:
        return _vllm_option(text)
    except argparse.ArgumentTypeError as error:
        raise argparse.ArgumentTypeError(str(error).replace("--vllm-option", "--sglang-option")) from None


def _offloading_size(text: str) -> tuple[str, float]:
    """--kv-offloading-size GiB (vLLM's CacheConfig.kv_offloading_size) as a vllm option."""
    try:
        size = float(text)
    except ValueError:
        size = math.nan
    if not (math.isfinite(size) and size > 0):
        raise argparse.ArgumentTypeError(f"--kv-offloading-size takes a positive number of GiB, got {text!r}")
    return "kv_offloading_size", size


class _GivenChoice(argparse.Action):
    """Store the value and note that the option was given (`<dest>_given`), so a command's default
    (the story's swap preemption) can give way to --kv-manager v1 while a swap asked for cannot."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        setattr(namespace, f"{self.dest}_given", True)


def add_break_on_option(parser: argparse.ArgumentParser) -> None:
    """--break-on KINDS for the TUI commands: playback stops at each event of these kinds."""
    def kinds(text: str) -> frozenset:
        from engine.events import event_classes

        try:
            return event_classes(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    parser.add_argument("--break-on", type=kinds, default=frozenset(), metavar="KINDS",
                        help="stop playback at each event of these kinds (comma-separated, e.g. "
                             "copy_on_write,swap_out); in the app ] plays on to the next, [ goes back, B changes them")


def add_guided_option(parser: argparse.ArgumentParser, default_text: str) -> None:
    """--guided / --no-guided for the TUI commands: playback stops at each idea's first occurrence
    (a fork, a copy-on-write, a prefix hit, a swap, an eviction...) with a card that explains it."""
    parser.add_argument("--guided", action=argparse.BooleanOptionalAction, default=None,
                        help="stop at the first fork, copy-on-write, prefix hit, swap out / in, recompute, "
                             f"eviction and request that can never run, each with a card saying why ({default_text})")


def add_keep_events_option(parser: argparse.ArgumentParser) -> None:
    """--keep-events N for the live TUI: a long session keeps its last N events (time travel over
    those), dropping its oldest steps with a notice; 0 keeps every event."""
    from blockviz.model.timeline import LIVE_MAX_EVENTS, MIN_KEPT_EVENTS

    def count(text: str) -> int | None:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"--keep-events must be a whole number, got {text!r}") from None
        if value and value < MIN_KEPT_EVENTS:
            raise argparse.ArgumentTypeError(f"--keep-events must be 0 (keep all) or at least {MIN_KEPT_EVENTS}, got {value}")
        return value or None

    parser.add_argument("--keep-events", type=count, default=LIVE_MAX_EVENTS, metavar="N",
                        help=f"a long live session keeps its last N events for time travel, dropping its oldest "
                             f"steps with a notice (default {LIVE_MAX_EVENTS:,}; 0 keeps every event)")


def non_negative_number(name: str):
    """An argparse type: a finite float >= 0, with a message naming the option."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a number, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise argparse.ArgumentTypeError(f"{name} must be a finite number >= 0, got {text!r}")
        return value

    return parse


_temperature = non_negative_number("--temperature")


def _device(text: str) -> str:
    """cpu, cuda or cuda:N; whether CUDA is there is checked when the engine starts (torch)."""
    if text == "cpu" or text == "cuda" or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"--device must be cpu, cuda or cuda:N, got {text!r}")


def check_attention_backend(args: argparse.Namespace) -> None:
    """UsageError (one line) before any model loads when --attention-backend triton cannot run on the
    chosen device (engine.kernels.resolve_attention_backend); imports torch only when triton is asked for."""
    if getattr(args, "attention_backend", None) != "triton":
        return
    import torch

    from engine.kernels import resolve_attention_backend

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolve_attention_backend("triton", device)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
