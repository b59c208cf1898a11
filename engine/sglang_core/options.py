"""`--sglang-option KEY=VALUE`: the SGLang server arguments the adapter passes on, checked as SGLang
checks them (sglang/srt/arg_groups/fields/schedule.py and memory.py name and document each).

page_size is the engine's block_size (one page is one of our blocks): EngineConfig takes either and
refuses two that differ. The rest keep SGLang's defaults unless given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs", "lof", "random")  # SGLang's choices that need no priority or routing key
EVICTION_POLICIES = ("lru", "lfu", "slru")  # SGLang's RADIX_EVICTION_POLICY_CHOICES that need no request priority

# option -> (what it is, SGLang's default)
OPTIONS: dict[str, tuple[str, Any]] = {
    "page_size": ("slots per page: the engine's block_size", None),
    "schedule_policy": (f"the waiting queue's order: {', '.join(SCHEDULE_POLICIES)}", "fcfs"),
    "chunked_prefill_size": ("the most prompt tokens one prefill batch computes; -1: no chunking", "the engine's max_num_batched_tokens"),
    "max_prefill_tokens": ("the most new tokens one prefill batch admits", 16384),
    "radix_eviction_policy": (f"which unlocked leaf leaves the tree first: {', '.join(EVICTION_POLICIES)}", "lru"),
    "schedule_conservativeness": ("scales the share of max_new_tokens admission reserves per request", 1.0),
}


@dataclass(slots=True)
class SglangOptions:
    """The options one SGLang-backed engine runs with (SGLang ServerArgs fields of those names)."""

    page_size: int = 1
    schedule_policy: str = "fcfs"
    chunked_prefill_size: int = -1
    max_prefill_tokens: int = 16384
    radix_eviction_policy: str = "lru"
    schedule_conservativeness: float = 1.0
    given: dict = field(default_factory=dict)  # the options as given (a trace header records them)

    @classmethod
    def parse(cls, options: dict[str, Any] | None, page_size: int, max_num_batched_tokens: int) -> "SglangOptions":
        """The options from `options` (name -> value) over SGLang's defaults, with `page_size` and a
        chunk of `max_num_batched_tokens` unless chunked_prefill_size is given; a
        ValueError line names an unknown option or a value SGLang refuses."""
        options = dict(options or {})
        for name in options:
            if name not in OPTIONS:
                shown = name if len(name) <= 60 else name[:60] + "…"
                raise ValueError(f"unknown sglang option {shown!r}: the options are {', '.join(OPTIONS)}")
        parsed = cls(page_size=page_size, chunked_prefill_size=max_num_batched_tokens, given=options)
        for name in ("chunked_prefill_size", "max_prefill_tokens"):
            if name in options:
                setattr(parsed, name, _integer(name, options[name]))
        if parsed.chunked_prefill_size == 0 or parsed.chunked_prefill_size < -1:
            raise ValueError(f"sglang option chunked_prefill_size must be positive or -1, got {parsed.chunked_prefill_size}")
        if parsed.max_prefill_tokens < 1:
            raise ValueError(f"sglang option max_prefill_tokens must be positive, got {parsed.max_prefill_tokens}")
        if "schedule_policy" in options:
            parsed.schedule_policy = _choice("schedule_policy", options["schedule_policy"], SCHEDULE_POLICIES)
        if "radix_eviction_policy" in options:
            parsed.radix_eviction_policy = _choice("radix_eviction_policy", options["radix_eviction_policy"],
                                                   EVICTION_POLICIES)
        if "schedule_conservativeness" in options:
            value = options["schedule_conservativeness"]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
                raise ValueError(f"sglang option schedule_conservativeness must be a positive number, got {value!r}")
            parsed.schedule_conservativeness = float(value)
        return parsed

    def server_args(self) -> Any:
        """SGLang's ServerArgs for these options on the CPU (what its scheduler code reads through
        sglang.srt.runtime_context), for SGLang's "dummy" model path: no checkpoint is resolved,
        no worker reads one."""
        from engine.sglang_core.imports import sglang_classes

        return sglang_classes().ServerArgs(
            model_path="dummy", device="cpu", page_size=self.page_size, schedule_policy=self.schedule_policy,
            chunked_prefill_size=self.chunked_prefill_size, max_prefill_tokens=self.max_prefill_tokens,
            radix_eviction_policy=self.radix_eviction_policy, schedule_conservativeness=self.schedule_conservativeness)


def _integer(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"sglang option {name} must be an integer, got {value!r}")
    return value


def _choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"sglang option {name} must be one of {', '.join(choices)}, got {value!r}")
    return value
