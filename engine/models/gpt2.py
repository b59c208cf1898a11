"""GPT-2 over a paged KV cache: one flattened batch of tokens from many sequences per step.

References: nanoGPT `model.py` (module layout, the Conv1D transpose in `from_pretrained`),
vLLM v0 `vllm/model_executor/models/gpt2.py` (forward over `kv_caches` + attention metadata,
tied `compute_logits`), Hugging Face `transformers/models/gpt2/modeling_gpt2.py` (the numerics
we match: pre-LayerNorm blocks, `gelu_new`, attention scaling options).

Parameter names equal Hugging Face's `GPT2LMHeadModel` state dict (`transformer.h.0.attn.c_attn`
...), so loading is a 1:1 copy except that HF's Conv1D weights are (in, out) and ours are
nn.Linear's (out, in).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, paged_attention
from engine.models.weights import build_empty, copy_hf_weights
from engine.kernels.lm_head import lm_head_logits

KVCache = tuple[torch.Tensor, torch.Tensor]

_ACTIVATIONS = {
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_fast": lambda x: F.gelu(x, approximate="tanh"),
    "gelu": F.gelu,
    "relu": F.relu,
    "silu": F.silu,
    "swish": F.silu,
}
_CONV1D_WEIGHTS = (".attn.c_attn.weight", ".attn.c_proj.weight", ".mlp.c_fc.weight", ".mlp.c_proj.weight")
_IGNORED_SUFFIXES = (".attn.bias", ".attn.masked_bias")  # old checkpoints' causal-mask buffers


@dataclass(slots=True)
class GPT2Config:
    """The GPT-2 hyperparameters the forward needs (a validated subset of HF's GPT2Config)."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int | None = None  # MLP width; None means 4 * n_embd
    layer_norm_epsilon: float = 1e-5
    activation_function: str = "gelu_new"
    scale_attn_weights: bool = True
    scale_attn_by_inverse_layer_idx: bool = False
    tie_word_embeddings: bool = True

    def __post_init__(self) -> None:
        for name in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.n_embd % self.n_head:
            raise ValueError(f"n_embd ({self.n_embd}) must be divisible by n_head ({self.n_head})")
        if self.n_inner is None:
            self.n_inner = 4 * self.n_embd
        if self.activation_function not in _ACTIVATIONS:
            raise ValueError(
                f"unsupported activation_function {self.activation_function!r}; "
                f"supported: {', '.join(sorted(_ACTIVATIONS))}"
            )

    @classmethod
    def from_hf(cls, hf_config) -> GPT2Config:
        """From a transformers config; any model_type other than 'gpt2' is a ValueError."""
        model_type = getattr(hf_config, "model_type", None)
        if model_type != "gpt2":
            raise ValueError(f"only GPT-2 checkpoints are supported, got model_type {model_type!r}")
        if getattr(hf_config, "add_cross_attention", False):
            raise ValueError("GPT-2 checkpoints with cross-attention are not supported")
        return cls(
            vocab_size=hf_config.vocab_size,
            n_positions=hf_config.n_positions,
            n_embd=hf_config.n_embd,
            n_layer=hf_config.n_layer,
            n_head=hf_config.n_head,
            n_inner=hf_config.n_inner,
            layer_norm_epsilon=hf_config.layer_norm_epsilon,
            activation_function=hf_config.activation_function,
            scale_attn_weights=hf_config.scale_attn_weights,
            scale_attn_by_inverse_layer_idx=hf_config.scale_attn_by_inverse_layer_idx,
            tie_word_embeddings=getattr(hf_config, "tie_word_embeddings", True),
        )

    @property
    def num_layers(self) -> int:
        return self.n_layer

    @property
    def num_heads(self) -> int:
        return self.n_head

    @property
    def num_kv_heads(self) -> int:
        return self.n_head  # multi-head attention: every query head has its own K/V head

    @property
    def model_type(self) -> str:
        return "gpt2"

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head

    @property
    def max_model_len(self) -> int:
        return self.n_positions


class CausalSelfAttention(nn.Module):
    """Fused-QKV multi-head attention whose K/V live in a paged cache (vLLM `GPT2Attention`)."""

    def __init__(self, config: GPT2Config, layer_idx: int):
        super().__init__()
        self.n_head = config.n_head
        self.head_dim = config.head_dim
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd)
        self.scale = self.head_dim**-0.5 if config.scale_attn_weights else 1.0
        if config.scale_attn_by_inverse_layer_idx:
            self.scale /= layer_idx + 1

    def forward(self, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        num_tokens, n_embd = x.shape
        qkv = self.c_attn(x).view(num_tokens, 3, self.n_head, self.head_dim)
        q, k, v = qkv.unbind(1)  # each (num_tokens, num_heads, head_dim)
        k_cache, v_cache = kv_cache
        y = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale)  # (num_tokens, num_heads, head_dim)
        return self.c_proj(y.reshape(num_tokens, n_embd))


class MLP(nn.Module):
    """GPT-2's feed-forward: n_embd -> n_inner -> n_embd with gelu_new (HF `GPT2MLP`)."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, config.n_inner)
        self.c_proj = nn.Linear(config.n_inner, config.n_embd)
        self.act = _ACTIVATIONS[config.activation_function]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))  # (num_tokens, n_embd)


class Block(nn.Module):
    """Pre-LayerNorm transformer block (HF `GPT2Block`)."""

    def __init__(self, config: GPT2Config, layer_idx: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.attn = CausalSelfAttention(config, layer_idx)
        self.ln_2 = nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x), kv_cache, meta)
        return x + self.mlp(self.ln_2(x))  # (num_tokens, n_embd)


class GPT2(nn.Module):
    """GPT-2 language model over a paged KV cache (vLLM v0 `GPT2LMHeadModel`)."""

    def __init__(self, config: GPT2Config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(
            dict(
                wte=nn.Embedding(config.vocab_size, config.n_embd),
                wpe=nn.Embedding(config.n_positions, config.n_embd),
                h=nn.ModuleList(Block(config, i) for i in range(config.n_layer)),
                ln_f=nn.LayerNorm(config.n_embd, eps=config.layer_norm_epsilon),
            )
        )
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.n_embd, config.vocab_size, bias=False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[KVCache] | None,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """One step: input_ids and positions (num_tokens,) -> final hidden states (num_tokens, n_embd).

        kv_caches holds one (k_cache, v_cache) pair per layer, each (num_blocks, block_size,
        num_heads, head_dim); the new tokens' K/V are written at `meta.slot_mapping`.
        kv_caches=None runs without a cache (memory profiling; prefill-from-scratch only).
        """
        if max(meta.context_lens) > self.config.n_positions:
            raise ValueError(
                f"context of {max(meta.context_lens)} tokens exceeds the model's "
                f"n_positions={self.config.n_positions}"
            )
        if kv_caches is None:
            kv_caches = [(None, None)] * self.config.n_layer
        wte, wpe = self.transformer.wte, self.transformer.wpe
        x = wte(input_ids) + wpe(positions)  # (num_tokens, n_embd)
        for block, kv_cache in zip(self.transformer.h, kv_caches, strict=True):
            x = block(x, kv_cache, meta)
        return self.transformer.ln_f(x)  # (num_tokens, n_embd)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, n_embd) -> float32 logits (n, vocab_size) through the (tied) LM head."""
        weight = self.transformer.wte.weight if self.lm_head is None else self.lm_head.weight
        return lm_head_logits(hidden, weight).float()  # F.linear(hidden, weight), chunked on the CPU

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy weights from a transformers `GPT2LMHeadModel` state dict (nanoGPT `from_pretrained`).

        Conv1D weights are transposed into nn.Linear layout; dtype and device follow this module.
        """
        copy_hf_weights(self, state_dict, "GPT-2", transform=lambda name, t: t.t() if name.endswith(_CONV1D_WEIGHTS) else t,
                        ignored=lambda name: name.endswith(_IGNORED_SUFFIXES))

    @classmethod
    def from_config(cls, config: GPT2Config, state_dict: Mapping[str, torch.Tensor],
                    device: torch.device | str, dtype: torch.dtype) -> GPT2:
        """A model built straight on `device` in `dtype` with the weights of `state_dict` (a
        GPT2LMHeadModel's names and layout)."""
        model = build_empty(cls, config, device, dtype)
        model.load_hf_state_dict(state_dict)
        return model.eval()

    @classmethod
    def from_hf(cls, hf_model, device: torch.device | str | None = None) -> GPT2:
        """A GPT2 with the config, weights and dtype of a transformers GPT2LMHeadModel, on
        `device` (default: the HF model's device); weights are copied straight there."""
        weight = hf_model.transformer.wte.weight
        return cls.from_config(GPT2Config.from_hf(hf_model.config), hf_model.state_dict(),
                               device if device is not None else weight.device, weight.dtype)
