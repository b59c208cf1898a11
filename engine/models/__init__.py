"""Model implementations over the paged KV cache (vLLM v0 `vllm/model_executor/models/`).

`engine.model_loader.load_model` picks one by the checkpoint's `model_type` (vLLM's `_MODELS`
registry): GPT-2 (`gpt2.py`), and Llama with its Mistral, Ministral, Qwen2 and Qwen3 variants
(`llama.py`, grouped-query attention, sliding-window layers). The bundled checkpoint lives in `engine/models/tiny-shakespeare/`.
"""

from engine.models.gpt2 import GPT2, GPT2Config
from engine.models.llama import Llama, LlamaConfig

# model_type -> (model class, config class). Every config has num_layers, num_heads, num_kv_heads,
# head_dim, max_model_len and vocab_size; engine.model_source.SUPPORTED_MODEL_TYPES lists the keys
# for the checks that run without torch.
MODEL_REGISTRY = {"gpt2": (GPT2, GPT2Config), "llama": (Llama, LlamaConfig), "mistral": (Llama, LlamaConfig),
                  "ministral": (Llama, LlamaConfig), "qwen2": (Llama, LlamaConfig), "qwen3": (Llama, LlamaConfig)}

__all__ = ["GPT2", "GPT2Config", "Llama", "LlamaConfig", "MODEL_REGISTRY"]
