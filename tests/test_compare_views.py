"""The compare split view (`blockviz compare --tui`): every run's pool at the same engine step,
stepped together, drawn from each run's own events."""

from __future__ import annotations

import pytest

from blockviz.model.timeline import Timeline

from tests.test_tui_app import anyio_backend  # noqa: F401  (the anyio backend for these tests)


@pytest.fixture(scope="module")
def two_runs(tiny_gpt2_factory):
    from blockviz.session.compare import configurations, run_all
    from blockviz.session.spec import EngineSpec

    spec = EngineSpec.of(model=str(tiny_gpt2_factory()), num_gpu_blocks=64, num_cpu_blocks=16, max_tokens=10,
                         temperature=0.0)
    configs = configurations(spec.config, block_size=[2, 8])
    return run_all(["To be, or not to be", "The quick brown"], configs, spec.sampling_params())


def test_the_runs_keep_their_events_and_the_same_step_ends(two_runs):
    small, big = two_runs
    assert small.texts == big.texts and small.figures["same_text_as_first"] and big.figures["same_text_as_first"]
    for run in two_runs:
        ends = [i + 1 for i, e in enumerate(run.events) if e.type == "step_finished"]
        assert len(ends) == run.figures["steps"]
        timeline = Timeline(run.header["block_size"], run.header["num_gpu_blocks"], run.header["num_cpu_blocks"])
        timeline.extend(run.events)
        assert [timeline.step_end(k) for k in range(1, len(ends) + 1)] == ends
        assert timeline.step_end(len(ends) + 5) == len(run.events)
    assert small.label.startswith("block 2 ·") and big.label.startswith("block 8 ·")


@pytest.mark.anyio
async def test_the_split_view_steps_every_run_together(two_runs):
    from blockviz.session.compare import same_step
    from blockviz.tui.compare_app import CompareApp
    from blockviz.tui.widgets.pool_grid import PoolGrid

    app = CompareApp(two_runs)
    async with app.run_test(size=(160, 40)) as pilot:
        assert app.step == same_step(two_runs)
        for grid in app.query(PoolGrid):  # drawn as far as the run ever reaches, not all 64 blocks
            start, stop = grid.block_range
            assert start == 0 and 8 <= stop < 64 and stop % 8 == 0
        for _ in range(2):
            grids = [app.query_one(f"#gpu-{i}", PoolGrid) for i in range(2)]
            used = [grid.state.num_used("gpu") for grid in grids]
            assert used == [run.used_by_step[app.step] for run in two_runs]  # the recorder's count after that step
            assert used[0] > used[1]  # block size 2 holds the same tokens in more blocks
            figures = str(app.query_one("#figures-0").render())
            assert f"at step {app.step}" in figures and "GPU blocks" in figures
            before = app.step
            await pilot.press("s")
            assert app.step == before + 1
        await pilot.press("G")
        assert app.step == max(run.figures["steps"] for run in two_runs)
        assert all(grid.state.num_used("gpu") == 0 for grid in app.query(PoolGrid))  # all freed at the end
        await pilot.press("b", "g")
        assert app.step == 0


N2_ARGS = ["--prompt", "To be, or not to be, that is the question", "--n", "2", "--max-tokens", "6",
           "--block-size", "4", "--num-gpu-blocks", "64"]


@pytest.fixture(scope="module")
def v0_v1_runs(tiny_gpt2_factory):
    """`blockviz compare --kv-manager v0,v1 --n 2 --tui`'s runs, made as the command makes them."""
    from blockviz.cli import build_parser
    from blockviz.commands.compare import compare_runs

    args = build_parser().parse_args(["compare", "--model", str(tiny_gpt2_factory()), *N2_ARGS,
                                      "--kv-manager", "v0,v1", "--tui"])
    return compare_runs(args)


@pytest.mark.anyio
async def test_compare_kv_manager_v0_v1_steps_both_managers_together(v0_v1_runs):
    from blockviz.tui.compare_app import CompareApp
    from blockviz.tui.widgets.pool_grid import PoolGrid

    v0, v1 = v0_v1_runs
    assert (v0.config.kv_manager, v1.config.kv_manager) == ("v0", "v1") and v1.label.endswith("· v1")
    app = CompareApp(v0_v1_runs)
    async with app.run_test(size=(160, 40)) as pilot:
        differ = str(app.query_one("#differences").render())
        assert f"forks {v0.figures['forks']} | 0" in differ and f"prefix hits 0 | {v1.figures['prefix_hits']}" in differ
        await pilot.press("g")
        for step in range(0, 4):
            assert app.step == step
            grids = [app.query_one(f"#gpu-{i}", PoolGrid) for i in range(2)]
            for index, (grid, run, timeline) in enumerate(zip(grids, v0_v1_runs, app.timelines)):
                assert grid.state.num_used("gpu") == run.used_by_step.get(step, 0)
                figures = str(app.query_one(f"#figures-{index}").render())
                assert f"hits {timeline.state.num_prefix_hits} · preemptions {timeline.state.num_preemptions}" in figures
            await pilot.press("s")
        figures = [str(app.query_one(f"#figures-{i}").render()) for i in range(2)]
        assert f"forks 1 · copies on write {v0.figures['copies_on_write']}" in figures[0]
        assert "forks 0 · copies on write 0" in figures[1] and f"hits {v1.figures['prefix_hits']} (" in figures[1]
        assert "tok/s" not in figures[0] + figures[1]


def grid_cells(grid):
    """Every step of a notebook compare grid, every run's cell: (its state there, rebuilt from the
    run's events; its extent; its figures widget), the grid moved to the step and its pool's frame
    checked to be snapshot()'s of that state."""
    from blockviz.model.view import snapshot

    for step in range(1, grid.num_steps + 1):
        grid.seek_step(step)
        for run, extent, pool, cell in zip(grid.runs, grid.extents, grid.pools, grid.cell_figures):
            reference = Timeline.for_header(run.header)
            reference.extend(run.events)
            reference.seek(reference.step_end(step))
            assert pool.frame == pool.part(snapshot(reference.state, ranges={"gpu": (0, extent)}))
            yield reference, extent, cell


def test_the_notebook_compare_of_v0_and_v1_draws_each_managers_frame(tiny_gpt2_factory):
    from blockviz.jupyter import compare
    from blockviz.model.reducer import USED

    grid = compare(["To be, or not to be, that is the question"], kv_manager=["v0", "v1"], n=2, block_size=4,
                   num_gpu_blocks=64, max_tokens=6, model=str(tiny_gpt2_factory()))
    v0, v1 = grid.runs
    assert (v0.config.kv_manager, v0.config.enable_prefix_caching) == ("v0", False)
    assert (v1.config.kv_manager, v1.config.enable_prefix_caching) == ("v1", True)
    assert "forks 1 | 0" in grid.differences.value and "prefix hits 0 |" in grid.differences.value
    # each pool is drawn as far as its run ever reaches: a few rows of the 64 blocks, none beyond held
    assert all(extent % 8 == 0 and 8 <= extent < 64 for extent in grid.extents)
    for reference, extent, cell in grid_cells(grid):
        assert all(block.state != USED and block.block_hash is None for block in reference.state.pools["gpu"][extent:])
        assert f"hits {reference.state.num_prefix_hits} ·" in cell.value
    assert "<th style='padding:0 8px'>forks</th>" in grid.figures_html() and "tok/s" not in grid.figures_html()
    grid.close()
