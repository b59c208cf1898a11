"""engine: a real paged-KV inference engine (vLLM v0 block-manager semantics, nano-vllm's prefix cache).

Memory planning (block.py, sequence.py, block_allocator.py, block_manager.py) is pure Python;
execution (cache_engine.py, models/, scheduler.py, llm_engine.py, llm.py) uses torch and is
imported lazily so that `import engine` never pulls in torch or any UI library.
"""

from engine.block import Device, LogicalTokenBlock, PhysicalTokenBlock
from engine.block_manager import AllocStatus, BlockSpaceManager
from engine.events import EventBus
from engine.invariants import check_invariants
from engine.reducer import ReducerState
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus

__all__ = [
    "AllocStatus",
    "BlockSpaceManager",
    "Device",
    "EventBus",
    "LogicalTokenBlock",
    "PhysicalTokenBlock",
    "ReducerState",
    "SamplingParams",
    "Sequence",
    "SequenceGroup",
    "SequenceStatus",
    "check_invariants",
]
