"""The live app's own CPU time per run (a benchmark, not a test), with the engine out of the way.

    python benchmarks/app_cpu.py [--runs 6] [--sessions 3] [--model DIR] [--max-tokens 256]
    python benchmarks/app_cpu.py --smoke    # 8 tokens a request, one session of 2 runs: a check that it runs

benchmarks/tui.py measures what the TUI costs the engine, a wall-clock ratio that this machine's
drifting speed blurs by several percent. This measures the app's side alone, in CPU time: it
records the events of benchmarks/tui.py's workload once (16 requests x 256 tokens on the bundled
model, the K/V digests paced as under the app at full speed) with each step's duration, then runs
`blockviz run`'s app (headless, 120x36, playing at "max") over an engine process that replays
those events at the recorded pace and sleeps in between, so the engine's process takes almost no
CPU. It prints the app process's CPU time per run (from pressing play to hearing the engine
finished), the median and minimum per session, and how many objects the garbage collector tracks
in the app at the end. Compare two versions of the app by running this on each, sessions
interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import pickle
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from blockviz.session.spec import EngineSpec  # noqa: E402


def record(model: str, path: Path, max_tokens: int = 256) -> int:
    """The workload's events, per request added and per step (with the step's duration)."""
    from tui import PROMPTS, DigestPacer, _spec

    spec = _spec(model, max_tokens)
    engine = spec.make_engine()
    for prompt in PROMPTS:  # warm-up
        engine.add_request(prompt, spec.sampling_params())
    while engine.has_unfinished_requests():
        engine.step()
    from blockviz.session.engine_session import EngineSession

    session = EngineSession(spec, engine=engine)  # the events as the app gets them (prompt texts filled)
    requests, steps = [], []
    for prompt in PROMPTS:
        session.add_request(prompt)
        requests.append(session.take_events())
    pacer = DigestPacer(engine)
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        pacer.after_step()
        steps.append([time.perf_counter() - start, session.take_events()])
    pacer.finish()
    steps[-1][1].extend(session.take_events())
    path.write_bytes(pickle.dumps({"header": session.header, "requests": requests, "steps": steps}))
    return sum(len(step_events) for _, step_events in steps)


class ReplayEngine:
    """What an engine session needs of an engine: each add_request delivers the next recorded request's
    events, each step the next step's events, then sleeps out the step's recorded duration."""

    def __init__(self, path: str) -> None:
        from engine.events import EventBus

        self.data = pickle.loads(Path(path).read_bytes())
        self.events = EventBus()
        self.next_request = 0
        self.next_step = len(self.data["steps"])
        # what the engine session's trace_header reads: the recorded engine's settings
        from types import SimpleNamespace

        from engine.kv_sizing import BlockBudget
        from engine.config import EngineConfig

        h = self.data["header"]
        self.config = EngineConfig(model=h["model"], block_size=h["block_size"],
                                   enable_prefix_caching=h["enable_prefix_caching"],
                                   preemption_mode=h["preemption_mode"], device=h["device"])
        self.budget = BlockBudget(h["num_gpu_blocks"], h["num_cpu_blocks"], h["block_bytes"], h["budget_source"],
                                  h["total_bytes"], h["peak_bytes"], h["gpu_memory_utilization"])
        self.device, self.max_model_len = h["device"], h["max_model_len"]
        geometry = SimpleNamespace(model_type=h.get("model_type", "gpt2"), num_layers=h["num_layers"],
                                   num_heads=h.get("num_heads", h["num_kv_heads"]), num_kv_heads=h["num_kv_heads"],
                                   head_dim=h["head_dim"])
        self.loaded = SimpleNamespace(dtype=h["dtype"], config=geometry)

    def check_request(self, prompt, params) -> None:
        """Every recorded request was accepted when it was recorded."""

    def set_kv_digests_per_step(self, per_step: bool) -> None:
        """The recorded steps carry the digests as they were paced when recorded."""

    def emit_kv_digests(self) -> None:
        """Nothing held back (see set_kv_digests_per_step)."""

    def add_request(self, prompt, params) -> None:
        for event in self.data["requests"][self.next_request % len(self.data["requests"])]:
            self.events.deliver(event)
        self.next_request += 1
        self.next_step = 0

    def has_unfinished_requests(self) -> bool:
        return self.next_step < len(self.data["steps"])

    def step(self) -> list:
        seconds, events = self.data["steps"][self.next_step]
        self.next_step += 1
        start = time.perf_counter()
        for event in events:
            self.events.deliver(event)
        time.sleep(max(0.0, seconds - (time.perf_counter() - start)))
        return []


@dataclass(slots=True)
class ReplaySpec(EngineSpec):
    stream: str = ""

    def make_engine(self):
        return ReplayEngine(self.stream)


async def session(stream: Path, runs: int) -> tuple[list[float], int]:
    from blockviz.tui.app import BlockvizApp
    from blockviz.session.engine_process import ProcessBridge
    from blockviz.model.player import SPEEDS
    from tui import PROMPTS, play_to_idle

    idle = asyncio.Event()
    finished_at = [0.0]

    class App(BlockvizApp):
        def on_engine_idle(self, message) -> None:  # BlockvizApp's handler runs next
            finished_at[0] = time.process_time()
            idle.set()

    from engine.config import EngineConfig

    bridge = ProcessBridge(ReplaySpec(EngineConfig(model="replay"), prompts=(), stream=str(stream)))
    bridge.start()
    app = App(bridge=bridge, deterministic=True)
    cpu: list[float] = []
    async with app.run_test(size=(120, 36)) as pilot:
        while app.player is None:
            if app.error:
                raise RuntimeError(app.error)
            await pilot.pause(0.05)
        await pilot.pause(0.5)
        app.player.speed_index = len(SPEEDS) - 1
        for _ in range(runs):
            played = await play_to_idle(app, bridge, PROMPTS, pilot, idle)
            cpu.append(finished_at[0] - played["cpu_start"])
            await pilot.pause(0.5)
        tracked = len(gc.get_objects())
    return cpu, tracked


def _in_child(*args: str) -> str:
    """This script in a fresh Python process (the app's must not hold the recording's torch and
    model: they would make every full garbage collection there several times longer)."""
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")
    return done.stdout.strip().splitlines()[-1]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny-shakespeare")
    parser.add_argument("--runs", type=int, default=6, help="runs per session (the first is reported apart)")
    parser.add_argument("--sessions", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per request in the recorded workload")
    parser.add_argument("--smoke", action="store_true", help="8 tokens a request, one session of 2 runs")
    parser.add_argument("--record", help=argparse.SUPPRESS)  # record into this file, in this process
    parser.add_argument("--session", help=argparse.SUPPRESS)  # one session over this file, as JSON
    args = parser.parse_args(argv)
    if args.smoke:
        args.max_tokens, args.sessions, args.runs = 8, 1, 2
    if args.record:
        print(record(args.model, Path(args.record), args.max_tokens))
        return 0
    if args.session:
        cpu, tracked = asyncio.run(session(Path(args.session), args.runs))
        print(json.dumps({"cpu": cpu, "tracked": tracked}))
        return 0
    with tempfile.TemporaryDirectory(prefix="blockviz-bench-") as folder:  # removed at the end, as on an error
        return _measure(args, Path(folder) / "events.pickle")


def _measure(args, stream: Path) -> int:
    """Record the workload's events into `stream` (in a process of its own), then time the app
    playing them in `args.sessions` fresh processes; print the figures."""
    print(f"recording the workload's events on {args.model}...", flush=True)
    count = int(_in_child("--record", str(stream), "--model", args.model, "--max-tokens", str(args.max_tokens)))
    print(f"{count} events in {len(pickle.loads(stream.read_bytes())['steps'])} steps; "
          f"{args.sessions} sessions x {args.runs} runs of the app playing them at max", flush=True)
    medians = []
    for number in range(args.sessions):
        result = json.loads(_in_child("--session", str(stream), "--runs", str(args.runs)))
        cpu = result["cpu"]
        rest = cpu[1:] or cpu
        medians.append(statistics.median(rest))
        print(f"  session {number + 1}: app CPU per run {' '.join(f'{c * 1000:.0f}' for c in cpu)} ms "
              f"(median after the first {medians[-1] * 1000:.1f}, min {min(rest) * 1000:.1f}); "
              f"{result['tracked']:,} objects tracked at the end", flush=True)
    print(f"app CPU per run: median of sessions {statistics.median(medians) * 1000:.1f} ms")
    print("figures: " + json.dumps({"app CPU ms per run": round(statistics.median(medians) * 1000, 4)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
