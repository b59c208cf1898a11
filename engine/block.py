"""Token blocks: the unit of KV-cache memory.

Mirrors vLLM v0's `vllm/block.py` (LogicalTokenBlock, PhysicalTokenBlock): a `LogicalTokenBlock` is a slice of
a sequence's tokens (always contiguous), a `PhysicalTokenBlock` is a fixed-size slot range of the KV
cache on one device (placed anywhere). The block manager maps the first onto the second.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

class Device(str, Enum):
    """Where a physical block lives: the accelerator pool ("gpu", CPU memory on a CPU-only run)
    or the CPU swap pool."""

    GPU = "gpu"
    CPU = "cpu"


class LogicalTokenBlock:
    """A block of a sequence's token ids (vLLM v0's LogicalTokenBlock). vLLM pads `token_ids` with
    -1 up to block_size; here it holds exactly the tokens appended so far."""

    __slots__ = ("block_number", "block_size", "token_ids")

    def __init__(self, block_number: int, block_size: int) -> None:
        self.block_number = block_number
        self.block_size = block_size
        self.token_ids: list[int] = []

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    def is_full(self) -> bool:
        return len(self.token_ids) == self.block_size

    def get_num_empty_slots(self) -> int:
        return self.block_size - len(self.token_ids)

    def append_tokens(self, token_ids: list[int]) -> None:
        """Fill the next empty slots; more tokens than empty slots is a ValueError."""
        if len(token_ids) > self.get_num_empty_slots():
            raise ValueError(
                f"logical block {self.block_number} has {self.get_num_empty_slots()} empty slots, "
                f"cannot append {len(token_ids)} tokens"
            )
        self.token_ids.extend(token_ids)

    def get_token_ids(self) -> list[int]:
        return list(self.token_ids)

    def get_last_token_id(self) -> int:
        if not self.token_ids:
            raise ValueError(f"logical block {self.block_number} is empty")
        return self.token_ids[-1]


@dataclass(slots=True, eq=False)
class PhysicalTokenBlock:
    """A block of KV-cache slots on one device (vLLM v0's PhysicalTokenBlock).

    `block_hash` is None until the block is full and hashed (prefix caching); `computed` turns True
    once the engine has written the block's K/V: freed, only a computed block stays cached.
    `token_ids` keeps the tokens the block holds so cache lookups can compare them (collision guard).
    """

    device: Device
    block_number: int
    block_size: int
    block_hash: int | None = None
    num_hashed_tokens: int = 0
    ref_count: int = 0
    last_accessed: int = 0
    computed: bool = False
    token_ids: tuple[int, ...] = field(default=())

    def __repr__(self) -> str:
        return (
            f"PhysicalTokenBlock(device={self.device.value}, block_number={self.block_number}, "
            f"ref_count={self.ref_count}, block_hash={self.block_hash}, computed={self.computed})"
        )
