"""Errors the CLI reports as one line with exit code 2, in the words the user typed: the engine's
option names (`vllm_options`, `kv_manager 'vllm'`) read as the flags that set them, and a near miss
of a name (an option's value, a model, a trace) answered with "did you mean" (difflib)."""

from __future__ import annotations

import difflib
import re


class UsageError(Exception):
    """A user mistake: printed as one line, exit code 2."""


# Engine option names (engine/config.py's EngineConfig, LLM's keywords) -> the flag a user types.
FLAGS = {
    "vllm_options": "--vllm-option", "sglang_options": "--sglang-option", "kv_manager": "--kv-manager", "num_gpu_blocks": "--num-gpu-blocks",
    "num_cpu_blocks": "--num-cpu-blocks", "block_size": "--block-size", "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens", "preemption_mode": "--preemption-mode",
    "enable_prefix_caching": "--prefix-caching",
    "attention_backend": "--attention-backend", "async_scheduling": "--async-scheduling",
}
# Whole sentences whose grammar changes with the flag (a plural option name, a singular flag).
SENTENCES = {"vllm_options apply to": "--vllm-option applies to", "sglang_options apply to": "--sglang-option applies to"}


def in_flags(message: str) -> str:
    """`message` with the engine's option names written as the command line's flags:
    "vllm_options apply to kv_manager 'vllm' only" -> "--vllm-option applies to --kv-manager vllm only".
    A message about a file's line (a trace's "line 1: header field 'block_size' ...") names the
    file's fields, not flags: it stays as it is."""
    if re.search(r"\bline \d+\b", message):
        return message
    for api, words in SENTENCES.items():
        message = message.replace(api, words)
    message = re.sub(r"\b(kv_manager|preemption_mode|attention_backend) '([\w:.-]+)'",
                     lambda m: f"{FLAGS[m.group(1)]} {m.group(2)}", message)
    return re.sub(r"(?<![\w-])(" + "|".join(FLAGS) + r")(?![\w=])", lambda m: FLAGS[m.group(1)], message)


def did_you_mean(word: str, candidates) -> str:
    """" (did you mean 'x'?)" for the candidate closest to `word`, or "" when none is close."""
    close = difflib.get_close_matches(word, list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


def near_model(model: object, message: str) -> str:
    """"did you mean" for a --model the engine could not find (`message` names it) that is close to a
    model blockviz has; "" otherwise."""
    if not isinstance(model, str) or f"model {model!r}" not in message:
        return ""
    from blockviz.model.design import TINY_HYBRID
    from engine.model_source import DEFAULT_MODEL, SMOLLM2

    return did_you_mean(model, (DEFAULT_MODEL, SMOLLM2, TINY_HYBRID))
