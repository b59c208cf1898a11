"""The TUI's radix tree panel on a recorded `kv_manager="sglang"` trace: it is the view shown first;
on a wide terminal the tree drawn (each node's id, length and lock_ref or evictable) is the reducer's
at each cursor; at 80x24 and in projector mode the node the cursor's event is about is on screen."""

from __future__ import annotations

import asyncio
import re

from blockviz.model.reducer import ReducerState
from engine import events as ev
from tests.radix_fixtures import sglang_trace  # noqa: F401 (the recorded sglang trace, a module fixture)

NODE = re.compile(r"#(\d+) (\d+)t (?:lock (\d+)|evictable|unlocked)")
ABOUT = (ev.RadixNodeInserted, ev.RadixLockRef, ev.RadixNodeSplit)


def screen_text(app) -> str:
    return "\n".join("".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips())


def drawn_tree(app) -> dict[int, tuple[int, int]]:
    """node id -> (tokens, lock_ref) as the radix panel draws them (its region of the screen)."""
    panel = app.query_one("#radix")
    region = panel.region
    lines = screen_text(app).splitlines()[region.y:region.bottom]
    text = "\n".join(line[region.x:region.right] for line in lines)
    return {int(m[1]): (int(m[2]), int(m[3] or 0)) for m in NODE.finditer(text)}


def reducer_tree(trace, position: int) -> dict[int, tuple[int, int]]:
    state = ReducerState.from_header(trace.header).apply_all(trace.events[:position])
    return {node_id: (len(node.token_ids), node.lock_ref) for node_id, node in state.radix_nodes.items()}


def test_the_panel_draws_the_reducers_tree(sglang_trace):
    asyncio.run(_compare_wide(sglang_trace))


async def _compare_wide(trace) -> None:
    from blockviz.tui.app import BlockvizApp

    app = BlockvizApp(trace=trace, deterministic=True, source_name="sglang", play=False)
    async with app.run_test(size=(180, 60)) as pilot:
        await pilot.pause()
        assert app.right_view == "radix" and app.screen.has_class("-radix")
        compared = 0
        for position, event in enumerate(trace.events, start=1):
            if not isinstance(event, (*ABOUT, ev.RadixNodeEvicted, ev.SequenceFreed)):
                continue
            app.player.timeline.seek(position)
            app.render_views()
            await pilot.pause()
            assert drawn_tree(app) == reducer_tree(trace, position), position
            compared += 1
        assert compared >= 10


def test_at_80x24_and_in_projector_mode_the_node_of_the_event_is_on_screen(sglang_trace):
    asyncio.run(_event_node_visible(sglang_trace, (80, 24), False))
    asyncio.run(_event_node_visible(sglang_trace, (100, 30), True))


async def _event_node_visible(trace, size, projector) -> None:
    from blockviz.tui.app import BlockvizApp

    app = BlockvizApp(trace=trace, deterministic=True, source_name="sglang", projector=projector, play=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        seen = 0
        for position, event in enumerate(trace.events, start=1):
            if not isinstance(event, ABOUT):
                continue
            app.player.timeline.seek(position)
            app.render_views()
            await pilot.pause()
            drawn = drawn_tree(app)
            node = app.player.timeline.state.radix_nodes[event.node_id]
            assert drawn.get(event.node_id) == (len(node.token_ids), node.lock_ref), (position, drawn)
            seen += 1
        assert seen >= 5


def test_a_tree_taller_than_the_panel_scrolls_to_the_node_of_the_event(sglang_trace):
    """Forty one-token leaves under the root (events alone, no engine): at 80x24 and in projector mode
    the panel holds a few of them, and at each insert the node just inserted is on screen."""
    from blockviz.model.trace import Trace

    header = {**sglang_trace.header, "block_size": 1, "num_gpu_blocks": 64, "sglang_options": {"page_size": 1}}
    events = [ev.RadixNodeInserted(seq_no=i, node_id=i + 1, parent_id=None, token_ids=(5 + i,), slots=(i + 1,),
                                   lock_ref=0) for i in range(40)]
    asyncio.run(_scrolls(Trace(header, events), (80, 24), False))
    asyncio.run(_scrolls(Trace(header, events), (100, 30), True))


async def _scrolls(trace, size, projector) -> None:
    from blockviz.tui.app import BlockvizApp

    app = BlockvizApp(trace=trace, deterministic=True, source_name="tall", projector=projector, play=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        for position in (40, 5, 25):
            app.player.timeline.seek(position)
            app.render_views()
            for _ in range(40):  # the panel scrolls once its new lines are laid out (a refresh or two)
                await pilot.pause(0.05)
                drawn = drawn_tree(app)
                if position in drawn:
                    break
            assert position in drawn and len(drawn) < 40, (position, drawn)
