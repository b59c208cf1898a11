"""ModelRunner: one step's forward pass, from scheduled sequences to sampled tokens (vLLM v0
`ModelRunner`: _prepare_prompt / _prepare_decode, execute_model; nano-vllm's `ModelRunner`:
prepare_prefill / prepare_decode, run_model, sampler).

A prefill feeds each sequence's tokens that the prefix cache did not serve (at least its last);
a decode feeds each sequence's newest token. Either way the attention metadata says where every
new token's K/V goes and which blocks each sequence attends over (engine/attention.py).
"""

from __future__ import annotations

import torch

from engine.attention import AttentionMetadata
from engine.block_manager import BlockSpaceManager
from engine.cache_engine import CacheEngine
from engine.kernels import resolve_attention_backend
from engine.models.gpt2 import GPT2
from engine.sampler import sample
from engine.sequence import SamplingParams, Sequence


class ModelRunner:
    """Runs the model over one step's sequences against the paged KV cache, and samples."""

    def __init__(self, model: GPT2, cache_engine: CacheEngine, block_manager: BlockSpaceManager,
                 block_size: int, device: torch.device, attention_backend: str | None = None) -> None:
        self.model = model
        self.cache_engine = cache_engine
        self.block_manager = block_manager
        self.block_size = block_size
        self.device = device
        # "torch" or "triton" (engine/kernels); None picks the device's default; ValueError if it cannot run here
        self.attention_backend = resolve_attention_backend(attention_backend, device)

    def prepare_inputs(self, seqs: list[Sequence], is_prefill: bool,
                       num_new_tokens: list[int] | None = None) -> tuple[torch.Tensor, AttentionMetadata]:
        """The step's new tokens flattened, sequence after sequence, and their attention metadata.
        `num_new_tokens` (v1) gives each sequence's tokens after its computed ones (vLLM v1
        GPUModelRunner._prepare_inputs); without it a prefill feeds what the cache did not serve
        and a decode the newest token (v0)."""
        input_ids: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        for i, seq in enumerate(seqs):
            length = seq.get_len()
            if num_new_tokens is not None:
                start, length = seq.num_computed_tokens, seq.num_computed_tokens + num_new_tokens[i]
                input_ids.extend(seq.get_token_ids()[start:length])
                query_lens.append(length - start)
            elif is_prefill:
                start = min(seq.num_cached_tokens, length - 1)
                input_ids.extend(seq.get_token_ids()[start:])
                query_lens.append(length - start)
            else:
                input_ids.append(seq.get_last_token_id())
                query_lens.append(1)
            context_lens.append(length)
        tables = [self.block_manager.get_block_table(seq) for seq in seqs]
        meta = AttentionMetadata.build(tables, query_lens, context_lens, self.block_size, self.device,
                                       self.attention_backend)
        tokens = torch.tensor(input_ids, dtype=torch.int64, device=self.device)  # (num_tokens,)
        return tokens, meta

    def execute_model(self, seqs: list[Sequence], is_prefill: bool,
                      num_new_tokens: list[int] | None = None) -> torch.Tensor:
        """Write the step's K/V into the cache and return each sequence's next-token logits,
        (num_seqs, vocab)."""
        tokens, meta = self.prepare_inputs(seqs, is_prefill, num_new_tokens)
        hidden = self.model(tokens, meta.positions, self.cache_engine.gpu_cache, meta)  # (num_tokens, n_embd)
        return self.model.compute_logits(hidden[meta.last_token_indices])  # (num_seqs, vocab)

    @staticmethod
    def sample(logits: torch.Tensor, seqs: list[Sequence], params: list[SamplingParams]) -> list[int]:
        """One token per row of `logits`, each drawn with its sequence's own generator."""
        return sample(logits, params, [seq.generator for seq in seqs])
