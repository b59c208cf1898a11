"""EngineConfig: every option an engine is built from, in one place (nano-vllm's `Config`, vLLM's
`EngineArgs`). `LLM(model, **options)`, the CLI's engine options and a live run's EngineSpec are all
made from it. Plain Python: the UI process imports it without torch.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields

from engine.model_source import DEFAULT_MODEL

MiB = 1 << 20
DEFAULT_SWAP_SPACE_BYTES = 64 * MiB  # CPU swap pool size unless num_cpu_blocks is given
DTYPES = ("float32", "float16", "bfloat16")
ATTENTION_BACKENDS = ("torch", "triton")  # engine/attention.py, engine/kernels


class PreemptionMode(str, enum.Enum):
    """How the scheduler frees blocks when a decode step runs out (vLLM v0's PreemptionMode):
    SWAP moves the victim's blocks to the CPU pool, RECOMPUTE frees them and computes again later.
    None in a config means vLLM's rule: recompute a lone sequence, swap a group."""

    SWAP = "swap"
    RECOMPUTE = "recompute"


@dataclass(slots=True)
class EngineConfig:
    """Everything needed to build an engine; validated on construction (a ValueError names the
    option). Pool sizes left None come from the memory budget, as vLLM sizes them."""

    model: str = DEFAULT_MODEL
    block_size: int = 16
    num_gpu_blocks: int | None = None
    num_cpu_blocks: int | None = None
    kv_cache_memory_bytes: int | None = None
    swap_space_bytes: int = DEFAULT_SWAP_SPACE_BYTES
    gpu_memory_utilization: float = 0.9
    enable_prefix_caching: bool = False
    preemption_mode: PreemptionMode | None = None
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    watermark: float = 0.01
    kv_digests: bool = True
    attention_backend: str | None = None  # None: triton on CUDA when it imports, else torch (engine/kernels)
    raw_prompt: bool = False  # True: an instruct model's string prompts skip its chat template

    def __post_init__(self) -> None:
        if not isinstance(self.block_size, int) or self.block_size < 1:
            raise ValueError(f"block_size must be a positive integer, got {self.block_size!r}")
        if self.num_gpu_blocks is not None and self.num_gpu_blocks < 1:
            raise ValueError(f"num_gpu_blocks must be >= 1, got {self.num_gpu_blocks}")
        if self.num_cpu_blocks is not None and self.num_cpu_blocks < 0:
            raise ValueError(f"num_cpu_blocks must be >= 0, got {self.num_cpu_blocks}")
        if self.preemption_mode is not None:
            try:
                self.preemption_mode = PreemptionMode(self.preemption_mode)
            except ValueError:
                raise ValueError(f"preemption_mode must be 'swap', 'recompute' or None, "
                                 f"got {self.preemption_mode!r}") from None
        if self.dtype is not None and self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {self.dtype!r}")
        if self.attention_backend is not None and self.attention_backend not in ATTENTION_BACKENDS:
            raise ValueError(f"attention_backend must be one of {', '.join(ATTENTION_BACKENDS)} or None, "
                             f"got {self.attention_backend!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.watermark < 0:
            raise ValueError(f"watermark must be >= 0, got {self.watermark}")

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def defaults(cls) -> dict:
        """Each option's default (what the CLI starts from)."""
        return {f.name: f.default for f in fields(cls)}
