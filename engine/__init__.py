"""engine: a real paged-KV inference engine (vLLM v0 block-manager semantics, nano-vllm's prefix cache;
vLLM v1's KV cache manager and scheduler in engine/v1/, chosen by EngineConfig.kv_manager).

Memory planning (block.py, sequence.py, block_allocator.py, block_manager.py) is pure Python;
execution (cache_engine.py, kv_sizing.py, models/, scheduler.py, llm_engine.py, llm.py) uses torch and is
imported lazily so that `import engine` never pulls in torch or any UI library.
"""

from engine.block import Device, LogicalTokenBlock, PhysicalTokenBlock
from engine.block_manager import AllocStatus, BlockSpaceManager
from engine.config import EngineConfig, PreemptionMode
from engine.events import EventBus
from engine.invariants import check_invariants
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus

_LAZY = {  # torch-backed names, imported on first use so `import engine` stays light
    "LLM": "engine.llm",
    "LLMEngine": "engine.llm_engine",
    "RequestOutput": "engine.outputs",
    "CompletionOutput": "engine.outputs",
    "CacheEngine": "engine.cache_engine",
    "load_model": "engine.model_loader",
    "ModelNotFoundError": "engine.model_loader",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'engine' has no attribute {name!r}")


__all__ = [
    *_LAZY,
    "AllocStatus",
    "BlockSpaceManager",
    "EngineConfig",
    "PreemptionMode",
    "Device",
    "EventBus",
    "LogicalTokenBlock",
    "PhysicalTokenBlock",
    "SamplingParams",
    "Sequence",
    "SequenceGroup",
    "SequenceStatus",
    "check_invariants",
]
