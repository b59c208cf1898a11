"""vLLM v1's CPU tier under `kv_manager="vllm"`: vLLM 0.33's own `SimpleCPUOffloadScheduler`
(`vllm/v1/simple_kv_offload/manager.py`, behind the `SimpleCPUOffloadConnector` that
`--kv-offloading-size` configures) decides every store and load; our engine plays its worker side
(`vllm/v1/simple_kv_offload/worker.py`'s `SimpleCPUOffloadWorker`).

What vLLM's scheduler side does, each step (eager mode, vLLM's default):
- store: at the end of `schedule()`, `build_connector_meta` picks each scheduled request's full,
  hashed blocks computed in earlier steps that the CPU pool lacks (`_prepare_eager_store_specs`),
  plus those of requests that finished since (`_queue_finished_eager_store`), takes a CPU block for
  each from its own caching BlockPool (evicting the least recently used cached one) and pins the GPU
  block (`touch`) until the copy completes; then the CPU block is registered under the GPU block's
  hash (`_process_store_completion`) and both are released.
- load: a waiting request whose prefix runs past its GPU hits into blocks the CPU pool holds
  (`get_num_new_matched_tokens`) is given fresh GPU blocks for them (`update_state_after_alloc`)
  and waits (`WAITING_FOR_REMOTE_KVS`) until the worker reports the load done (`finished_recving`);
  the next `schedule()` caches the loaded blocks and runs the rest of the request.

What our engine does as the worker (`CpuTier.moves`, `CpuTier.connector_output`): the step plan
carries vLLM's load pairs as `blocks_to_swap_in`, copied before the step's forward as v0's swap-in
(`start_load_kv`), and its store pairs as `blocks_to_store`, copied after the forward
(`wait_for_save`): vLLM may pick a GPU block that a sliding window let go and the same schedule()
gave to a block the step fills (the runner's table still holds the old id), and registers the CPU
copy under the hash the block has when the store completes, so the copy must hold what the step
wrote; every transfer is reported done in the same step's `update_from_output` (a `KVConnectorOutput` with
`finished_recving` and `SimpleCPUOffloadWorkerMetadata.completed_store_events`), as a worker whose
copies are synchronous would. The CPU pool's blocks are the cache engine's CPU pool, one to one.

Events (engine/events.py): OffloadStored when vLLM pins GPU blocks for a store, OffloadLoaded when it
pins them for a load, BlockEvicted(device="cpu") when the CPU pool evicts, and a BlockFreed with
seq_id -1 when vLLM releases a pin (the GPU pool's own tap). A store is drawn done when it is
decided (the CPU block cached under its hash), a load when it is issued: vLLM marks both done at the
worker's report, in the same step, or for the stores of a request that finished mid-step, at the next.
The CPU pool's own pins (`touch` during a lookup or a load) and its LRU order are not events: both are
back where a step left them, and the views draw no CPU free queue.
"""

from __future__ import annotations

from typing import Any

from engine.events import EventBus, OffloadLoaded, OffloadStored
from engine.v1.kv_cache_utils import external_block_hash
from engine.vllm_core.event_tap import PIN_RELEASE

CPU = "cpu"
MEDIUM_CPU = "CPU"  # vLLM's kv_events.MEDIUM_CPU


class CpuTier:
    """The worker side of vLLM's SimpleCPUOffloadConnector for one vLLM Scheduler, and the tap that
    emits the tier's events (wrapping methods of this instance's SimpleCPUOffloadScheduler, and
    the metrics hook of its CPU BlockPool). The GPU blocks it pins (`BlockPool.touch`) and releases
    (`BlockPool.free_blocks`) are the GPU tap's, each inside a call that says so (`tap.calling`):
    pins while it prepares stores and loads, releases (seq id PIN_RELEASE) while it takes the
    worker's report or a request's end."""

    # the SimpleCPUOffloadScheduler methods wrapped (the wrapper: "_" + the name without its leading "_")
    WRAPPED = ("prepare_store_specs", "_queue_finished_eager_store", "update_state_after_alloc",
               "update_connector_output", "request_finished")

    def __init__(self, scheduler: Any, events: EventBus, tap: Any, request_id_of: Any = str) -> None:
        """`request_id_of(vllm_request_id)`: our request's id (a vLLM request is one of our sequences)."""
        from vllm.v1.core.kv_cache_utils import get_block_hash

        self.manager = scheduler.connector.scheduler_manager
        if self.manager is None:
            raise ValueError("vllm option kv_offloading_size: vLLM switched its CPU tier off (prefix caching is off)")
        self.events = events
        self.tap = tap
        self.request_id_of = request_id_of
        self.gpu_pool = scheduler.kv_cache_manager.block_pool
        self.cpu_pool = self.manager.cpu_block_pool
        self.num_cpu_blocks = self.manager.num_cpu_blocks
        self._get_block_hash = get_block_hash
        for name in self.WRAPPED:
            setattr(self.manager, name, getattr(self, "_" + name.lstrip("_"))(getattr(self.manager, name)))
        tap.hook_pool(self.cpu_pool, CPU)  # the CPU pool's evictions, through vLLM's metrics hook

    # ------------------------------------------------------------------ the worker side

    @staticmethod
    def moves(out: Any) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """The copies vLLM's output asks of the worker: (gpu, cpu) store pairs and (cpu, gpu) load
        pairs (SimpleCPUOffloadMetadata's store_* and load_* lists)."""
        meta = out.kv_connector_metadata
        if meta is None:
            return [], []
        return (list(zip(meta.store_gpu_blocks, meta.store_cpu_blocks)),
                list(zip(meta.load_cpu_blocks, meta.load_gpu_blocks)))

    @staticmethod
    def connector_output(out: Any):
        """The worker's report that every transfer `out` asked for is done (KVConnectorOutput), or
        None when it asked for none."""
        from vllm.v1.outputs import KVConnectorOutput
        from vllm.v1.simple_kv_offload.metadata import SimpleCPUOffloadWorkerMetadata

        meta = out.kv_connector_metadata
        if meta is None or (meta.store_event < 0 and meta.load_event < 0):
            return None
        loaded = set(meta.load_event_to_reqs.get(meta.load_event, ())) if meta.load_event >= 0 else set()
        stored = {meta.store_event: 1} if meta.store_event >= 0 else {}
        return KVConnectorOutput(finished_recving=loaded or None,
                                 kv_connector_worker_meta=SimpleCPUOffloadWorkerMetadata(completed_store_events=stored))

    def has_pending_stores(self) -> bool:
        """Stores decided and not yet copied (a finished request's, issued by the next schedule())."""
        return self.manager.has_pending_stores()

    # ------------------------------------------------------------------ wrappers (each returns the wrapped method)

    def _prepare_store_specs(self, original):
        def prepare_store_specs(scheduler_output):
            with self.tap.calling("prepare_store_specs", pins=True):
                specs = original(scheduler_output)
            self._emit_store(specs[0], specs[1])
            return specs
        return prepare_store_specs

    def _queue_finished_eager_store(self, original):
        def queue_finished_eager_store(request, block_ids):
            pending = self.manager._pending_finished_stores
            num_before = len(pending)
            with self.tap.calling("_queue_finished_eager_store", pins=True):
                original(request, block_ids)
            for transfer in pending[num_before:]:
                self._emit_store(transfer.gpu_block_ids, transfer.cpu_block_ids)
        return queue_finished_eager_store

    def _update_state_after_alloc(self, original):
        def update_state_after_alloc(request, blocks, num_external_tokens):
            had = request.request_id in self.manager._reqs_to_load
            with self.tap.calling("update_state_after_alloc", pins=True):
                original(request, blocks, num_external_tokens)
            state = self.manager._reqs_to_load.get(request.request_id)
            if had or state is None or not self.events.active:
                return
            transfer = state.transfer_meta
            self.events.emit(OffloadLoaded, medium=MEDIUM_CPU, request_id=self.request_id_of(request.request_id),
                             seq_id=int(request.request_id),
                             mapping=tuple(zip(transfer.cpu_block_ids, transfer.gpu_block_ids)),
                             num_tokens=num_external_tokens)
        return update_state_after_alloc

    def _update_connector_output(self, original):
        """The worker's report: completed copies release their pins (BlockFreed, seq id PIN_RELEASE)."""
        def update_connector_output(connector_output):
            with self.tap.calling("update_connector_output", seq_id=PIN_RELEASE):
                return original(connector_output)
        return update_connector_output

    def _request_finished(self, original):
        """A request's end: a load it never started releases its pins (BlockFreed, seq id PIN_RELEASE)."""
        def request_finished(request, block_ids):
            with self.tap.calling("request_finished", seq_id=PIN_RELEASE):
                return original(request, block_ids)
        return request_finished

    def _emit_store(self, gpu_block_ids: list[int], cpu_block_ids: list[int]) -> None:
        if not (gpu_block_ids and self.events.active):
            return
        blocks = [self.gpu_pool.blocks[number] for number in gpu_block_ids]
        hashed = [self.tap.hashed.get(number, (None, ())) for number in gpu_block_ids]
        self.events.emit(OffloadStored, medium=MEDIUM_CPU, mapping=tuple(zip(gpu_block_ids, cpu_block_ids)),
                         block_hashes=tuple(external_block_hash(self._get_block_hash(b.block_hash)) for b in blocks),
                         parent_hashes=tuple(parent for parent, _ in hashed),
                         token_ids=tuple(tokens for _, tokens in hashed))
