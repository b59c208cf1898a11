"""EngineConfig: every option an engine is built from, in one place (nano-vllm's `Config`, vLLM's
`EngineArgs`). `LLM(model, **options)`, the CLI's engine options and a live run's EngineSpec are all
made from it. Plain Python: the UI process imports it without torch.
"""

from __future__ import annotations

import enum
import importlib.util
from dataclasses import dataclass, fields

from engine.designs import DEFAULT, DESIGNS, VLLM_INSTALL, Design, get_design  # noqa: F401 (VLLM_INSTALL re-exported)
from engine.model_source import DEFAULT_MODEL

MiB = 1 << 20
DEFAULT_SWAP_SPACE_BYTES = 64 * MiB  # CPU swap pool size unless num_cpu_blocks is given
DTYPES = ("float32", "float16", "bfloat16")
KV_MANAGERS = tuple(DESIGNS)  # the designs' names (engine/designs.py), as --kv-manager takes them
HASH_ALGOS = ("sha256", "xxhash", "sha256_cbor", "xxhash_cbor")  # prefix_caching_hash_algo (vLLM's default first)
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
    gpu_memory_utilization: float = 0.92  # vLLM 0.33 CacheConfig's default
    enable_prefix_caching: bool | None = None  # None: off in v0, on in v1 (each as vLLM has it)
    preemption_mode: PreemptionMode | None = None
    device: str | None = None
    dtype: str | None = None
    seed: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int | None = None
    # v1 and vllm: admit a waiting request only when its whole sequence fits the free blocks, not
    # just its first chunk (vLLM 0.33 SchedulerConfig.scheduler_reserve_full_isl, on by default)
    scheduler_reserve_full_isl: bool = True
    # v1 and vllm: schedule the next step while the last one's sampled tokens are in flight (vLLM
    # 0.33's default order, VllmConfig.async_scheduling / --no-async-scheduling); None: the design's
    # default (on where it has the order; vllm's as vLLM resolves it); v0 has no such order
    async_scheduling: bool | None = None
    watermark: float = 0.01
    kv_digests: bool = True
    kv_manager: str = DEFAULT.name  # a design's name (engine/designs.py); an entry is taken as its name
    prefix_caching_hash_algo: str = "sha256"
    attention_backend: str | None = None  # None: triton on CUDA when it imports, else torch (engine/kernels)
    raw_prompt: bool = False  # True: an instruct model's string prompts skip its chat template
    enforce_eager: bool = False  # True: no CUDA graphs for decode steps (engine/cuda_graphs.py; never used off CUDA)
    # kv_manager "vllm": vLLM SchedulerConfig / CacheConfig fields by name (engine/vllm_core/config.py)
    vllm_options: dict | None = None
    # kv_manager "sglang": SGLang server arguments by name (engine/sglang_core/options.py); page_size is block_size
    sglang_options: dict | None = None

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
        if not isinstance(self.enforce_eager, bool):
            raise ValueError(f"enforce_eager must be True or False, got {self.enforce_eager!r}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.watermark < 0:
            raise ValueError(f"watermark must be >= 0, got {self.watermark}")
        design = get_design(self.kv_manager)
        self.kv_manager = design.name
        if design.requires and importlib.util.find_spec(design.requires) is None:
            raise ValueError(design.install)
        if design.check_version is not None:  # another project's own code runs: its release is pinned
            design.check_version()  # another release: one line naming it and the supported one
        if self.sglang_options is not None:
            self._take_page_size(design)
        if self.vllm_options is not None:
            if not design.vllm_options:
                raise ValueError(f"vllm_options apply to kv_manager {', '.join(repr(n) for n, d in DESIGNS.items() if d.vllm_options)} only")
            if not isinstance(self.vllm_options, dict) or not all(isinstance(k, str) for k in self.vllm_options):
                raise ValueError(f"vllm_options must be a dict of option names, got {self.vllm_options!r}")
        if not isinstance(self.scheduler_reserve_full_isl, bool):
            raise ValueError(f"scheduler_reserve_full_isl must be True or False, got {self.scheduler_reserve_full_isl!r}")
        if design.vllm_options:  # vLLM's option and this field are one setting
            if "scheduler_reserve_full_isl" in (self.vllm_options or {}):
                self.scheduler_reserve_full_isl = bool(self.vllm_options["scheduler_reserve_full_isl"])
            elif not self.scheduler_reserve_full_isl:
                self.vllm_options = {**(self.vllm_options or {}), "scheduler_reserve_full_isl": False}
        if self.async_scheduling is not None:
            if not isinstance(self.async_scheduling, bool):
                raise ValueError(f"async_scheduling must be True, False or None, got {self.async_scheduling!r}")
            if self.async_scheduling and not design.async_scheduling:
                have = ", ".join(name for name, d in DESIGNS.items() if d.async_scheduling)
                raise ValueError(f"kv_manager {self.kv_manager!r} schedules synchronously: async_scheduling is for {have}")
        if design.vllm_options:  # vLLM's option and this field are one setting
            if "async_scheduling" in (self.vllm_options or {}):
                value = self.vllm_options["async_scheduling"]
                self.async_scheduling = None if value is None else bool(value)
            elif self.async_scheduling is not None:
                self.vllm_options = {**(self.vllm_options or {}), "async_scheduling": self.async_scheduling}
        elif self.async_scheduling is None:
            self.async_scheduling = design.async_scheduling
        if self.prefix_caching_hash_algo not in HASH_ALGOS:
            raise ValueError(f"prefix_caching_hash_algo must be one of {', '.join(HASH_ALGOS)}, "
                             f"got {self.prefix_caching_hash_algo!r}")
        if design.null_block and self.num_gpu_blocks == 1:
            raise ValueError(f"kv_manager {self.kv_manager!r} needs num_gpu_blocks >= 2: block 0 is the null block")
        if not design.swap and self.preemption_mode is PreemptionMode.SWAP:
            raise ValueError(f"kv_manager {self.kv_manager!r} preempts by recompute only: preemption_mode 'swap' is v0's")
        if self.enable_prefix_caching is None:
            self.enable_prefix_caching = design.enable_prefix_caching

    def _take_page_size(self, design: Design) -> None:
        """SGLang's page_size option is block_size (one page is one block): it sets block_size, and
        must be a positive integer (a ValueError line otherwise)."""
        if not design.radix_tree:
            raise ValueError(f"sglang_options apply to kv_manager {', '.join(repr(n) for n, d in DESIGNS.items() if d.radix_tree)} only")
        if not isinstance(self.sglang_options, dict) or not all(isinstance(k, str) for k in self.sglang_options):
            raise ValueError(f"sglang_options must be a dict of option names, got {self.sglang_options!r}")
        if "page_size" in self.sglang_options:
            page_size = self.sglang_options["page_size"]
            if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
                raise ValueError(f"sglang option page_size must be a positive integer (SGLang's page of KV slots), "
                                 f"got {page_size!r}")
            self.block_size = page_size
        from engine.sglang_core.options import SglangOptions

        SglangOptions.parse(self.sglang_options, self.block_size, 1)  # an unknown option or a refused value: one line

    def check_n(self, n: int) -> None:
        """A ValueError (one line) when a request's `n` sequences could never run at once: more than
        max_num_seqs (LLMEngine.check_request refuses such a request; vLLM's scheduler would leave
        it waiting forever)."""
        if n > self.max_num_seqs:
            raise ValueError(f"n={n} sequences can never run at once: max_num_seqs is {self.max_num_seqs}")

    @property
    def design(self) -> Design:
        """The registry's entry for `kv_manager` (engine/designs.py)."""
        return get_design(self.kv_manager)

    @classmethod
    def option_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in fields(cls))

    @classmethod
    def defaults(cls) -> dict:
        """Each option's default (what the CLI starts from)."""
        return {f.name: f.default for f in fields(cls)}
