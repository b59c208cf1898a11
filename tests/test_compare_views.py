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
