"""Turn a step's logits into tokens: greedy, temperature, top-k, top-p, per-sequence seeded
generators (vLLM's Sampler, reduced to what this engine runs)."""

from __future__ import annotations

import torch

from engine.sequence import SamplingParams


def make_generator(seed: int, branch: int) -> torch.Generator:
    """A CPU generator per sequence so each branch of a request draws its own reproducible tokens."""
    generator = torch.Generator(device="cpu")
    generator.manual_seed((seed * 1_000_003 + branch) % (2**63 - 1))
    return generator


@torch.inference_mode()
def sample(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator | None]
) -> list[int]:
    """logits (num_seqs, vocab) float32 -> one token id per row."""
    if all(p.temperature == 0.0 for p in params):
        return logits.argmax(dim=-1).tolist()
    logits = logits.float().cpu()
    tokens: list[int] = []
    for row, p, generator in zip(logits, params, generators):
        if p.temperature == 0.0:
            tokens.append(int(row.argmax()))
            continue
        row = row / p.temperature  # (vocab,)
        if p.top_k > 0 and p.top_k < row.numel():
            kth = torch.topk(row, p.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if p.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            probs = sorted_logits.softmax(dim=-1)
            cumulative = probs.cumsum(dim=-1)
            drop = cumulative - probs > p.top_p  # keep the smallest set whose mass reaches top_p
            sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
            row = torch.full_like(row, float("-inf")).scatter(0, order, sorted_logits)
        probs = row.softmax(dim=-1)
        tokens.append(int(torch.multinomial(probs, 1, generator=generator)))
    return tokens
