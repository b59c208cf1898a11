"""What generate() returns (vLLM's RequestOutput / CompletionOutput)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class CompletionOutput:
    """One sequence of a request: its generated text and token ids, and why it stopped."""

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    finish_detail: str = ""


@dataclass(slots=True)
class RequestOutput:
    """A request's prompt and its n completions (in branch order)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    finished: bool = False
    num_cached_tokens: int = 0
