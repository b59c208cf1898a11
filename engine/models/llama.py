"""Llama, Mistral, Qwen2 and Qwen3 over a paged KV cache with grouped-query attention and
sliding-window layers.

References: Hugging Face `transformers/models/llama/modeling_llama.py` (the numerics we match:
RMSNorm in float32, rotate-half RoPE, SwiGLU, `repeat_kv`), `qwen2/modeling_qwen2.py` (bias on
q/k/v), `qwen3/modeling_qwen3.py` (per-head RMSNorm on q and k before RoPE, an explicit
head_dim), `mistral/` and `ministral/modeling_*.py` (Llama's layers, every or some of them
sliding); vLLM v0 `vllm/model_executor/models/llama.py` (forward over `kv_caches` + attention
metadata; `layer_types` picks each layer's window); nanoGPT `model.py` (module layout).

Sliding-window layers: transformers' `layer_types` lists "full_attention" or "sliding_attention"
per layer, and a sliding layer's token attends to the last `sliding_window` positions, its own
included (engine.model_source.attention_layer_types reads them as transformers does, Qwen2's
use_sliding_window / max_window_layers and Mistral's all-layers window included). Each layer
passes its window to the attention (`LlamaAttention.sliding_window`); `LlamaConfig.sliding_windows`
lists them, and engine.v1.kv_cache_interface.kv_cache_specs turns them into vLLM's FullAttentionSpec /
SlidingWindowSpec per layer for the block manager, which groups the layers into KV-cache groups of
one block table each (the forward then takes one AttentionMetadata per layer, its group's).

Grouped-query attention: the model has `num_attention_heads` query heads but writes only
`num_key_value_heads` K/V heads to its cache; query head h reads K/V head
h // (num_attention_heads // num_key_value_heads). The KV cache of a layer is therefore
(num_blocks, block_size, num_kv_heads, head_dim), and a block costs
2 x layers x num_kv_heads x head_dim x block_size x dtype bytes.

Parameter names equal Hugging Face's `LlamaForCausalLM` / `Qwen2ForCausalLM` / `Qwen3ForCausalLM`
state dicts (`model.layers.0.self_attn.q_proj.weight` ...), so loading is a 1:1 copy.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from engine.attention import AttentionMetadata, paged_attention
from engine.kernels.lm_head import lm_head_logits
from engine.model_source import attention_layer_types
from engine.models.weights import build_empty, copy_hf_weights

KVCache = tuple[torch.Tensor, torch.Tensor]

MODEL_TYPES = ("llama", "mistral", "ministral", "qwen2", "qwen3")
ROPE_TYPES = ("default", "llama3")


@dataclass(slots=True)
class LlamaConfig:
    """The hyperparameters the forward needs (a validated subset of HF's LlamaConfig, MistralConfig,
    MinistralConfig, Qwen2Config and Qwen3Config). `model_type` picks the variant: qwen2 adds bias
    to q/k/v, qwen3 normalises q and k per head; mistral and ministral are Llama's layers.
    `layer_types` (transformers' name) says which layers attend within `sliding_window`."""

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    max_position_embeddings: int
    head_dim: int | None = None  # None means hidden_size // num_attention_heads
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None  # HF rope_parameters beyond the theta: 'llama3' factors
    attention_bias: bool = False  # bias on q/k/v/o (Llama's option); qwen2 always has q/k/v bias
    mlp_bias: bool = False
    tie_word_embeddings: bool = False
    layer_types: tuple[str, ...] | None = None  # per layer "full_attention" or "sliding_attention"; None: all full
    sliding_window: int | None = None  # the sliding layers' window (positions attended, the query's own included)

    def __post_init__(self) -> None:
        if self.model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {self.model_type!r} is not a Llama variant ({', '.join(MODEL_TYPES)})")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                     "num_attention_heads", "num_key_value_heads", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                             f"num_key_value_heads ({self.num_key_value_heads})")
        if self.head_dim is None:
            if self.hidden_size % self.num_attention_heads:
                raise ValueError(f"hidden_size ({self.hidden_size}) must be divisible by "
                                 f"num_attention_heads ({self.num_attention_heads})")
            self.head_dim = self.hidden_size // self.num_attention_heads
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        rope_type = (self.rope_scaling or {}).get("rope_type", "default")
        if rope_type not in ROPE_TYPES:
            raise ValueError(f"rope_type {rope_type!r} is not supported; supported: {', '.join(ROPE_TYPES)}")
        layout = dict(model_type="llama", num_hidden_layers=self.num_hidden_layers, sliding_window=self.sliding_window,
                      max_position_embeddings=self.max_position_embeddings,
                      layer_types=list(self.layer_types) if self.layer_types is not None else None)
        self.layer_types, self.sliding_window = attention_layer_types(layout.get)

    @classmethod
    def from_hf(cls, hf_config) -> LlamaConfig:
        """From a transformers LlamaConfig, MistralConfig, MinistralConfig, Qwen2Config or
        Qwen3Config (transformers 4 or 5 rope fields), with its layers' windows as
        `attention_layer_types` reads them; activations other than SiLU, layer types other than
        full and sliding attention, and a bad window are ValueErrors."""
        model_type = getattr(hf_config, "model_type", None)
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type {model_type!r} is not a Llama variant ({', '.join(MODEL_TYPES)})")
        if getattr(hf_config, "hidden_act", "silu") != "silu":
            raise ValueError(f"hidden_act {hf_config.hidden_act!r} is not supported (only silu)")
        layer_types, sliding_window = attention_layer_types(lambda name, default: getattr(hf_config, name, default))
        rope = dict(getattr(hf_config, "rope_parameters", None) or getattr(hf_config, "rope_scaling", None) or {})
        theta = rope.pop("rope_theta", None) or getattr(hf_config, "rope_theta", None) or 10000.0
        if "type" in rope and "rope_type" not in rope:  # transformers 4's old spelling
            rope["rope_type"] = rope.pop("type")
        return cls(
            model_type=model_type,
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            intermediate_size=hf_config.intermediate_size,
            num_hidden_layers=hf_config.num_hidden_layers,
            num_attention_heads=hf_config.num_attention_heads,
            num_key_value_heads=getattr(hf_config, "num_key_value_heads", None) or hf_config.num_attention_heads,
            max_position_embeddings=hf_config.max_position_embeddings,
            head_dim=getattr(hf_config, "head_dim", None),
            rms_norm_eps=hf_config.rms_norm_eps,
            rope_theta=float(theta),
            rope_scaling=rope if rope.get("rope_type", "default") != "default" else None,
            attention_bias=bool(getattr(hf_config, "attention_bias", False)),
            mlp_bias=bool(getattr(hf_config, "mlp_bias", False)),
            tie_word_embeddings=bool(getattr(hf_config, "tie_word_embeddings", False)),
            layer_types=layer_types,
            sliding_window=sliding_window,
        )

    # the names the engine reads from every model config (GPT2Config has the same)
    @property
    def num_layers(self) -> int:
        return self.num_hidden_layers

    @property
    def num_heads(self) -> int:
        return self.num_attention_heads

    @property
    def num_kv_heads(self) -> int:
        return self.num_key_value_heads

    @property
    def max_model_len(self) -> int:
        return self.max_position_embeddings

    @property
    def sliding_windows(self) -> tuple[int | None, ...]:
        """Per layer, its window, or None for a full-attention layer (what each layer passes to
        the attention; engine.v1.kv_cache_interface.kv_cache_specs reads it)."""
        return tuple(self.sliding_window if kind == "sliding_attention" else None for kind in self.layer_types)


class RMSNorm(nn.Module):
    """x / rms(x) * weight, computed in float32 (HF `LlamaRMSNorm`)."""

    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


def rope_inv_freq(config: LlamaConfig) -> torch.Tensor:
    """(head_dim // 2,) float32 rotation frequencies (HF `_compute_default_rope_parameters`, and
    `_compute_llama3_parameters` for Llama 3's long-context scaling)."""
    dim = config.head_dim
    inv_freq = 1.0 / (config.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)  # long waves slowed down
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_len / high) & ~(wavelen > old_len / low)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for each token's position, each (num_tokens, 1, head_dim) (HF `LlamaRotaryEmbedding`)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # (num_tokens, head_dim // 2)
    emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]  # (num_tokens, 1, head_dim)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (num_tokens, num_heads, head_dim) by position, rotate-half style (HF `apply_rotary_pos_emb`)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LlamaAttention(nn.Module):
    """Grouped-query attention whose K/V heads live in a paged cache (HF `LlamaAttention`,
    `Qwen2Attention`, `Qwen3Attention`, `MistralAttention`; vLLM `LlamaAttention`). Layer
    `layer_idx` reads the window `config.sliding_windows[layer_idx]` (None: the whole context)."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.sliding_window = config.sliding_windows[layer_idx]
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        qkv_bias = config.attention_bias or config.model_type == "qwen2"
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, config.hidden_size, bias=config.attention_bias)
        if config.model_type == "qwen3":
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        else:
            self.q_norm = self.k_norm = None
        self.scale = self.head_dim**-0.5

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], kv_cache: KVCache,
                meta: AttentionMetadata) -> torch.Tensor:
        num_tokens = x.shape[0]
        q = self.q_proj(x).view(num_tokens, self.num_heads, self.head_dim)
        k = self.k_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        v = self.v_proj(x).view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None:  # Qwen3: RMSNorm over each head before the rotation
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rope(q, *rope), apply_rope(k, *rope)  # K is rotated before it is cached
        k_cache, v_cache = kv_cache
        y = paged_attention(q, k, v, k_cache, v_cache, meta, self.scale, self.sliding_window)  # (num_tokens, num_heads, head_dim)
        return self.o_proj(y.reshape(num_tokens, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x)) (HF `LlamaMLP`)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=config.mlp_bias)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=config.mlp_bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))  # (num_tokens, hidden_size)


class LlamaDecoderLayer(nn.Module):
    """Pre-RMSNorm transformer block (HF `LlamaDecoderLayer`)."""

    def __init__(self, config: LlamaConfig, layer_idx: int):
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.mlp = LlamaMLP(config)

    def forward(self, x: torch.Tensor, rope, kv_cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, kv_cache, meta)
        return x + self.mlp(self.post_attention_layernorm(x))  # (num_tokens, hidden_size)


class Llama(nn.Module):
    """Llama / Mistral / Qwen2 / Qwen3 causal LM over a paged KV cache (vLLM v0 `LlamaForCausalLM`).

    `takes_layer_metadata`: the forward takes one AttentionMetadata per layer, so a model whose
    layers fall into several KV-cache groups (full and sliding-window layers) reads each layer's
    blocks from its group's table (vLLM v1 GPUModelRunner: each layer gets its group's metadata)."""

    takes_layer_metadata = True

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = nn.ModuleDict(
            dict(
                embed_tokens=nn.Embedding(config.vocab_size, config.hidden_size),
                layers=nn.ModuleList(LlamaDecoderLayer(config, i) for i in range(config.num_hidden_layers)),
                norm=RMSNorm(config.hidden_size, config.rms_norm_eps),
            )
        )
        self.lm_head = None if config.tie_word_embeddings else nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.register_buffer("inv_freq", rope_inv_freq(config), persistent=False)

    @torch.inference_mode()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[KVCache] | None,
        meta: AttentionMetadata | Sequence[AttentionMetadata],
    ) -> torch.Tensor:
        """One step: input_ids and positions (num_tokens,) -> final hidden states (num_tokens, hidden_size).

        kv_caches holds one (k_cache, v_cache) pair per layer, each (num_blocks, block_size,
        num_kv_heads, head_dim); the new tokens' rotated K and their V are written at
        `meta.slot_mapping`. kv_caches=None runs without a cache (prefill-from-scratch only).
        `meta` is one metadata for every layer, or one per layer (each its KV-cache group's: the
        same tokens and lengths over that group's block tables).
        """
        num_layers = self.config.num_hidden_layers
        metas = [meta] * num_layers if isinstance(meta, AttentionMetadata) else list(meta)
        if len(metas) != num_layers:
            raise ValueError(f"{len(metas)} attention metadata for a model of {num_layers} layers: give one, "
                             f"or one per layer")
        if max(metas[0].context_lens) > self.config.max_position_embeddings:
            raise ValueError(f"context of {max(metas[0].context_lens)} tokens exceeds the model's "
                             f"max_position_embeddings={self.config.max_position_embeddings}")
        if kv_caches is None:
            kv_caches = [(None, None)] * num_layers
        x = self.model.embed_tokens(input_ids)  # (num_tokens, hidden_size)
        rope = rope_cos_sin(self.inv_freq, positions, x.dtype)  # one pair for every layer
        for layer, kv_cache, layer_meta in zip(self.model.layers, kv_caches, metas, strict=True):
            x = layer(x, rope, kv_cache, layer_meta)
        return self.model.norm(x)  # (num_tokens, hidden_size)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """(n, hidden_size) -> float32 logits (n, vocab_size) through the (tied or own) LM head."""
        weight = self.model.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return lm_head_logits(hidden, weight).float()  # F.linear(hidden, weight), chunked on the CPU

    def load_hf_state_dict(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Copy weights from a transformers `*ForCausalLM` state dict (same names); dtype and
        device follow this module."""
        copy_hf_weights(self, state_dict, self.config.model_type, ignored=lambda name: name.endswith("rotary_emb.inv_freq"))

    @classmethod
    def from_config(cls, config: LlamaConfig, state_dict: Mapping[str, torch.Tensor],
                    device: torch.device | str, dtype: torch.dtype) -> Llama:
        """A model built straight on `device` in `dtype` with the weights of `state_dict`."""
        model = build_empty(cls, config, device, dtype)
        model.inv_freq = rope_inv_freq(config).to(device)  # float32, as HF keeps it
        model.load_hf_state_dict(state_dict)
        return model.eval()

    @classmethod
    def from_hf(cls, hf_model, device: torch.device | str | None = None) -> Llama:
        """A Llama with the config, weights and dtype of a transformers Llama/Mistral/Qwen2/Qwen3ForCausalLM,
        on `device` (default: the HF model's device)."""
        weight = hf_model.model.embed_tokens.weight
        return cls.from_config(LlamaConfig.from_hf(hf_model.config), hf_model.state_dict(),
                               device if device is not None else weight.device, weight.dtype)
