"""Paths of the tap on vLLM 0.33 (engine/vllm_core/event_tap.py, offload.py) that the seeded
workloads of tests/test_vllm_tap.py never take, each checked on its own so that disabling the
wrapper or hook that draws it fails a test:

- vLLM's CPU tier releasing a load's GPU pins at a request's end
  (`SimpleCPUOffloadScheduler.request_finished` -> `_cleanup_load_request`): drawn as BlockFreed
  with seq id PIN_RELEASE, not refused as a free outside every known call;
- the prefix cache reset (`BlockPool.reset_prefix_cache`, which calls the metrics hook's `reset`):
  refused in one TapError line, since the views would keep hashes vLLM dropped.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest

from engine import SamplingParams
from engine.events import BlockFreed
from tests.test_engine_v1 import loaded  # noqa: F401 (the tiny GPT-2, a module fixture)
from tests.test_vllm_tap import GiB, OPENINGS, make_engine, tiny_block_bytes

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def _finished_run(engine) -> None:
    """One request run to its end: the pool holds cached, free blocks."""
    engine.add_request(OPENINGS[0], SamplingParams(max_tokens=4, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()


def test_a_load_cancelled_at_a_requests_end_releases_its_pins_as_pin_releases(tiny_gpt2_dir, loaded):
    """A load vLLM's CPU tier set up but never issued (its `load_event` None) is cleaned up by
    `request_finished`, which frees the GPU blocks the load pinned: each a BlockFreed of seq id
    PIN_RELEASE (offload.py's `_request_finished` says whose frees they are)."""
    from vllm.v1.simple_kv_offload.manager import LoadRequestState, TransferMeta

    from engine.vllm_core.event_tap import PIN_RELEASE

    engine = make_engine(tiny_gpt2_dir, loaded, block_size=2, num_gpu_blocks=30,
                         vllm_options={"kv_offloading_size": 12 * tiny_block_bytes(2) / GiB})
    _finished_run(engine)
    scheduler = engine.scheduler
    tier, pool = scheduler.cpu_tier, scheduler.block_pool
    gpu_blocks = [b for b in pool.blocks[1:] if b.ref_cnt == 0][:2]
    cpu_blocks = [b for b in tier.cpu_pool.blocks[1:] if b.ref_cnt == 0][:2]
    assert len(gpu_blocks) == len(cpu_blocks) == 2
    with scheduler.tap.calling("update_state_after_alloc", pins=True):  # pinned as a load pins them
        pool.touch(gpu_blocks)
    tier.cpu_pool.touch(cpu_blocks)
    request = SimpleNamespace(request_id="1000")
    tier.manager._reqs_to_load[request.request_id] = LoadRequestState(
        request=request, transfer_meta=TransferMeta([b.block_id for b in gpu_blocks], [b.block_id for b in cpu_blocks]))
    events: list = []
    engine.events.subscribe(events.append)
    tier.manager.request_finished(request, [])
    freed = [e for e in events if isinstance(e, BlockFreed)]
    assert [(e.block, e.seq_id, e.ref_count) for e in freed] == [(b.block_id, PIN_RELEASE, 0) for b in gpu_blocks]
    assert all(b.ref_cnt == 0 for b in gpu_blocks) and not tier.manager._reqs_to_load


def test_a_prefix_cache_reset_is_refused_in_one_line(tiny_gpt2_dir, loaded):
    """`BlockPool.reset_prefix_cache` drops every hash and calls the metrics hook's `reset`: the tap
    refuses it (the views would keep the hashes), in one line."""
    from engine.vllm_core.event_tap import TapError

    engine = make_engine(tiny_gpt2_dir, loaded, block_size=4, num_gpu_blocks=48)
    _finished_run(engine)
    pool = engine.scheduler.block_pool
    assert any(b.block_hash is not None for b in pool.blocks[1:])
    with pytest.raises(TapError, match="reset the gpu prefix cache") as raised:
        pool.reset_prefix_cache()
    assert "\n" not in str(raised.value)
