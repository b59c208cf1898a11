"""Jupyter widgets benchmark (figures, not a test): what a frame costs, and what watching costs the engine.

    python benchmarks/widgets.py                    # all three parts (2 and 3 need chromium)
    python benchmarks/widgets.py --part frame       # 1 only: no browser, no torch
    python benchmarks/widgets.py --runs 5 --max-tokens 96
    python benchmarks/widgets.py --part browser --runs 0 --renderer both   # 2 only: the two pool renderers
    python benchmarks/widgets.py --smoke            # every part, 2 frames a case, one 8-token run: a check
                                                    # that it runs (without chromium, part 2 and 3 say why)

1. Kernel-side cost of one frame on a 4,096-block GPU pool (and 512 CPU blocks), in this process:
   snapshot() alone, the whole frame (snapshot, event log, cursor line), its JSON encoding, the
   frame handed to the views (`Visualizer._send_frame`, traitlets and ipywidgets' state sync with
   no frontend; the insight sections closed, as they start), and the insight views' parts (the
   explainer, ledger and memory, sent when their section is open). Target: <= 20 ms for snapshot + sync.
   Then the same for a 200,000-block GPU pool (`--big-pool`; the size vLLM's sizing gives a GPU),
   drawn zoomed out (blockviz/model/pool_zoom.py: per-cell state counts, not a column per block),
   during playback (one event a frame), and zoomed into a range of 256 blocks.
2. The same pool in JupyterLab and Debian's chromium (tests/jupyter_fixtures.py): in the kernel,
   `_send_frame()` with a real comm; in the page, the pool view's draw of that frame with the
   layout it causes (its data-render-ms) and the time until the next frame is painted (its
   data-paint-ms: a canvas rasterizes there, as cells paint), for frames that change every cell
   (the cursor flips between an empty and a full pool) and for playback (one event a frame). Both
   renderers (PoolView.renderer "cells" and "canvas", `--renderer`) are displayed in the page,
   each scrolled into view for its frames, and measured alternately. Target: <= 50 ms.
3. Tokens/s of the bundled model's engine with a live Visualizer attached (displayed in the page,
   playing at "max": the engine on the play thread, frames going out at up to 20/s and drawn by the
   browser) against the same workload with nothing attached (`LLM.generate`), in the same kernel, each run
   on a freshly built LLM (loading is not timed) and on a thread of its own, as the play thread is
   (in the kernel, generating on its main thread measured several times slower than on a thread),
   alternating alone / attached / alone / ...; each attached run is read against the mean of its
   two alone neighbours, which cancels a slow drift of the machine's speed. Target: >= 0.9x.

Figures go to benchmarks/README.md, never into code.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

NUM_GPU_BLOCKS = 4096
NUM_CPU_BLOCKS = 512
BLOCK_SIZE = 16


def synthetic_events(num_gpu_blocks: int = NUM_GPU_BLOCKS, block_size: int = BLOCK_SIZE):
    """A full pool: 256 requests of 16 blocks each (the last one partly filled), every other one
    forked (its blocks shared, ref count 2), ending with a step_finished. Real event classes, fed
    to the real reducer; only the engine is left out."""
    from engine import events as ev

    seq_no = iter(range(10**9))
    events = []
    blocks_per_seq = 16
    num_seqs = num_gpu_blocks // blocks_per_seq
    block = 0
    for seq_id in range(num_seqs):
        num_tokens = blocks_per_seq * block_size - block_size // 2
        tokens = tuple((seq_id * 7 + i) % 300 for i in range(num_tokens))
        events.append(ev.RequestAdded(next(seq_no), str(seq_id), (seq_id,), "", tokens, ("x",) * num_tokens, 1, 16))
        for index in range(blocks_per_seq):
            chunk = tokens[index * block_size:(index + 1) * block_size]
            events.append(ev.BlockAllocated(next(seq_no), "gpu", block, (seq_id,), index, 1, None, chunk))
            block += 1
    for seq_id in range(0, num_seqs, 2):
        child = num_seqs + seq_id
        events.append(ev.Forked(next(seq_no), seq_id, child, "gpu",
                                tuple(range(seq_id * blocks_per_seq, (seq_id + 1) * blocks_per_seq))))
    events.append(ev.StepFinished(next(seq_no), 1, "prefill", block * block_size, 0.0))
    return events


def write_synthetic_trace(path: Path) -> Path:
    from blockviz.model.trace import make_header, write_trace

    header = make_header({"model": "synthetic", "block_size": BLOCK_SIZE, "num_gpu_blocks": NUM_GPU_BLOCKS,
                          "num_cpu_blocks": NUM_CPU_BLOCKS})
    write_trace(path, header, synthetic_events())
    return path


def median_ms(samples: list[float]) -> str:
    return f"{statistics.median(samples) * 1e3:.2f} ms (min {min(samples) * 1e3:.2f}, max {max(samples) * 1e3:.2f})"


# ---------------------------------------------------------------------------- 1. kernel side, no frontend


def part_frame(repeats: int = 30) -> dict[str, float]:
    from blockviz.jupyter import Visualizer, snapshot

    with tempfile.TemporaryDirectory() as tmp:
        viz = Visualizer.from_trace(write_synthetic_trace(Path(tmp) / "synthetic.jsonl"))
    viz.seek(len(viz))
    viz.select("gpu", 0)
    state = viz.state
    used = state.num_used("gpu")
    print(f"1. one frame, {NUM_GPU_BLOCKS} GPU + {NUM_CPU_BLOCKS} CPU blocks ({used} used, "
          f"{len(state.tables)} block tables), kernel side, no frontend ({repeats} frames each)")
    sync_name = f"_send_frame (frame + sync of {len(viz.views)} views)"
    timings: dict[str, list[float]] = {"snapshot()": [], "frame (+ log, cursor)": [], "json.dumps(frame)": [],
                                       sync_name: [], "insight parts (explain, ledger, memory)": []}
    positions = (len(viz), len(viz) // 2)
    for i in range(repeats):
        viz.timeline.seek(positions[i % 2])
        t0 = time.perf_counter()
        snapshot(viz.state, current=viz.current_event, selected=viz.selected)
        t1 = time.perf_counter()
        frame = viz.frame()
        t2 = time.perf_counter()
        encoded = json.dumps(frame)
        t3 = time.perf_counter()
        viz._send_frame()
        t4 = time.perf_counter()
        viz.insight.parts()
        t5 = time.perf_counter()
        timings["snapshot()"].append(t1 - t0)
        timings["frame (+ log, cursor)"].append(t2 - t1)
        timings["json.dumps(frame)"].append(t3 - t2)
        timings[sync_name].append(t4 - t3)
        timings["insight parts (explain, ledger, memory)"].append(t5 - t4)
    for name, samples in timings.items():
        print(f"   {name:40s} {median_ms(samples)}")
    print(f"   frame size: {len(encoded) / 1024:.0f} KiB of JSON")
    viz.close()
    return {f"{name} ms": statistics.median(samples) * 1e3 for name, samples in timings.items()}


def part_big_pool(num_blocks: int, repeats: int) -> dict[str, float]:
    """Part 1 on a pool of `num_blocks` GPU blocks (the synthetic trace's 4,096 blocks used, the
    rest free): one event a frame (playback), the whole pool zoomed out, then a range zoomed into."""
    from blockviz.jupyter import Visualizer, snapshot
    from blockviz.model.trace import Trace, make_header

    header = make_header({"model": "synthetic", "block_size": BLOCK_SIZE, "num_gpu_blocks": num_blocks,
                          "num_cpu_blocks": NUM_CPU_BLOCKS})
    t0 = time.perf_counter()
    viz = Visualizer.from_trace(Trace(header, synthetic_events()))
    viz.seek(len(viz) // 2)
    print(f"1b. one frame, {num_blocks:,} GPU blocks zoomed out ({len(viz.frame()['pools']['gpu']['state'])} cells; "
          f"Visualizer built in {time.perf_counter() - t0:.1f} s), one event a frame ({repeats} frames each)")
    timings: dict[str, list[float]] = {"big pool snapshot()": [], "big pool _send_frame": [],
                                       "big pool zoomed into 256 blocks _send_frame": []}
    for i in range(repeats):
        viz.timeline.forward(1)
        t0 = time.perf_counter()
        snapshot(viz.state, current=viz.current_event, selected=viz.selected)
        t1 = time.perf_counter()
        viz._send_frame()
        t2 = time.perf_counter()
        timings["big pool snapshot()"].append(t1 - t0)
        timings["big pool _send_frame"].append(t2 - t1)
    encoded = json.dumps(viz.frame())
    viz.pool_ranges["gpu"] = (2048, 2304)
    for i in range(repeats):
        viz.timeline.forward(1)
        t0 = time.perf_counter()
        viz._send_frame()
        timings["big pool zoomed into 256 blocks _send_frame"].append(time.perf_counter() - t0)
    for name, samples in timings.items():
        print(f"   {name:44s} {median_ms(samples)}")
    print(f"   frame size zoomed out: {len(encoded) / 1024:.0f} KiB of JSON")
    viz.close()
    return {f"{name} ms": statistics.median(samples) * 1e3 for name, samples in timings.items()}


# ---------------------------------------------------------------------------- 2 and 3: in the browser

SETUP_CELLS = [
    "import ipywidgets, statistics, threading, time\n"
    "from blockviz.jupyter import Visualizer\n"
    "box = ipywidgets.VBox([])\n"
    "box",
    # helpers the benchmark calls through the kernel
    "def frame_costs(viz, repeats):\n"
    "    out = []\n"
    "    for i in range(repeats):\n"
    "        viz.timeline.seek(len(viz) if i % 2 else len(viz) // 2)\n"
    "        t0 = time.perf_counter(); viz._send_frame(); out.append(time.perf_counter() - t0)\n"
    "    return out\n"
    "\n"
    "from engine.llm import LLM\n"
    "from engine.sequence import SamplingParams\n"
    "def workload(max_tokens):\n"
    "    return ['ROMEO:', 'JULIET:', 'KING HENRY:', 'First Citizen:'], SamplingParams(max_tokens=max_tokens, ignore_eos=True)\n"
    "def run_alone(max_tokens):\n"
    "    prompts, params = workload(max_tokens)\n"
    "    llm = LLM()\n"
    "    time.sleep(0.5)\n"
    "    outs = []\n"
    "    worker = threading.Thread(target=lambda: outs.extend(llm.generate(prompts, params)))\n"
    "    t0 = time.perf_counter(); worker.start(); worker.join(); dt = time.perf_counter() - t0\n"
    "    return sum(len(o.outputs[0].token_ids) for o in outs) / dt\n"
    "def run_attached(max_tokens):\n"
    "    prompts, params = workload(max_tokens)\n"
    "    viz = Visualizer.live(LLM(), prompts=prompts, sampling_params=params)\n"
    "    box.children = [viz.widget]\n"
    "    time.sleep(0.5)\n"
    "    t0 = time.perf_counter(); viz.play('max'); viz._play_thread.join(); dt = time.perf_counter() - t0\n"
    "    tokens = sum(len(o.outputs[0].token_ids) for o in viz.outputs)\n"
    "    box.children = []; viz.close()\n"
    "    return tokens / dt\n",
]


POOL_VIEW_JS = ("[...document.querySelectorAll('.bv-view-pool')].find((e) => "
                "e.querySelector(r === 'cells' ? '.bv-cell' : 'canvas'))")


def draw_frame(page, renderer: str, position: int) -> tuple[float, float]:
    """Seek the Visualizer whose pool view draws with `renderer` to `position` and send the frame to
    that pool view alone (the other views keep theirs, so nothing else draws), its pool view
    scrolled into view; return the draw + layout and the time until the next frame was painted (ms)."""
    from jupyter_fixtures import kernel_json

    before = page.evaluate(f"""(r) => {{
        const view = {POOL_VIEW_JS};
        view.scrollIntoView({{ block: "start" }});
        return Number(view.dataset.renders || 0);
    }}""", renderer)
    page.evaluate("() => new Promise((done) => requestAnimationFrame(() => setTimeout(done)))")
    kernel_json(page, f"[_bv[{renderer!r}].timeline.seek({position}), _bv[{renderer!r}].pools.show(_bv[{renderer!r}]"
                      f".frame()), 0][-1]")
    page.wait_for_function(f"([r, before]) => Number(({POOL_VIEW_JS}).dataset.renders || 0) > before",
                           arg=[renderer, before], timeout=60_000)
    return tuple(page.evaluate(f"(r) => {{ const d = ({POOL_VIEW_JS}).dataset; "
                               f"return [Number(d.renderMs), Number(d.paintMs)]; }}", renderer))


def part_browser(runs: int, max_tokens: int, renderers: tuple[str, ...], repeats: int = 20) -> dict[str, float]:
    try:
        from jupyter_fixtures import (CHROMIUM, DRAWN_BLOCKS_JS, kernel_json, launch_args, open_notebook,
                                      run_all_cells, start_jupyter_server)
        from playwright.sync_api import sync_playwright

        import jupyterlab  # noqa: F401  (the server start_jupyter_server runs)
    except ImportError as exc:
        print(f"unavailable: parts 2 and 3 need JupyterLab and playwright: {exc}")
        return {}
    if not shutil.which(CHROMIUM):
        print(f"unavailable: parts 2 and 3 need Debian's chromium at {CHROMIUM} (apt-get install -y chromium)")
        return {}
    figures: dict[str, float] = {}
    with start_jupyter_server() as server, sync_playwright() as playwright:
        browser = playwright.chromium.launch(**launch_args())
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        write_synthetic_trace(server.root_dir / "synthetic.jsonl")
        path = server.add_notebook("bench.ipynb", SETUP_CELLS)
        open_notebook(page, server, path)
        run_all_cells(page)
        while not kernel_json(page, "'run_attached' in globals()"):  # run-all-cells was fired, not awaited
            page.wait_for_timeout(250)

        # 2. a 4,096-block frame: kernel side with a real comm, and the browser's draw by each renderer
        kernel_json(page, "[(_bv := {r: Visualizer.from_trace('synthetic.jsonl') for r in %r}), "
                          "[setattr(v.pools, 'renderer', r) for r, v in _bv.items()], "
                          "setattr(box, 'children', [v.widget for v in _bv.values()]), 0][-1]" % (renderers,))
        total = NUM_GPU_BLOCKS + NUM_CPU_BLOCKS
        page.wait_for_function(f"() => ({DRAWN_BLOCKS_JS})().length === {total * len(renderers)}", timeout=120_000)
        kernel_costs = kernel_json(page, f"frame_costs(_bv[{renderers[0]!r}], {repeats})")
        length = kernel_json(page, f"len(_bv[{renderers[0]!r}])")
        print(f"2. the {NUM_GPU_BLOCKS}-block frame in JupyterLab + chromium ({repeats} frames a case, "
              f"the renderers alternating)")
        print(f"   kernel: _send_frame() with a real comm   {median_ms(kernel_costs)}")
        figures["_send_frame with a comm ms"] = statistics.median(kernel_costs) * 1e3
        # worst case: the cursor flips between an empty and a full pool; playback: one event a frame
        # (a block allocated: one cell and the touched outlines change)
        cases = {"every cell changing": [length if i % 2 == 0 else 0 for i in range(repeats + 1)],
                 "playback, one event a frame": [length // 4 + i for i in range(repeats + 1)]}
        idle = [page.evaluate("() => { const t = performance.now(); return new Promise((done) => "
                              "requestAnimationFrame(() => setTimeout(() => done(performance.now() - t)))); }") / 1e3
                for _ in range(repeats)]
        print(f"   browser, until the next frame is painted when nothing is drawn  {median_ms(idle)}")
        shown = kernel_json(page, "{r: v.position for r, v in _bv.items()}")  # what each pool view shows
        for case, positions in cases.items():
            draws: dict[str, list[float]] = {r: [] for r in renderers}
            paints: dict[str, list[float]] = {r: [] for r in renderers}
            for i, position in enumerate(positions):
                order = renderers if i % 2 == 0 else renderers[::-1]
                for renderer in order:
                    if shown[renderer] == position:
                        continue  # the same frame again: nothing to draw
                    draw, paint = draw_frame(page, renderer, position)
                    shown[renderer] = position
                    if i > 0:  # the first frame of a case (from another case's position) is not timed
                        draws[renderer].append(draw / 1e3)
                        paints[renderer].append(paint / 1e3)
            for renderer in renderers:
                print(f"   browser, {renderer:6s} {case}: draw + layout {median_ms(draws[renderer])}")
                figures[f"{renderer} {case} draw ms"] = statistics.median(draws[renderer]) * 1e3
                print(f"   {'':16s} until the next frame is painted {median_ms(paints[renderer])}")
            if len(renderers) == 2:
                ratio = statistics.median(draws[renderers[1]]) / statistics.median(draws[renderers[0]])
                print(f"   {renderers[1]} / {renderers[0]} draw + layout: {ratio:.2f}x")
        kernel_json(page, "[setattr(box, 'children', []), [v.close() for v in _bv.values()], 0][-1]")

        # 3. tokens/s attached against alone, alternating
        kernel_json(page, f"run_alone({max_tokens})")  # warm-up
        alone = [kernel_json(page, f"run_alone({max_tokens})")]
        attached = []
        for _ in range(runs):
            attached.append(kernel_json(page, f"run_attached({max_tokens})"))
            alone.append(kernel_json(page, f"run_alone({max_tokens})"))
        ratios = [a / ((alone[i] + alone[i + 1]) / 2) for i, a in enumerate(attached)]
        print(f"3. engine tokens/s, 4 requests x {max_tokens} tokens, bundled model, {runs} attached runs")
        print(f"   alone:    {', '.join(f'{v:.0f}' for v in alone)}")
        print(f"   attached: {', '.join(f'{v:.0f}' for v in attached)}  (Visualizer displayed, playing at max)")
        if ratios:
            print(f"   ratio to neighbours: {', '.join(f'{r:.3f}' for r in ratios)}; "
                  f"median {statistics.median(ratios):.3f}x")
            figures["attached / alone"] = statistics.median(ratios)
        browser.close()
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("all", "frame", "browser"), default="all")
    parser.add_argument("--runs", type=int, default=4, help="attached runs in part 3")
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens per request in part 3 (runs under ~0.5 s read mostly noise)")
    parser.add_argument("--renderer", choices=("both", "cells", "canvas"), default="both",
                        help="the pool view's renderer(s) in part 2, side by side (PoolView.renderer)")
    parser.add_argument("--repeats", type=int, default=None, help="frames per case (default 30 in part 1, 20 in 2)")
    parser.add_argument("--big-pool", type=int, default=200_000, help="GPU blocks of part 1's big pool")
    parser.add_argument("--smoke", action="store_true", help="every part briefly: 2 frames a case, one 8-token run")
    args = parser.parse_args(argv)
    if args.smoke:
        args.part, args.runs, args.max_tokens, args.renderer, args.repeats = "all", 1, 8, "both", 2
        args.big_pool = 8192  # zoomed out all the same, built in a moment
    figures: dict[str, float] = {}
    if args.part in ("all", "frame"):
        figures.update(part_frame(args.repeats or 30))
        figures.update(part_big_pool(args.big_pool, args.repeats or 30))
    if args.part in ("all", "browser"):
        renderers = ("cells", "canvas") if args.renderer == "both" else (args.renderer,)
        figures.update(part_browser(args.runs, args.max_tokens, renderers, args.repeats or 20))
    print("figures: " + json.dumps({k: round(v, 4) for k, v in figures.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
