"""The LM head's logits, with a CPU fast path: the vocabulary in chunks.

Reference: `F.linear(hidden, weight)` (vLLM `LogitsProcessor._get_logits`, nano-vllm
`ParallelLMHead.compute_logits`), what `lm_head_logits` returns everywhere but the CPU. On the
CPU one matmul against the whole (vocab, hidden) weight is a skinny GEMM whose (n, vocab) result
is larger than the caches; computing it a chunk of vocabulary rows at a time keeps each partial
result in cache while it is written out. Each logit is the same dot product over hidden_size
either way, equal to F.linear's up to float32 rounding (tests/test_kernels.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

VOCAB_CHUNK = 2048  # vocabulary rows per matmul on the CPU


def lm_head_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """(n, hidden_size) hidden states -> (n, vocab) logits against the LM head's (vocab,
    hidden_size) weight: `F.linear(hidden, weight)`, by `chunked_lm_head` on the CPU."""
    if hidden.device.type != "cpu" or weight.shape[0] <= VOCAB_CHUNK:
        return F.linear(hidden, weight)
    return chunked_lm_head(hidden, weight)


def chunked_lm_head(hidden: torch.Tensor, weight: torch.Tensor, chunk: int = VOCAB_CHUNK) -> torch.Tensor:
    """F.linear(hidden, weight), `chunk` vocabulary rows at a time."""
    logits = hidden.new_empty(hidden.shape[0], weight.shape[0])  # (n, vocab)
    for start in range(0, weight.shape[0], chunk):
        logits[:, start : start + chunk] = torch.mm(hidden, weight[start : start + chunk].t())
    return logits
