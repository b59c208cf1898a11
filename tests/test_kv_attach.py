"""`blockviz attach` and `blockviz publish` at the edges: the app under Pilot (with a real
publisher, and with a scripted client), one-line CLI errors, and no torch in attach's process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from blockviz.kvevents.mapping import step_batches
from blockviz.kvevents.protocol import BlockRemoved, BlockStored, EventBatch, WireShape
from blockviz.kvevents.publisher import KVEventPublisher
from blockviz.kvevents.state import KVEventState
from blockviz.kvevents.subscriber import ClientUpdate, Gap, Received
from blockviz.kvevents.tokens import load_tokenizer
from blockviz.model.trace import load_trace
from blockviz.tui.attach_app import AttachApp
from blockviz.tui.messages import KVEventsArrived
from blockviz.tui.widgets.kv_attach import ForestTree
from test_kv_round_trip import WAIT_S, free_ports
from test_tui_app import anyio_backend, screen_text  # noqa: F401  (the anyio backend and screen text of the TUI tests)

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent




async def wait_until(pilot, condition) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition() and time.monotonic() < deadline:
        await pilot.pause(0.05)
    await pilot.pause()


async def test_attach_waits_without_a_server_and_says_what_vllm_does_not_send():
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    app = AttachApp(endpoint)
    async with app.run_test(size=(120, 36)) as pilot:
        await pilot.pause()
        text = screen_text(app)
        assert f"waiting for events on {endpoint}" in text
        for what in ("physical block ids", "block tables", "ref counts"):
            assert any(what in line and "not sent by vLLM" in line for line in text.splitlines()), what
        await pilot.press("q")


async def test_attach_draws_the_forest_a_publisher_sends_with_token_text():
    trace = load_trace("prefix-hit")
    batches = list(step_batches(trace.events, trace.block_size))
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    with KVEventPublisher(endpoint) as publisher:
        app = AttachApp(endpoint, tokens=load_tokenizer("tiny-shakespeare"))
        async with app.run_test(size=(120, 36)) as pilot:
            assert await asyncio.to_thread(publisher.wait_for_subscribers, 1, WAIT_S)
            for events in batches:
                publisher.publish(events)
            await wait_until(pilot, lambda: app.state.num_batches == len(batches))
            text = screen_text(app)
    assert "10 blocks seen, 10 cached now" in text
    assert "ROMEO:·But·so" in text and "·It·is·my" in text  # both continuations under one prefix
    assert "none: every batch arrived in order" in text
    assert "not sent by vLLM" in text and f"{len(batches)} batches from {endpoint}" in text


class ScriptedClient:
    """A KVEventClient stand-in: catch_up and poll hand out prepared updates, then nothing."""

    def __init__(self, updates: list[ClientUpdate]) -> None:
        self.updates = updates

    def catch_up(self) -> ClientUpdate:
        return self.updates.pop(0) if self.updates else ClientUpdate()

    def poll(self, timeout_ms: int = 0) -> ClientUpdate:
        if self.updates:
            return self.updates.pop(0)
        time.sleep(timeout_ms / 1000)
        return ClientUpdate()

    def close(self) -> None:
        pass


def batch(seq: int, *events, rank: int = 0, replayed: bool = False) -> Received:
    return Received(rank, seq, EventBatch(float(seq), events, rank), replayed)


async def test_attach_shows_removals_gaps_and_token_ids_without_a_tokenizer():
    updates = [
        ClientUpdate([batch(0, BlockStored((0xAB << 56, 2), None, (31, 32, 33, 34), 2))]),
        ClientUpdate([batch(3, BlockRemoved((2,)))], gaps=[Gap(0, 1, 2, 1, True, False)],
                     notices=["rank 0 #2: not msgpack: skipped"]),
    ]
    app = AttachApp("tcp://vllm:5557", "tcp://vllm:5558", client_factory=lambda *a, **k: ScriptedClient(updates))
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.state.num_batches == 2)
        text = screen_text(app)
    assert "ab000000 31 32  rank 0" in text  # no tokenizer: the ids
    assert "00000000 33 34  removed" in text
    assert "rank 0: missed #1-#2 (1 replayed, 1 lost)" in text and "not msgpack" in text
    assert "1 batch lost" in text


async def test_attach_shows_tiers_groups_the_wire_and_a_restart():
    """vLLM 0.33's newest fields where they matter: a block offloaded to a remote CPU tier, the
    KV-cache group's kind, the wire format seen (with the replay's topic frame), and a publisher
    restart that starts the rank's picture again."""
    map_events = WireShape(batch_array=True, event_arrays=False)
    updates = [
        ClientUpdate([
            Received(0, 0, EventBatch(0.0, (BlockStored((0xAB << 56,), None, (31, 32), 2, medium="GPU", group_idx=0,
                                                        kv_cache_spec_kind="full_attention", session_id="chat-7"),), 0),
                     True, map_events),
            Received(0, 1, EventBatch(1.0, (BlockStored((0xCD << 56,), 0xAB << 56, (33, 34), 2, medium="CPU",
                                                        locality="REMOTE", ownership="kvcr"),), 0), True, map_events),
        ], replay_topic=True),
        ClientUpdate([Received(0, 0, EventBatch(2.0, (BlockStored((0xEF << 56,), None, (35, 36), 2, medium="GPU"),), 0),
                               False, map_events, restarted=True)],
                     notices=["rank 0: sequence numbers went back from #1 to #0: the publisher restarted; "
                              "the picture of this rank starts again"]),
    ]
    app = AttachApp("tcp://vllm:5557", "tcp://vllm:5558", client_factory=lambda *a, **k: ScriptedClient(updates[:1]))
    async with app.run_test(size=(180, 40)) as pilot:
        await wait_until(pilot, lambda: app.state.num_batches == 2)
        before = screen_text(app)
        app.post_message(KVEventsArrived(updates[1]))
        await wait_until(pilot, lambda: app.state.num_batches == 3)
        after = screen_text(app)
    assert "ab000000 31 32  rank 0  session chat-7" in before
    assert "cd000000 33 34  rank 0 CPU remote" in before  # the tier, where it is not the GPU
    assert "CPU remote" in before and "KV-cache groups: 0 full_attention" in before
    assert "wire vLLM 0.26 or later: array batch, map events, topic in replay" in before
    assert "ab000000 31 32  removed" in after and "ef000000 35 36  rank 0" in after  # reset at the restart
    assert "publisher restarted 1×" in after and "went back from #1 to #0" in after


async def test_the_forest_drops_blocks_removed_long_ago():
    """With room for two removed blocks: a forgotten block with a child drawn under it redraws the
    tree (the child now hangs from the root), a forgotten leaf is just removed."""
    a, b, c, d, e = (h << 56 for h in (0xA1, 0xB2, 0xC3, 0xD4, 0xE5))
    steps = [[BlockStored((a, b, c), None, (1, 2, 3), 1)], [BlockRemoved((a,))], [BlockRemoved((b,))],
             [BlockRemoved((c,))], [BlockStored((d,), None, (4,), 1), BlockRemoved((d,))],
             [BlockStored((e,), None, (5,), 1), BlockRemoved((e,))]]
    updates = [ClientUpdate([batch(seq, *events)]) for seq, events in enumerate(steps)]
    app = AttachApp("tcp://vllm:5557", client_factory=lambda *a, **k: ScriptedClient(updates))
    app.state = KVEventState(max_removed_kept=2)
    async with app.run_test(size=(120, 36)) as pilot:
        await wait_until(pilot, lambda: app.state.num_batches == len(steps))
        text = screen_text(app)
        drawn = sorted(app.query_one(ForestTree)._drawn)
    assert drawn == [d, e] and "2 blocks seen, 0 cached now, 3 removed long ago not shown" in text
    assert "d4000000 4  removed" in text and "a1000000" not in text and "c3000000" not in text


# ------------------------------------------------------------------------- the command line


def blockviz(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blockviz", *args], capture_output=True, text=True, cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("args", "expected"), [
    (["attach", "localhost:5557"], "ENDPOINT must look like tcp://HOST:PORT"),
    (["attach", "tcp://host"], "ENDPOINT must look like tcp://HOST:PORT"),
    (["attach", "tcp://host:70000"], "port 70000 is not between 1 and 65535"),
    (["attach", "tcp://host:5557", "--replay", "5558"], "--replay must look like tcp://HOST:PORT"),
    (["attach", "tcp://host:65535", "--data-parallel-size", "2"], "port 65535 is not between 1 and 65534"),
    (["attach", "ipc:///tmp/kv", "--data-parallel-size", "2"], "need a tcp:// endpoint"),
    (["attach", "tcp://host:5557", "--data-parallel-size", "0"], "--data-parallel-size must be at least 1"),
    (["attach", "tcp://host:5557", "--tokenizer", "./no/such/tokenizer"], "no such file or directory"),
    (["attach"], "the following arguments are required: ENDPOINT"),
    (["publish"], "give a TRACE to publish, or --live"),
    (["publish", "prefix-hit", "--live"], "not both"),
    (["publish", "no-such-trace"], "does not exist (shipped traces:"),
    (["publish", "prefix-hit", "--endpoint", "tcp://127.0.0.1"], "--endpoint must look like"),
    (["publish", "prefix-hit", "--rate", "-1"], "--rate must be a finite number >= 0"),
    (["publish", "--live", "--no-prefix-caching"], "without a prefix cache"),
    (["publish", "prefix-hit", "--vllm-version", "0.8"], "blockviz knows the KV events of vLLM 0.9 to 0.33"),
    (["publish", "prefix-hit", "--vllm-version", "newest"], "--vllm-version must look like 0.33"),
    (["attach", "tcp://[1::2::3]:5557"], "[1::2::3] is not an IPv6 address"),
])
def test_bad_input_is_one_line_and_exit_2(args, expected):
    result = blockviz(*args)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_publish_on_a_port_in_use_is_one_line_and_exit_2():
    endpoint = f"tcp://127.0.0.1:{free_ports(1)[0]}"
    with KVEventPublisher(endpoint):
        result = blockviz("publish", "prefix-hit", "--endpoint", endpoint)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert f"cannot bind {endpoint}" in result.stderr


def test_attach_reaches_its_first_frame_without_importing_torch():
    """With the bundled tokenizer too: `tokenizers` reads it, transformers and torch stay out."""
    port = free_ports(1)[0]
    script = textwrap.dedent(f"""
        import asyncio, json, sys
        from blockviz.tui.attach_app import AttachApp
        from blockviz.cli import main
        seen = {{}}
        def headless_run(self, **kwargs):
            async def go():
                async with self.run_test(size=(100, 30)) as pilot:
                    await pilot.pause()
                    text = "\\n".join("".join(s.text for s in strip)
                                     for strip in self.screen._compositor.render_strips())
                    seen["frame"] = "waiting for events on tcp://127.0.0.1:{port}" in text
            asyncio.run(go())
        AttachApp.run = headless_run
        seen["rc"] = main(["attach", "tcp://127.0.0.1:{port}", "--tokenizer", "tiny-shakespeare"])
        seen["torch"] = "torch" in sys.modules or "transformers" in sys.modules
        print(json.dumps(seen))
    """)
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60,
                            cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"frame": True, "rc": 0, "torch": False}
