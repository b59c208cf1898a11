"""Model implementations over the paged KV cache (vLLM v0 `vllm/model_executor/models/`).

Only GPT-2 for now; `engine.model_loader.load_model` picks it for any `model_type == "gpt2"`
checkpoint. The bundled checkpoint lives in `engine/models/tiny-shakespeare/`.
"""

from engine.models.gpt2 import GPT2, GPT2Config

__all__ = ["GPT2", "GPT2Config"]
