"""blockviz's engine events as vLLM KV-cache events: what a vLLM v1 engine would have published.

vLLM publishes the life of its prefix cache only: which hashed blocks enter it and which leave it.
Two mappers, one per KV cache manager (`mapper_for(kv_manager, block_size, kv_cache_groups)`):

- `V1KVEventMapper` (`--kv-manager v1`, engine/v1/): blockviz's v1 BlockPool does what vLLM v1's
  does, so its events map one to one onto what vLLM's `BlockPool` queues. One `cache_full_blocks`
  call (a run of block_hashed events with nothing between them) is one BlockStored: every block it
  hashed, duplicates included (vLLM v1 caches a block under its hash even when another block holds
  that hash already, and publishes it), its parent the block before the first one (None at a
  prompt's start), their tokens in order. One block_evicted (a cached block popped from the free
  queue's head by `get_new_blocks`) is one BlockRemoved. Nothing else: freeing keeps a block's
  hash (lazy eviction), hits publish nothing. Stores are never merged across calls.
- `KVEventMapper` (`--kv-manager v0`): the v0 cached allocator (engine/block_allocator.py,
  nano-vllm's chained xxh64) has a similar life, mapped as below.

| blockviz event (engine/events.py)              | vLLM event                                      |
|------------------------------------------------|-------------------------------------------------|
| block_hashed, registered, on the GPU           | BlockStored([hash], parent hash, tokens, size,  |
|                                                |   "GPU", group 0, "full_attention")             |
| block_hashed, not registered (an equal block   | nothing: the hash is already stored once, and  |
|   is in the hash map already)                  |   this copy never enters the map               |
| block_hashed after swap_in (parent unknown)    | BlockStored, parent taken from an earlier store |
| prefix_cache_hit (a hit, or a free-but-cached  | nothing: vLLM publishes no hits; the block     |
|   block revived)                               |   was stored before and stays stored           |
| block_freed to free-but-cached (ref 0, cached) | nothing: the block stays in the cache          |
| block_evicted (LRU eviction of a cached block) | BlockRemoved([hash], "GPU", group 0)           |
| block_freed, ref 0, not cached, of a registered| BlockRemoved([hash], ...): the block left      |
|   block (freed before its K/V was computed)    |   the hash map without an eviction event       |
| offload_store (vLLM's CPU tier, kv_manager     | BlockStored([hash], parent, tokens, size, "CPU",|
|   "vllm" with kv_offloading_size), per block   |   group 0, "full_attention", "LOCAL"); v1 only  |
| block_evicted on the CPU (the tier's LRU)      | BlockRemoved([hash], "CPU", group 0, "LOCAL")   |
| allocate, append, fork, copy-on-write, swap,   | nothing: physical blocks, tables and ref counts |
|   preemption, tokens, steps                    |   are not part of vLLM's protocol              |

Batches: vLLM publishes one EventBatch per engine step, and only when the step produced events.
Within a step, a BlockStored whose parent is the previous BlockStored's last hash joins it (one
event, several hashes, their tokens in order), as vLLM stores one request's new full blocks at once.
blockviz never drops its whole cache, so it never sends AllBlocksCleared. Hashes are blockviz's
xxh64 ints, masked to their low 64 bits as vLLM's int hashes are. Every event names its KV-cache
group (`group_idx`, the engine event's `group`; 0 in a run with one group) and BlockStored the
group's kind and window (`kv_cache_spec_kind`, `kv_cache_spec_sliding_window`, from the run
header's "kv_cache_groups"; full attention without one), as vLLM's KVCacheManager.take_events
annotates them; a cache_full_blocks call is one group's, so a store never spans two groups. The other newest fields stay unset, as vLLM's own GPU
pool leaves them: `locality` (blockviz's blocks are the publisher's own), `ownership` (no
offloading tier), `session_id` (blockviz's requests belong to no API session).

No torch, no zmq: this reads engine events (it is an EventBus subscriber) and returns records.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import msgspec

from blockviz.kvevents.protocol import KIND_FULL_ATTENTION, MEDIUM_GPU, BlockRemoved, BlockStored, KVCacheEvent
from blockviz.model.design import KVCacheGroup, design_of
from engine.events import BlockEvicted, BlockFreed, BlockHashed, Event, OffloadStored, StepFinished

LOW_64_BITS = (1 << 64) - 1
GROUP = 0  # the one KV-cache group of a model with one kind of layer
MEDIUM_CPU = "CPU"  # vLLM's kv_events.MEDIUM_CPU: its CPU offloading tier


def mapper_for(kv_manager: str | None, block_size: int, kv_cache_groups: tuple[KVCacheGroup, ...] = ()
               ) -> "KVEventMapper | V1KVEventMapper":
    """The mapper for a run of `kv_manager` ("v0", None as in an old trace, or "v1") with these
    KV-cache groups (design.kv_cache_groups_of of its header; () for one full-attention group)."""
    if design_of({"kv_manager": kv_manager}).free_queue:
        return V1KVEventMapper(block_size, kv_cache_groups)
    return KVEventMapper(block_size)


def external_hash(block_hash: int) -> int:
    """A blockviz hash as vLLM's int ExternalBlockHash: its low 64 bits."""
    return block_hash & LOW_64_BITS


class KVEventMapper:
    """Turns blockviz engine events into vLLM KV events; subscribe `feed` to an EventBus and call
    `take_events()` once per step (vLLM's KVCacheManager.take_events)."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.pending: list[KVCacheEvent] = []
        self.registered: dict[int, int] = {}  # GPU block number -> the hash it holds in the hash map
        self.parents: dict[int, int | None] = {}  # hash -> parent hash, from the stores seen

    def __call__(self, event: Event) -> None:
        self.feed(event)

    def feed(self, event: Event) -> None:
        """Note one engine event; the vLLM events it means wait in `pending`."""
        if isinstance(event, BlockHashed):
            self._on_hashed(event)
        elif isinstance(event, BlockEvicted):
            self._remove(event.device, event.block)
        elif isinstance(event, BlockFreed) and event.ref_count == 0 and not event.cached:
            self._remove(event.device, event.block)

    def _on_hashed(self, event: BlockHashed) -> None:
        if event.device != "gpu" or not event.registered:
            return
        if event.parent_hash is not None or event.block_hash not in self.parents:
            self.parents[event.block_hash] = event.parent_hash
        parent = self.parents[event.block_hash]
        self.registered[event.block] = event.block_hash
        self.pending.append(BlockStored(
            (external_hash(event.block_hash),), None if parent is None else external_hash(parent),
            tuple(event.token_ids), self.block_size, medium=MEDIUM_GPU, group_idx=GROUP,
            kv_cache_spec_kind=KIND_FULL_ATTENTION))

    def _remove(self, device: str, block: int) -> None:
        if device != "gpu" or block not in self.registered:
            return
        block_hash = self.registered.pop(block)
        self.pending.append(BlockRemoved((external_hash(block_hash),), medium=MEDIUM_GPU, group_idx=GROUP))

    def take_events(self) -> list[KVCacheEvent]:
        """The events since the last call, chained stores merged; empties `pending`."""
        events, self.pending = merge_chained_stores(self.pending), []
        return events


class V1KVEventMapper:
    """Turns a v1 run's engine events into what vLLM v1's BlockPool publishes (vLLM
    `BlockPool.cache_full_blocks` and `_maybe_evict_cached_block`, annotated as
    `KVCacheManager.take_events` does); `take_events()` once per step. Every field vLLM's GPU pool
    sets for a single full-attention group is set, `extra_keys` as one None per block (vLLM's
    `to_event_extra_keys` of blocks with none); `lora_*`, `session_id`, `lookahead_token_ids`,
    `locality` and `ownership` stay None, as vLLM leaves them for a request with no LoRA, no
    multimodal input, no cache salt and no API session. `kv_cache_groups` (the run header's) give
    each group's kind and window (vLLM KVCacheManager.kv_cache_event_metadata)."""

    def __init__(self, block_size: int, kv_cache_groups: tuple[KVCacheGroup, ...] = ()) -> None:
        self.block_size = block_size
        self.spec_of = {group: (g.kind, g.sliding_window) for group, g in enumerate(kv_cache_groups)}
        self.pending: list[KVCacheEvent] = []
        self._open: BlockStored | None = None  # the store of the cache_full_blocks call being read

    def __call__(self, event: Event) -> None:
        self.feed(event)

    def feed(self, event: Event) -> None:
        """Note one engine event; the vLLM events it means wait in `pending`."""
        if isinstance(event, BlockHashed) and event.device == "gpu":
            self._on_hashed(event)
            return
        self._open = None  # any other event ends a cache_full_blocks call
        if isinstance(event, BlockEvicted) and event.device == "gpu":
            self.pending.append(BlockRemoved((external_hash(event.block_hash),), medium=MEDIUM_GPU,
                                             group_idx=event.group))
        elif isinstance(event, BlockEvicted):  # vLLM's CPU tier (SimpleCPUOffloadScheduler.take_events)
            self.pending.append(BlockRemoved((external_hash(event.block_hash),), medium=MEDIUM_CPU, group_idx=GROUP,
                                             locality="LOCAL"))
        elif isinstance(event, OffloadStored):  # one BlockStored per block (_process_store_completion)
            for block_hash, parent, token_ids in zip(event.block_hashes, event.parent_hashes, event.token_ids):
                self.pending.append(BlockStored(
                    (external_hash(block_hash),), None if parent is None else external_hash(parent),
                    tuple(token_ids), self.block_size, medium=event.medium, group_idx=GROUP,
                    kv_cache_spec_kind=KIND_FULL_ATTENTION, locality="LOCAL"))

    def _on_hashed(self, event: BlockHashed) -> None:
        block_hash = external_hash(event.block_hash)
        last = self._open
        if (last is not None and event.parent_hash is not None and last.group_idx == event.group
                and external_hash(event.parent_hash) == last.block_hashes[-1]):
            self._open = msgspec.structs.replace(last, block_hashes=last.block_hashes + (block_hash,),
                                                 token_ids=last.token_ids + tuple(event.token_ids),
                                                 extra_keys=last.extra_keys + (None,))
            self.pending[-1] = self._open
            return
        parent = None if event.parent_hash is None else external_hash(event.parent_hash)
        kind, window = self.spec_of.get(event.group, (KIND_FULL_ATTENTION, None))
        self._open = BlockStored((block_hash,), parent, tuple(event.token_ids), self.block_size, medium=MEDIUM_GPU,
                                 extra_keys=(None,), group_idx=event.group, kv_cache_spec_kind=kind,
                                 kv_cache_spec_sliding_window=window)
        self.pending.append(self._open)

    def take_events(self) -> list[KVCacheEvent]:
        """The events since the last call, in the order vLLM queues them; empties `pending`."""
        events, self.pending, self._open = self.pending, [], None
        return events


def merge_chained_stores(events: Iterable[KVCacheEvent]) -> list[KVCacheEvent]:
    """Consecutive BlockStored events where each continues the previous one's chain (and agrees
    on every other field: block size, tier, group) become one."""
    out: list[KVCacheEvent] = []
    for event in events:
        last = out[-1] if out else None
        if (isinstance(event, BlockStored) and isinstance(last, BlockStored)
                and event.parent_block_hash == last.block_hashes[-1]
                and msgspec.structs.replace(event, block_hashes=(), parent_block_hash=None, token_ids=())
                == msgspec.structs.replace(last, block_hashes=(), parent_block_hash=None, token_ids=())):
            out[-1] = msgspec.structs.replace(last, block_hashes=last.block_hashes + event.block_hashes,
                                              token_ids=last.token_ids + event.token_ids)
        else:
            out.append(event)
    return out


def step_batches(events: Iterable[Event], block_size: int, kv_manager: str | None = "v0",
                 kv_cache_groups: tuple[KVCacheGroup, ...] = ()) -> Iterator[list[KVCacheEvent]]:
    """A recorded event stream (a trace) as vLLM's batches: one per engine step that stored or
    removed blocks (events after the last step_finished form a last batch); `kv_manager` is the
    trace's (its header's "kv_manager", absent in v0's), `kv_cache_groups` its groups."""
    mapper = mapper_for(kv_manager, block_size, kv_cache_groups)
    for event in events:
        mapper.feed(event)
        if isinstance(event, StepFinished) and mapper.pending:
            yield mapper.take_events()
    if mapper.pending:
        yield mapper.take_events()
