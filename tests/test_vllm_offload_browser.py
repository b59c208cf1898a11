"""vLLM's CPU tier in a real browser: JupyterLab replays a recorded `kv_manager="vllm"` run with
`--kv-offloading-size` (tests/test_vllm_offload.py's workload); at the load that brings a preempted
request's prefix back, the pools the page drew (the canvas's data-states / data-refs, the CPU pool's
cached blocks and null block 0 included) equal the kernel's reducer state, and still do a step later.

Fixtures and helpers: tests/jupyter_fixtures.py (one server per session, a fresh page per test)."""

from __future__ import annotations

import importlib.util

import pytest
from jupyter_fixtures import (click_and_wait, kernel_cells, kernel_json, open_notebook, page_cells, run_all_cells,
                               wait_for_position, wait_for_visualizer)

from tests.test_vllm_offload import NUM_CPU_BLOCKS, TINY, returning_load, trace_with_the_cpu_tier


@pytest.fixture(autouse=True)
def _needs_vllm():
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vLLM is not installed")


def test_the_page_draws_the_cpu_tier_and_the_load_as_the_kernel_has_it(jupyter_server, lab_page, tiny_gpt2_dir,
                                                                        tmp_path):
    trace = trace_with_the_cpu_tier(tiny_gpt2_dir, tmp_path / "tier.jsonl")
    at, load = returning_load(trace.events)
    cells = [f"from blockviz.jupyter import Visualizer\nviz = Visualizer.from_trace({str(tmp_path / 'tier.jsonl')!r})\n"
             f"viz.seek({at + 1})", "viz"]
    page = lab_page
    path = jupyter_server.add_notebook("widget-tier.ipynb", cells)
    open_notebook(page, jupyter_server, path)
    run_all_cells(page)
    wait_for_visualizer(page, num_cells=TINY["num_gpu_blocks"] + NUM_CPU_BLOCKS)
    wait_for_position(page, kernel_json(page, "viz.position"))
    drawn = page_cells(page)
    assert drawn == kernel_cells(page)
    cpu = {number: state for device, number, state, _ in drawn if device == "cpu"}
    cpu_block, gpu_block = load.mapping[0]
    assert cpu[0] == "null" and cpu[cpu_block] == "cached"
    assert ["gpu", gpu_block, "used"] == [c for c in drawn if c[:2] == ["gpu", gpu_block]][0][:3]
    position = click_and_wait(page, "step")
    wait_for_position(page, position)
    assert page_cells(page) == kernel_cells(page)
