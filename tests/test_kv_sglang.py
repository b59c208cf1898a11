"""SGLang's own KV events in `blockviz attach`: SGLang 0.5.23's RadixCache records BlockStored /
BlockRemoved (sglang/srt/mem_cache/events.py `KVCacheEventRecorder`, hashing each page with its
native SHA-256 extension), SGLang's `KVEventBatch` carries them and SGLang's `ZmqEventPublisher`
sends them, as its scheduler does (managers/scheduler_components/kv_events_publisher.py
`publish_kv_events`); blockviz's client, state and attach app (blockviz/kvevents/,
blockviz/tui/attach_app.py) read and draw them. The tree is SGLang's own, driven by a real
`kv_manager="sglang"` engine run that evicts: after every step the blocks blockviz holds as cached
are the tree's pages, by SGLang's event hash, with their tokens.

Every wait has a timeout; no assertion is about time.
"""

from __future__ import annotations

import asyncio
import importlib.util
import time
from contextlib import contextmanager

import pytest

from blockviz.kvevents.state import KVEventState
from blockviz.kvevents.subscriber import KVEventClient
from tests.test_kv_round_trip import WAIT_S, collect, free_ports
from tests.test_sglang_core import GREEDY, make_engine, workload
from tests.test_engine_v1 import loaded  # noqa: F401 (the tiny GPT-2, a module fixture)
from tests.test_tui_app import anyio_backend, screen_text  # noqa: F401  (the anyio backend and screen text)

TOPIC = "kv-events"


@pytest.fixture(autouse=True)
def _needs_sglang():
    if importlib.util.find_spec("sglang") is None:
        pytest.skip("SGLang is not installed")


def tree_pages(cache) -> dict[int, tuple[int, ...]]:
    """Every page in SGLang's tree now: its event hash (SGLang's hash_str_to_int64 of the node's
    hash_value) -> its tokens."""
    from sglang.srt.mem_cache.utils import hash_str_to_int64

    pages, stack, size = {}, list(cache.root_node.children.values()), cache.page_size
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        tokens = list(node.key.token_ids)
        for index, hex_hash in enumerate(node.hash_value or ()):
            pages[hash_str_to_int64(hex_hash)] = tuple(tokens[index * size:(index + 1) * size])
    return pages


RUNS = {1: 49, 4: 13}  # page_size -> pages in the pool: small enough to evict


@pytest.fixture(scope="module")
def sglang_steps(loaded, tiny_gpt2_dir):
    """page_size -> per engine step of an evicting `kv_manager="sglang"` run: SGLang's events of the
    step (RadixCache.take_events, its recorder turned on as --kv-events-config does) and the
    tree's pages after it."""
    from engine.sglang_core.imports import sglang_classes

    sglang_classes()  # SGLang's modules, imported with their one stand-in
    out = {}
    for page_size, num_gpu_blocks in RUNS.items():
        engine = make_engine(loaded, tiny_gpt2_dir, num_gpu_blocks=num_gpu_blocks, sglang_options={
            "page_size": page_size, "schedule_policy": "lpm", "chunked_prefill_size": 8})
        cache = engine.scheduler.tree_cache
        cache.kv_events.enabled = True
        for index, prompt in enumerate(workload(page_size * 100 + num_gpu_blocks)):
            engine.add_request(prompt, GREEDY, request_id=f"r{index}")
        steps = []
        while engine.has_unfinished_requests():
            engine.step()
            steps.append((cache.take_events(), tree_pages(cache)))  # SGLang's publish_kv_events, once per step
        out[page_size] = steps
    return out


@contextmanager
def sglang_publisher():
    """SGLang's ZmqEventPublisher on free ports; yields it, its endpoint and its replay endpoint."""
    from sglang.srt.disaggregation.kv_events import ZmqEventPublisher

    port, replay_port = free_ports(2)
    publisher = ZmqEventPublisher(attn_dp_rank=0, endpoint=f"tcp://*:{port}",
                                  replay_endpoint=f"tcp://127.0.0.1:{replay_port}", topic=TOPIC)
    try:
        yield publisher, f"tcp://127.0.0.1:{port}", f"tcp://127.0.0.1:{replay_port}"
    finally:
        publisher.shutdown()


@pytest.mark.parametrize("page_size", sorted(RUNS))
def test_sglangs_publisher_feeds_blockviz_the_trees_pages_after_every_step(sglang_steps, page_size):
    from sglang.srt.disaggregation.kv_events import BlockRemoved, BlockStored, KVEventBatch

    steps = sglang_steps[page_size]
    kinds = {type(e) for events, _ in steps for e in events}
    assert {BlockStored, BlockRemoved} <= kinds, "the small pool evicts: SGLang removes pages it stored"
    with sglang_publisher() as (publisher, endpoint, replay):
        with KVEventClient(endpoint, replay, topic=TOPIC) as client:
            state, sent = KVEventState(), 0
            deadline = time.monotonic() + WAIT_S
            while state.num_batches == 0 and time.monotonic() < deadline:  # until the subscription is through
                publisher.publish(KVEventBatch(ts=time.time(), events=[]))
                sent += 1
                state.apply_update(client.poll(50))
            first = state.timeline[0].seq
            for events, pages in steps:
                publisher.publish(KVEventBatch(ts=time.time(), events=events))
                sent += 1
                collect(client, state, sent - first)
                cached = {h: node.token_ids for h, node in state.nodes.items() if node.cached}
                assert cached == pages
                assert state.ranks[0].num_cached == len(cached)
    assert state.removed_hashes() and all(node.block_size == page_size for node in state.nodes.values())
    assert all(gap.num_recovered == gap.last_seq - gap.first_seq + 1 for gap in state.gaps), state.gaps
    assert "map events" in state.wire_summary() and "SGLang's shape too" in state.wire_summary()


@pytest.mark.anyio
async def test_attach_draws_what_sglangs_publisher_sends(sglang_steps):
    from sglang.srt.disaggregation.kv_events import KVEventBatch

    from blockviz.tui.attach_app import AttachApp

    steps = sglang_steps[4]
    with sglang_publisher() as (publisher, endpoint, _):
        app = AttachApp(endpoint)
        async with app.run_test(size=(120, 36)) as pilot:
            deadline = time.monotonic() + WAIT_S
            while app.state.num_batches == 0 and time.monotonic() < deadline:  # until the subscription is through
                publisher.publish(KVEventBatch(ts=time.time(), events=[]))
                await pilot.pause(0.05)
            seen = app.state.num_batches
            for events, _ in steps:
                publisher.publish(KVEventBatch(ts=time.time(), events=events))
            while app.state.num_batches < seen + len(steps) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await pilot.pause()
            text = screen_text(app)
    pages = steps[-1][1]
    stored = {h for events, _ in steps for e in events for h in getattr(e, "block_hashes", ())
              if type(e).__name__ == "BlockStored"}
    assert app.state.num_cached == len(pages) and set(pages) <= stored
    assert f"{len(app.state.nodes)} blocks seen, {len(pages)} cached now" in text, text
    assert f"from {endpoint}" in text
