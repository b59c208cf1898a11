""""tiny-hybrid": a tiny Llama-family checkpoint whose layers mix full and sliding-window attention,
built on this machine from the bundled tokenizer, offline, in well under a second.

Its weights are random (a seeded NumPy generator), so the text it writes is noise; the memory it
takes is real: the engine runs it as vLLM runs a hybrid model (Gemma 2 / 3, gpt-oss, Qwen with
`layer_types`), one block table per KV-cache group (vLLM vllm/v1/core/kv_cache_utils.py groups the
layers by spec; vllm/v1/core/single_type_kv_cache_manager.py's SlidingWindowManager frees the blocks
that fall out of the window). It is what `blockviz run --model tiny-hybrid` plays its story on
(blockviz/session/scenario.py, "story-hybrid").

The layers alternate sliding_attention / full_attention (transformers' `layer_types`), with a window
of `SLIDING_WINDOW` tokens: two blocks of 4, so the window slides within a short request. The
checkpoint is written once into the user's cache directory (`$BLOCKVIZ_CACHE_DIR`, else
`$XDG_CACHE_HOME/blockviz`, else `~/.cache/blockviz`) and reused; its files are the same bytes on
every machine. No torch, no transformers: NumPy, safetensors and the bundled tokenizer files.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

from blockviz.model.design import TINY_HYBRID  # noqa: F401 (the name, as the views know it)

SLIDING_WINDOW = 8  # tokens a sliding layer attends to, its own included
LAYER_TYPES = ("sliding_attention", "full_attention", "sliding_attention", "full_attention")
# transformers' LlamaConfig fields (a checkpoint engine/models/llama.py loads); small enough to
# build in a blink, the K/V geometry of a real GQA model (2 KV heads under 4 query heads).
CONFIG = {
    "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": len(LAYER_TYPES), "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
    "max_position_embeddings": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "initializer_range": 0.02,
    "layer_types": list(LAYER_TYPES), "sliding_window": SLIDING_WINDOW, "dtype": "float32",
    "bos_token_id": 0, "eos_token_id": 0,
}
VERSION = 1  # bump when CONFIG or the weights change: a new directory is built
SEED = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")


def cache_dir() -> Path:
    """Where blockviz keeps what it builds: $BLOCKVIZ_CACHE_DIR, else $XDG_CACHE_HOME/blockviz, else
    ~/.cache/blockviz."""
    if os.environ.get("BLOCKVIZ_CACHE_DIR"):
        return Path(os.environ["BLOCKVIZ_CACHE_DIR"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "blockviz"


def tiny_hybrid_checkpoint(root: Path | None = None, progress=None) -> Path:
    """The tiny-hybrid checkpoint directory under `root` (default `cache_dir()`), built on first
    use (one progress line to stderr, or to `progress(text)`). Raises OSError when it cannot be written."""
    path = (root or cache_dir()) / f"{TINY_HYBRID}-v{VERSION}"
    if (path / "model.safetensors").is_file():
        return path
    say = progress or (lambda text: print(text, file=sys.stderr, flush=True))
    say(f"blockviz: building the {TINY_HYBRID} checkpoint (random weights) in {path}")
    from engine.model_source import BUNDLED_MODELS_DIR, DEFAULT_MODEL

    tokenizer_dir = BUNDLED_MODELS_DIR / DEFAULT_MODEL
    vocab_size = json.loads((tokenizer_dir / "config.json").read_text())["vocab_size"]
    staging = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(tokenizer_dir / name, staging / name)
    config = {**CONFIG, "vocab_size": vocab_size}
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    (staging / "generation_config.json").write_text(json.dumps({"bos_token_id": 0, "eos_token_id": 0}) + "\n")
    from safetensors.numpy import save_file

    save_file(random_weights(config), str(staging / "model.safetensors"))
    try:
        staging.rename(path)  # another process may have built it meanwhile: keep theirs
    except OSError:
        shutil.rmtree(staging, ignore_errors=True)
        if not (path / "model.safetensors").is_file():
            raise
    return path


def random_weights(config: dict) -> dict:
    """Transformers' LlamaForCausalLM weights by name, drawn from one seeded NumPy generator
    (normal, std `initializer_range`; the RMSNorm weights ones), in a fixed order: the same
    arrays on every machine. The embedding is tied to the LM head (no lm_head.weight)."""
    import numpy as np

    rng = np.random.default_rng(SEED)
    hidden, inner, head_dim = config["hidden_size"], config["intermediate_size"], config["head_dim"]
    q_size = config["num_attention_heads"] * head_dim
    kv_size = config["num_key_value_heads"] * head_dim

    def normal(*shape: int):
        return (rng.standard_normal(shape) * config["initializer_range"]).astype(np.float32)

    weights = {"model.embed_tokens.weight": normal(config["vocab_size"], hidden)}
    for i in range(config["num_hidden_layers"]):
        layer = f"model.layers.{i}"
        weights[f"{layer}.self_attn.q_proj.weight"] = normal(q_size, hidden)
        weights[f"{layer}.self_attn.k_proj.weight"] = normal(kv_size, hidden)
        weights[f"{layer}.self_attn.v_proj.weight"] = normal(kv_size, hidden)
        weights[f"{layer}.self_attn.o_proj.weight"] = normal(hidden, q_size)
        weights[f"{layer}.mlp.gate_proj.weight"] = normal(inner, hidden)
        weights[f"{layer}.mlp.up_proj.weight"] = normal(inner, hidden)
        weights[f"{layer}.mlp.down_proj.weight"] = normal(hidden, inner)
        weights[f"{layer}.input_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
        weights[f"{layer}.post_attention_layernorm.weight"] = np.ones(hidden, dtype=np.float32)
    weights["model.norm.weight"] = np.ones(hidden, dtype=np.float32)
    return weights


def resolve(name, kv_manager: str | None = None):
    """A model name as the engine takes it: "tiny-hybrid" becomes its checkpoint directory (built
    on first use), any other name is returned as it is. A ValueError (one line, the engine's own:
    engine.model_source.check_kv_manager) when `kv_manager` cannot run tiny-hybrid (v0), before
    anything is built."""
    if name != TINY_HYBRID:
        return name
    from engine.model_source import check_kv_manager

    check_kv_manager(kv_manager, LAYER_TYPES)
    return str(tiny_hybrid_checkpoint())
