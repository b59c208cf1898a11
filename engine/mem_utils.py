"""What a device's memory holds, read in one place (vLLM `vllm/utils/mem_utils.py`: MemorySnapshot,
the readings `memory_profiling` takes before and after the profile run).

`device_memory(device)` is the one memory query the pool sizing uses (engine/kv_sizing.py
`determine_num_blocks`): CUDA's reading, or None where the pool is not sized from memory (the
CPU). Tests replace it (monkeypatch) to give the sizing a device's figures on a machine without one.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from dataclasses import dataclass

import torch

GiB = 1 << 30


@dataclass(frozen=True, slots=True)
class MemorySnapshot:
    """One reading of a device's memory, in bytes (vLLM `MemorySnapshot`).

    free_bytes and total_bytes are the driver's (`torch.cuda.mem_get_info`), so they count memory
    outside torch too (other processes, the CUDA context, cuBLAS / cuDNN workspaces, Triton's
    modules). torch_allocated_bytes is what torch's tensors hold now; torch_peak_bytes the most
    they held at once since the previous reading (vLLM's `torch_peak`, "allocated_bytes.all.peak")."""

    free_bytes: int
    total_bytes: int
    torch_allocated_bytes: int
    torch_peak_bytes: int


MemoryQuery = Callable[[torch.device], MemorySnapshot]


def cuda_memory_snapshot(device: torch.device) -> MemorySnapshot:
    """Read a CUDA device's memory once its queued work is done and torch's cached, unused
    blocks are returned (gc + empty_cache, as vLLM's memory_profiling does before each reading);
    then reset torch's peak, so the next reading's peak is the most held in between."""
    torch.cuda.synchronize(device)
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    snapshot = MemorySnapshot(free, total, torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device))
    torch.cuda.reset_peak_memory_stats(device)
    return snapshot


def device_memory(device: torch.device) -> MemoryQuery | None:
    """The memory query of `device`: CUDA's reading, or None for a device whose pool is not sized
    from its memory (the CPU: a fixed default, engine/kv_sizing.py DEFAULT_CPU_KV_CACHE_BYTES)."""
    return cuda_memory_snapshot if device.type == "cuda" else None


def format_gib(num_bytes: float) -> str:
    """Bytes as GiB with two decimals, "73.60 GiB" (vLLM `format_gib`)."""
    return f"{num_bytes / GiB:.2f} GiB"


def available_bytes(device: torch.device) -> int | None:
    """The bytes a new tensor on `device` can take now: CUDA's free memory; on the CPU the kernel's
    MemAvailable (/proc/meminfo), within what is left under this process's address-space limit
    (RLIMIT_AS, `ulimit -v`). None where neither can be read."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    found: list[int] = []
    try:
        with open("/proc/meminfo", encoding="ascii") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    try:
        import resource

        limit = resource.getrlimit(resource.RLIMIT_AS)[0]
        if limit != resource.RLIM_INFINITY:
            with open("/proc/self/statm", encoding="ascii") as statm:
                in_use = int(statm.read().split()[0]) * resource.getpagesize()
            found.append(max(0, limit - in_use))
    except (ImportError, OSError, ValueError, IndexError):
        pass
    return min(found) if found else None


def check_pool_fits(what: str, num_blocks: int, block_bytes: int, device: torch.device, option: str) -> None:
    """A ValueError (one line naming the pool, its size, the memory free and `option`, the way
    out) when `num_blocks` blocks of `block_bytes` cannot be allocated on `device` now, before
    torch tries (a pool past memory is otherwise a torch traceback, or an overflow of its size)."""
    needed = num_blocks * block_bytes
    free = available_bytes(device)
    if free is not None and needed > free:
        raise ValueError(f"the {what} of {num_blocks:,} blocks needs {format_gib(needed)}, more than the "
                         f"{format_gib(free)} free on {device.type}: lower {option}")
