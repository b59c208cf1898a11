"""Read a Llama / Qwen2 / Qwen3 GGUF file (llama.cpp's format) into our Llama: the config from
its metadata, the weights dequantized to the engine's dtype under Hugging Face names.

References: the `gguf` package's `GGUFReader` and `gguf.quants.dequantize` (pure Python + numpy),
llama.cpp `convert_hf_to_gguf.py` (`LlamaModel.permute`, the tensor names in
`gguf/tensor_mapping.py`), transformers `integrations/ggml.py` + `modeling_gguf_pytorch_utils.py`
(the reverse mapping it applies for `from_pretrained(..., gguf_file=...)`).

One detail matters for parity: llama.cpp rotates query and key pairs that sit next to each other
(GPT-J style), Hugging Face rotates the two halves of each head (rotate-half). The conversion of a
`llama` model therefore permutes the rows of attn_q and attn_k within every head; `unpermute`
undoes it. Qwen2 and Qwen3 are converted without the permutation (llama.cpp runs them NEOX style).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import torch

from engine.models.llama import LlamaConfig

# GGUF tensor name (after blk.N.) -> Hugging Face name (after model.layers.N.)
_LAYER_TENSORS = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GLOBAL_TENSORS = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}
_LAYER_NAME = re.compile(r"blk\.(\d+)\.(\w+)\.(weight|bias)$")


class GGUFError(ValueError):
    """A GGUF file this loader cannot run; str() is one line."""


def hf_name(gguf_name: str) -> str | None:
    """'blk.3.attn_q.weight' -> 'model.layers.3.self_attn.q_proj.weight'; None for a tensor we do not use."""
    match = _LAYER_NAME.match(gguf_name)
    if match:
        layer, kind, param = match.groups()
        return f"model.layers.{layer}.{_LAYER_TENSORS[kind]}.{param}" if kind in _LAYER_TENSORS else None
    base, _, param = gguf_name.rpartition(".")
    return f"{_GLOBAL_TENSORS[base]}.{param}" if base in _GLOBAL_TENSORS else None


def unpermute(weight: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo llama.cpp's `LlamaModel.permute` on a q or k projection (out, in): within each head
    the rows were reordered from [first half, second half] to interleaved pairs."""
    out, rest = weight.shape[0], weight.shape[1:]
    # (num_heads, head_dim // 2, 2, ...) -> (num_heads, 2, head_dim // 2, ...)
    return weight.reshape(num_heads, out // num_heads // 2, 2, *rest).transpose(1, 2).reshape(weight.shape)


def field(reader, key: str, default=None):
    """A metadata value of the file (str, number or list), or `default` when it is absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_config(reader) -> LlamaConfig:
    """Our LlamaConfig from the file's metadata (`{arch}.block_count`, `.attention.head_count` ...)."""
    arch = field(reader, "general.architecture")
    if arch not in ("llama", "qwen2", "qwen3"):
        raise GGUFError(f"GGUF architecture {arch!r} is not supported: blockviz runs llama, qwen2 and qwen3 GGUF files")

    def need(key: str):
        value = field(reader, f"{arch}.{key}")
        if value is None:
            raise GGUFError(f"GGUF metadata lacks {arch}.{key}")
        return value

    if field(reader, f"{arch}.rope.scaling.type", "none") not in ("none", "linear") or \
            field(reader, f"{arch}.rope.scaling.factor", 1.0) != 1.0:
        raise GGUFError("GGUF files with RoPE scaling are not supported")
    names = {t.name for t in reader.tensors}
    vocab = field(reader, f"{arch}.vocab_size") or len(field(reader, "tokenizer.ggml.tokens", []))
    return LlamaConfig(
        model_type=arch,
        vocab_size=int(vocab),
        hidden_size=int(need("embedding_length")),
        intermediate_size=int(need("feed_forward_length")),
        num_hidden_layers=int(need("block_count")),
        num_attention_heads=int(need("attention.head_count")),
        num_key_value_heads=int(field(reader, f"{arch}.attention.head_count_kv") or need("attention.head_count")),
        max_position_embeddings=int(need("context_length")),
        head_dim=field(reader, f"{arch}.attention.key_length"),
        rms_norm_eps=float(need("attention.layer_norm_rms_epsilon")),
        rope_theta=float(field(reader, f"{arch}.rope.freq_base", 10000.0)),
        attention_bias="blk.0.attn_output.bias" in names,
        tie_word_embeddings="output.weight" not in names,
    )


def read_state_dict(reader, config: LlamaConfig, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    """Every tensor dequantized (`gguf.quants.dequantize`) to `dtype`, under its HF name, with
    q and k rows put back in rotate-half order for a llama file."""
    from gguf.quants import dequantize

    state_dict = {}
    for tensor in reader.tensors:
        name = hf_name(tensor.name)
        if name is None:
            continue
        shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dimensions innermost first
        array = dequantize(tensor.data, tensor.tensor_type)
        weight = torch.from_numpy(np.array(array, dtype=np.float32)).reshape(shape)  # a copy: the file is mapped read-only
        if config.model_type == "llama" and name.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in name else config.num_key_value_heads
            weight = unpermute(weight, heads)
        state_dict[name] = weight.to(dtype)
    return state_dict


def load_gguf(path: str | Path, dtype: torch.dtype) -> tuple[LlamaConfig, dict[str, torch.Tensor], dict]:
    """(config, HF-named state dict in `dtype`, tokenizer facts: bos/eos ids and chat template)
    of a GGUF file. A file that is not GGUF, or lacks what a Llama needs, is a GGUFError."""
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except (ValueError, OSError) as exc:
        raise GGUFError(f"{path} is not a readable GGUF file: {str(exc).splitlines()[0] if str(exc) else exc}") from exc
    config = read_config(reader)
    state_dict = read_state_dict(reader, config, dtype)
    tokenizer_facts = {
        "bos_token_id": field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": field(reader, "tokenizer.ggml.eos_token_id"),
        "chat_template": field(reader, "tokenizer.chat_template"),
    }
    return config, state_dict, tokenizer_facts
