"""`kv_manager="sglang"`: SGLang 0.5.23's own RadixCache, KV allocator, ReqToTokenPool,
SchedulePolicy and PrefillAdder drive our engine (docs/sglang.md).

imports.py imports SGLang's classes (with the one import-time stand-in it needs here), options.py
checks `--sglang-option`, scheduler.py presents our scheduler interface over SGLang's objects.
"""

from __future__ import annotations

from typing import Any

from engine.designs import SGLANG_INSTALL

SUPPORTED_SGLANG = "0.5.23"  # the release whose classes the adapter and its tests are proven against


def sglang_version() -> str:
    """The installed SGLang's version, as its distribution names it (a trace header records it)."""
    from importlib import metadata

    try:
        return metadata.version("sglang")
    except metadata.PackageNotFoundError:
        raise ValueError(SGLANG_INSTALL) from None


def check_sglang_version() -> str:
    """The installed SGLang's version; a ValueError line naming it and the supported one when it is
    not SUPPORTED_SGLANG: the adapter drives that release's scheduler internals (PrefillAdder,
    ScheduleBatch, Req.kv), which another release may have renamed."""
    found = sglang_version()
    if found.split("+")[0] != SUPPORTED_SGLANG:
        raise ValueError(f"kv_manager 'sglang' supports SGLang {SUPPORTED_SGLANG}, found SGLang {found}: "
                         f"pip install --no-deps sglang=={SUPPORTED_SGLANG}")
    return found


def make_sglang_scheduler(config: Any, num_gpu_blocks: int, max_num_seqs: int, max_model_len: int,
                          max_num_batched_tokens: int, events: Any, output_processor: Any):
    """SGLang's cache and scheduling policy over a pool of `num_gpu_blocks` blocks (page 0 is SGLang's
    padding page: `num_gpu_blocks - 1` pages to hand out), behind our scheduler interface."""
    from engine.sglang_core.options import SglangOptions
    from engine.sglang_core.scheduler import SglangScheduler

    options = SglangOptions.parse(config.sglang_options, config.block_size, max_num_batched_tokens)
    return SglangScheduler(options, num_gpu_blocks - 1, max_num_seqs, max_model_len, events, output_processor)
