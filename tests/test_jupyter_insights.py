"""The Jupyter insight views without a browser: each frame part (explainer, ledger, memory and its
sparkline) equals what the model layer says, recomputed independently from the events up to the
cursor; the parts are computed only for views someone can see; breakpoints go forward and back, in
a replay and live, from Python and from the breakpoints bar's buttons; the compare grid."""

from __future__ import annotations

import pytest

from blockviz.model.explain import EVICTED, HIT, explain_requests
from blockviz.model.timeline import Timeline
from engine import events as ev
from blockviz.model.insights import ledger_totals, max_tokens_of, memory_truth, preemption_ledger
from blockviz.jupyter import Visualizer
from blockviz.model.insight_view import sparkline_points
from blockviz.model.view import snapshot
from blockviz.model.palette import short_hash, show_token
from blockviz.model.trace import load_trace

TRACES = ["swap", "recompute", "prefix-hit"]


def cursors(events) -> list[int]:
    """Positions worth checking: the ends, a third, each preemption, resumption and allocation."""
    picked = {0, 1, len(events) // 3, len(events)}
    picked |= {i + 1 for i, e in enumerate(events) if e.type in ("preempted", "step_started", "request_added")}
    return sorted(picked)


def check_explain(part, viz, position):
    h = viz.header
    expected = explain_requests(viz.events[:position], h["block_size"], h["num_gpu_blocks"], h["num_cpu_blocks"],
                                h["enable_prefix_caching"])
    assert part["requests"] == list(dict.fromkeys(x.request_id for x in expected))
    if not expected:
        assert part["request"] is None
        return
    chosen = next(x for x in reversed(expected) if x.request_id == part["request"])  # its latest lookup
    assert (part["seq"], part["hit_blocks"], part["hit_tokens"]) == (chosen.seq_id, chosen.num_hit_blocks,
                                                                     chosen.num_hit_tokens)
    assert part["first_miss"] == (None if chosen.first_miss is None else
                                  {"index": chosen.first_miss.index, "verdict": chosen.first_miss.verdict})
    vocab = viz.timeline.token_texts
    for row, block in zip(part["blocks"], chosen.blocks, strict=True):
        assert (row["index"], row["verdict"], row["block"]) == (block.index, block.verdict, block.block)
        assert row["hash"] == (short_hash(block.block_hash) if block.block_hash is not None else "")
        assert row["tokens"] == [show_token(vocab[t]) for t in block.token_ids]


def check_ledger(part, events, position):
    entries = preemption_ledger(events[:position])  # a ledger of the past only: resumptions to come unknown
    assert part["count"] == len(entries) and part["totals"] == ledger_totals(entries)
    assert [(r["seq_no"], r["request"], r["mode"], r["blocks_swapped"], r["blocks_freed"], r["tokens_lost"],
             r["steps_until_resumed"]) for r in part["rows"]] == [
        (e.seq_no, e.request_id, e.mode, e.blocks_swapped, e.blocks_freed, e.tokens_lost, e.steps_until_resumed)
        for e in entries]


def check_memory(part, trace, position):
    reference = Timeline.for_trace(trace)
    upto = trace.events[:position]
    reference.seek(position)
    truth = memory_truth(reference.state, max_tokens_of(upto))
    for device, pool in truth.pools.items():
        shown = part["pools"][device]
        assert (shown["used_blocks"], shown["slots_used"], shown["slots_allocated"]) == (
            pool.used_blocks, pool.slots_used, pool.slots_allocated)
        assert shown["block_utilization"] == pool.block_utilization
        assert shown["token_utilization"] == pool.token_utilization
    assert part["internal_fragmentation"] == truth.internal_fragmentation
    assert part["reserved_slots"] == truth.reserved_slots and part["reservation_waste"] == truth.reservation_waste()
    assert {s["seq"]: s["empty_in_last_block"] for s in part["seqs"]} == {
        s.seq_id: s.empty_in_last_block for s in truth.seqs.values()}
    points = []
    for end in reference.step_ends:
        if end > position:
            break
        reference.seek(end)
        gpu = memory_truth(reference.state, max_tokens_of(trace.events[:end])).pools["gpu"]
        points.append([trace.events[end - 1].step, end, round(gpu.block_utilization, 4),
                       round(gpu.token_utilization, 4)])
    assert part["series"] == points


@pytest.mark.parametrize("name", TRACES)
def test_every_insight_part_equals_the_model_layer_at_each_cursor(name):
    trace = load_trace(name)
    viz = Visualizer.from_trace(name)
    for position in cursors(trace.events):
        viz.seek(position)
        position = viz.position  # the slider lands at an operation's end
        parts = viz.insight.parts()
        check_explain(parts["explain"], viz, position)
        check_ledger(parts["ledger"], trace.events, position)
        assert [e.seq_no for e in viz.insight.ledger()] == [r["seq_no"] for r in parts["ledger"]["rows"]]
        check_memory(parts["memory"], trace, position)
    viz.close()


def test_the_explainer_follows_the_selected_block_or_the_picked_request():
    viz = Visualizer.from_trace("prefix-hit")
    viz.run_to_completion()
    viz.seek(next(end for end in viz.timeline.step_ends  # both prompts allocated, their blocks held
                  if viz.seek(end) is not None and {0, 1} <= set(viz.state.tables)))
    first_block = viz.state.tables[0][-1][1]  # seq 0's own last block
    viz.select("gpu", first_block)
    assert viz.insight.parts(["explain"])["explain"]["request"] == "0"
    explanation = viz.insight.explain("1")
    assert explanation.request_id == "1" and explanation.num_hit_blocks == 4
    part = viz.insight.parts(["explain"])["explain"]
    assert part["request"] == "1" and [b["verdict"] for b in part["blocks"]][:5] == [HIT] * 4 + ["different tokens"]
    viz.explain_view._on_frontend_msg(viz.explain_view, {"event": "pick", "request": "0"}, [])
    viz._buttons.wait(timeout=60)
    assert viz.insight.picked == "0"
    viz.select("gpu", viz.state.tables[1][-1][1])  # a click on a block follows its request again
    assert viz.insight.parts(["explain"])["explain"]["request"] == "1"
    viz.seek(0)
    assert viz.insight.parts(["explain"])["explain"] == {"requests": [], "request": None}
    viz.close()


def test_insight_parts_go_out_only_for_views_someone_can_see():
    viz = Visualizer.from_trace("swap")
    viz.run_to_completion()
    frame = viz.frame()
    assert not {"explain", "ledger", "memory"} & set(frame) and frame["breaks"] == {"on": [], "message": ""}
    viz.insight.accordion.selected_index = 1  # the ledger's section opens
    viz.frames.flush()
    assert set(viz.frame()) & {"explain", "ledger", "memory"} == {"ledger"}
    assert viz.ledger_view.frame["ledger"]["count"] == 4 and viz.memory_view.frame == {}
    viz.memory_view._repr_mimebundle_()  # displayed on its own, as a cell's last expression
    assert viz.memory_view.frame["memory"]["series"] == sparkline_points(viz.insight.insights, len(viz))
    viz.insight.accordion.selected_index = None
    viz.back(len(viz) // 2)
    viz.frames.flush()
    assert viz.ledger_view.frame["ledger"]["count"] == 4  # closed: its last picture stays
    assert viz.memory_view.frame["memory"]["series"][-1][1] <= viz.position
    viz.close()


def test_a_long_series_is_thinned_to_the_limit_keeping_the_newest():
    viz = Visualizer.from_trace("recompute")
    viz.run_to_completion()
    viz.insight.parts(("memory",))  # synced
    insights = viz.insight.insights
    full = sparkline_points(insights, len(viz), limit=10_000)
    thin = sparkline_points(insights, len(viz), limit=7)
    assert len(thin) <= 7 and thin[-1] == full[-1] and all(p in full for p in thin)
    assert [p[0] for p in thin] == sorted(p[0] for p in thin)
    viz.close()


@pytest.mark.parametrize("name", ["fork-cow", "swap"])
def test_back_to_lands_on_each_previous_breakpoint_in_a_replay(name):
    viz = Visualizer.from_trace(name)
    kinds = {"copy_on_write", "fork"} if name == "fork-cow" else {"swap_out", "swap_in"}
    # each lands at the end of the engine operation the event is in (a swap-out with its frees)
    expected = sorted({viz.timeline.operation_end(i + 1) for i, e in enumerate(viz.events) if e.type in kinds})
    assert len(expected) >= 2
    landed = []
    while (event := viz.run_until(sorted(kinds))) is not None:
        assert event.type in kinds
        landed.append(viz.position)
    assert landed == expected and viz.position == len(viz)
    back = [viz.position for _ in expected if viz.back_to(",".join(sorted(kinds))) is not None]
    assert back == expected[::-1][:len(back)] and len(back) == len(expected)  # from the end: the last one first
    assert viz.back_to(kinds) is None and viz.position == expected[0]  # none before the first: it stays
    with pytest.raises(ValueError, match="unknown event kind"):
        viz.back_to("swap-out")
    viz.close()


def test_the_breakpoints_bar_sets_the_kinds_and_its_buttons_move_the_cursor():
    viz = Visualizer.from_trace("swap")
    preempted = [viz.timeline.operation_end(i + 1) for i, e in enumerate(viz.events) if e.type == "preempted"]
    bar = viz.breakpoints_view
    bar._on_frontend_msg(bar, {"event": "break", "direction": "next"}, [])
    viz._buttons.wait(timeout=60)
    assert viz.position == 0 and viz.insight.break_message == "tick an event kind first"
    bar.break_on = ["preempted"]
    assert viz.player.break_on == {ev.Preempted}
    for target in preempted[:2]:
        bar._on_frontend_msg(bar, {"event": "break", "direction": "next"}, [])
        viz._buttons.wait(timeout=60)
        assert viz.position == target
    assert viz.insight.break_message == f"stopped at event {preempted[1]}: preempted"
    bar._on_frontend_msg(bar, {"event": "break", "direction": "previous"}, [])
    viz._buttons.wait(timeout=60)
    assert viz.position == preempted[0]
    viz.frames.flush()
    assert bar.frame["breaks"] == {"on": ["preempted"], "message": f"stopped at event {preempted[0]}: preempted"}
    viz.seek(0)
    viz.play("max")  # playback stops at a ticked kind, as the TUI's does
    viz._play_thread.join(timeout=60)
    assert viz.position == preempted[0] and not viz.playing
    viz.close()


# ---------------------------------------------------------------------------- a live engine


def test_breakpoints_land_on_the_right_event_live_and_back(tiny_gpt2_dir):
    from engine.sequence import SamplingParams

    viz = Visualizer.live({"model": str(tiny_gpt2_dir), "block_size": 4, "num_gpu_blocks": 24,
                           "enable_prefix_caching": True},
                          prompts=["To be, or not to be, that is", "To be, or not to be, that is the question"],
                          sampling_params=SamplingParams(max_tokens=6))
    hit = viz.run_until("prefix_cache_hit")  # steps the engine until it comes
    assert hit is not None and viz.position == viz.timeline.operation_end(viz.events.index(hit) + 1)
    assert viz.timeline.operation_at() is None  # the admission drawn whole, its hits and allocations
    finished = viz.run_until(["sequence_finished"])
    assert finished.type == "sequence_finished" and viz.engine.num_steps > 1
    hits = [viz.timeline.operation_end(i + 1) for i, e in enumerate(viz.events) if e.type == "prefix_cache_hit"]
    steps_before = viz.engine.num_steps
    back = viz.back_to("prefix_cache_hit")
    assert back.type == "prefix_cache_hit" and viz.position == hits[-1]
    assert viz.engine.num_steps == steps_before  # going back is time travel: the engine is left alone
    viz.breakpoints_view.break_on = ["sequence_finished"]
    assert viz.run_until() is finished  # the ticked kinds
    assert viz.back_to() is None and viz.position == viz.timeline.operation_end(viz.events.index(finished) + 1)
    outputs = viz.run_to_completion()
    assert len(outputs) == 2 and viz.back_to("step_finished").type == "step_finished"
    viz.close()


def test_a_live_explanation_names_the_eviction_that_made_it_miss(tiny_gpt2_dir):
    from engine.llm import LLM
    from engine.sequence import SamplingParams

    params = SamplingParams(max_tokens=2, ignore_eos=True)
    shared = [11, 12, 13, 14, 21, 22, 23, 24]
    llm = LLM(str(tiny_gpt2_dir), block_size=4, num_gpu_blocks=8, enable_prefix_caching=True, watermark=0.0)
    viz = Visualizer.live(llm)
    for prompt in (shared + [5], list(range(100, 128)), shared + [6]):  # the filler evicts the cached blocks
        request_id = viz.add_request({"prompt_token_ids": prompt}, params)
        viz.run_to_completion()
    explanation = viz.insight.explain(request_id)
    assert explanation.blocks[0].verdict == EVICTED
    part = viz.insight.parts(["explain"])["explain"]
    row = part["blocks"][0]
    assert row["verdict"] == EVICTED and part["hit_blocks"] == 0
    evicting = viz.events[row["evicted_by"]["number"] - 1]
    assert evicting.type == "block_evicted" and evicting.seq_no == explanation.blocks[0].evicted_by
    assert evicting.block_hash == explanation.blocks[0].block_hash
    viz.close()


# ---------------------------------------------------------------------------- the compare grid


def events_through_step(events, step: int) -> int:
    """How many of `events` come up to the end of engine step `step` (all of them past the last)."""
    ends = [i + 1 for i, e in enumerate(events) if e.type == "step_finished"]
    return ends[step - 1] if step <= len(ends) else len(events)


def test_a_compare_grid_of_two_block_sizes_moves_every_cell_to_the_steps_end(tiny_gpt2_dir):
    from blockviz.jupyter import compare

    grid = compare(["To be, or not to be, that is the question:", "The quick brown fox jumps over the lazy dog."],
                   block_size=[4, 8], num_gpu_blocks=[48], prefix_caching=[False], max_tokens=8,
                   model=str(tiny_gpt2_dir), num_cpu_blocks=8)
    first, second = grid.runs
    assert first.config.block_size == 4 and second.config.block_size == 8
    assert first.figures["same_text_as_first"] and second.figures["same_text_as_first"]
    assert first.texts == second.texts and first.figures["peak_blocks"] != second.figures["peak_blocks"]
    for step in (1, 3, grid.num_steps, grid.num_steps + 5):
        grid.seek_step(step)
        shown = min(step, grid.num_steps)
        assert grid.step == shown
        for run, timeline, pool, cell in zip(grid.runs, grid.timelines, grid.pools, grid.cell_figures):
            assert timeline.position == events_through_step(run.events, shown)
            reference = Timeline(run.header["block_size"], run.header["num_gpu_blocks"], run.header["num_cpu_blocks"])
            reference.extend(run.events)
            reference.seek(events_through_step(run.events, shown))
            # drawn as far as the run ever reaches (pool_zoom.used_extent), never past a block it held
            extent = grid.extents[grid.runs.index(run)]
            assert extent < run.header["num_gpu_blocks"]
            assert pool.frame == pool.part(snapshot(reference.state, ranges={"gpu": (0, extent)}))
            assert f"data-used='{reference.state.num_used('gpu')}'" in cell.value
    grid.slider.value = 2  # the slider itself moves every cell too
    assert [t.position for t in grid.timelines] == [events_through_step(run.events, 2) for run in grid.runs]
    assert "block 4" in repr(grid) and "same text yes" in repr(grid)
    assert [row["label"] for row in grid.figures()] == [run.label for run in grid.runs]
    grid.close()
