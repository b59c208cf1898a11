"""Guided playback (issue 28 item 1): the default story stops once at each idea's first occurrence,
in order, with a card naming the event's blocks, which the pools highlight; `]` from the start lands
on the first fork without `B`; playback slows near a card; per-step narration; the traps."""

from __future__ import annotations

import re

import pytest

from blockviz.model.guide import Guide
from blockviz.model.operation import drawn_state_problems
from blockviz.model.names import RequestNames
from blockviz.model.narration import cursor_step, describe, narrate_step
from blockviz.model.player import GUIDE_SLOW_SPEED, SPEEDS, Player
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace
from blockviz.tui.app import BlockvizApp
from blockviz.tui.widgets.guide_card import GuideCard
from engine import events as ev
from story_fixtures import story_trace_path  # noqa: F401 (fixture)
from test_tui_app import _until, anyio_backend, screen_text  # noqa: F401 (anyio_backend: the fixture)

# What starts each idea, read plainly off the events (the guide's own reading is under test).
STARTS = (
    ("forking", lambda e: isinstance(e, ev.Forked)),
    ("copy-on-write", lambda e: isinstance(e, ev.CopyOnWrite)),
    ("prefix-hit", lambda e: isinstance(e, ev.PrefixCacheHit)),
    ("swap-out", lambda e: isinstance(e, ev.Preempted) and e.mode == "swap"),
    ("recompute", lambda e: isinstance(e, ev.Preempted) and e.mode == "recompute"),
    ("swap-in", lambda e: isinstance(e, ev.SwappedIn)),
    ("eviction", lambda e: isinstance(e, ev.BlockEvicted)),
    ("never-runs", lambda e: isinstance(e, ev.SequenceFinished) and e.reason == "ignored"),
)


def first_occurrences(events) -> list[tuple[str, int]]:
    """(idea, index of its first event), in the order they happen."""
    firsts = {}
    for index, event in enumerate(events):
        for idea, starts in STARTS:
            if idea not in firsts and starts(event):
                firsts[idea] = index
    return sorted(firsts.items(), key=lambda item: item[1])


def card_text(app) -> str:
    """The card as drawn on the screen, its lines joined (wrapped words rejoin)."""
    card = app.query_one(GuideCard)
    if not card.display:
        return ""
    region = card.region
    lines = screen_text(app).splitlines()[region.y:region.y + region.height]
    return " ".join(" ".join(line[region.x:region.x + region.width].strip("│╭╮╰╯─┃┏┓┗┛━ ") for line in lines).split())


@pytest.mark.anyio
async def test_the_story_played_guided_stops_once_per_idea_in_order_with_its_blocks_highlighted(story_trace_path):
    trace = load_trace(story_trace_path)
    expected = first_occurrences(trace.events)
    assert {"forking", "copy-on-write", "prefix-hit", "swap-out"} <= {idea for idea, _ in expected}
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
    stops = []
    async with app.run_test(size=(200, 60)) as pilot:
        app.player.speed_index = len(SPEEDS) - 1  # no waiting: the stops are what is under test
        timeline = app.player.timeline
        while not timeline.at_end:
            await pilot.press("space")
            await _until(pilot, lambda: not app.player.playing, timeout=30)
            await pilot.pause()
            card = app.player.card
            if card is None:
                assert timeline.at_end
                break
            stops += [(idea, card.seq_no if idea == card.idea else None) for idea in card.ideas]
            assert card.seq_no < timeline.position and timeline.position == card.position
            assert timeline.operation_at() is None and not drawn_state_problems(timeline.state)  # a state the engine has
            text = card_text(app)
            assert card.title in text and card.function in text
            for device, number in card.blocks:  # the card names the blocks ...
                assert device in text.lower() and re.search(rf"\b{number}\b", card.what), (device, number, text)
            for grid in app._main.grids:  # ... and the pools highlight them
                assert grid.touched == card.blocks_on(grid.device)
            in_tables = {where for table in timeline.state.tables.values() for where in table}
            if in_tables & set(card.blocks):  # ... and the block tables point at those a sequence holds
                await pilot.pause()
                assert "◀" in screen_text(app), card
    # one stop per operation; the swap-in takes its cached blocks back by hash, and a later
    # allocation still evicts: the swap-in and the eviction are a card each
    assert [idea for idea, _ in stops] == [idea for idea, _ in expected]
    assert all(seq_no in (None, trace.events[index].seq_no) for (_, seq_no), (_, index) in zip(stops, expected))
    ideas = [idea for idea, _ in stops]
    assert ideas.index("swap-in") < ideas.index("eviction") and all(seq_no for _, seq_no in stops)


def test_the_story_swap_in_revives_its_cached_blocks_by_hash_and_evicts_none(story_trace_path):
    """vLLM v0 _swap_block_table: the swap-in allocates each GPU block by the CPU block's hash, so
    the blocks the swap-out left free but cached are taken back; none is evicted, none copied."""
    events = load_trace(story_trace_path).events
    out = next(i for i, e in enumerate(events) if isinstance(e, ev.SwappedOut))
    back = next(i for i, e in enumerate(events) if isinstance(e, ev.SwappedIn))
    left_cached = {e.block for e in events[out:back]
                   if isinstance(e, ev.BlockFreed) and e.device == "gpu" and e.cached and e.seq_id in events[out].seq_ids}
    gpu_before = dict(events[out].mapping)  # gpu -> cpu
    assert len(left_cached) == 8 and set(events[back].revived) == left_cached
    assert not any(isinstance(e, ev.BlockEvicted) for e in events[out:back + 1])
    came_back = {cpu: gpu for cpu, gpu in events[back].mapping}
    assert all(came_back[gpu_before[gpu]] == gpu for gpu in left_cached)  # each to its own block
    guide = Guide()
    guide.scan(events)
    guide.settle()
    card = next(c for c in guide.cards if "swap-in" in c.ideas)
    assert card.ideas == ("swap-in",) and "taken back by hash" in card.what
    assert any(c.ideas == ("eviction",) for c in guide.cards if c.position > card.position)


@pytest.mark.anyio
async def test_the_bracket_key_from_the_start_lands_on_the_first_fork_without_setting_breakpoints(story_trace_path):
    trace = load_trace(story_trace_path)
    fork = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.Forked))
    for guided in (True, False):
        app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=guided)
        async with app.run_test(size=(80, 24)) as pilot:
            notes = []
            app.notify = lambda message, **kwargs: notes.append(message)
            app.player.speed_index = len(SPEEDS) - 1  # where it stops, not the pace, is under test
            await pilot.press("right_square_bracket")
            await _until(pilot, lambda: not app.player.playing, timeout=30)
            await pilot.pause()
            assert app.break_on == frozenset() and notes == []  # no B, no "no breakpoints"
            assert app.player.timeline.position == fork + 1
            assert (app.player.card is not None) == guided
            if guided:
                assert app.player.card.idea == "forking" and "Fork" in card_text(app)


@pytest.mark.anyio
async def test_three_presses_of_a_refused_key_leave_one_toast():
    trace = load_trace("fork-cow")
    app = BlockvizApp(trace=trace, deterministic=True, play=False)
    async with app.run_test(size=(100, 30)) as pilot:
        app.player.default_breaks(frozenset())  # nothing to play to: ] says so
        await pilot.press("right_square_bracket", "right_square_bracket", "right_square_bracket")
        await pilot.pause()
        assert len(app._notifications) == 1


def test_guided_playback_slows_near_a_card_and_stops_on_it():
    trace = load_trace("fork-cow")
    player = Player(Timeline.for_trace(trace))
    player.guide = Guide()
    player.guided = True
    first = player.scan_guide().cards[0]
    player.playing = True
    player.timeline.seek(first.position - 7)
    player.tick(1.0)  # 25 events/s would pass the card; within reach of it playback slows down
    assert first.position - 7 < player.timeline.position <= first.position - 7 + 25
    assert player.timeline.position == first.position or player._speed_near_card(player.guide) == GUIDE_SLOW_SPEED
    while player.playing:
        player.tick(1.0)
    assert player.timeline.position == first.position and player.card == first


def test_cards_of_the_shipped_traces_name_what_happened():
    for name, idea, words in (("swap", "swap-out", "copied to CPU blocks"), ("recompute", "recompute", "freed"),
                              ("eviction", "eviction", "least recently used"), ("prefix-hit", "prefix-hit", "not computed again"),
                              ("fork-cow", "copy-on-write", "copied to block")):
        trace = load_trace(name)
        guide = Guide()
        guide.scan(trace.events)
        guide.settle()
        card = next(c for c in guide.cards if c.idea == idea)
        assert words in card.what and card.blocks, (name, card)
        timeline = Timeline.for_trace(trace)
        timeline.seek(card.position)
        if idea in ("swap-out", "recompute"):  # the pools show the whole move at the stop
            victim = next(e for e in trace.events if isinstance(e, ev.Preempted))
            gpu = [number for device, number in card.blocks if device == "gpu"]
            assert gpu and all(not set(victim.seq_ids) & timeline.state.pools["gpu"][b].owners for b in gpu)


def test_a_request_that_can_never_run_gets_a_card(tiny_gpt2_dir):
    from blockviz.session.engine_session import EngineSession
    from blockviz.session.spec import EngineSpec

    spec = EngineSpec.of(model=str(tiny_gpt2_dir), device="cpu", prompts=("ROMEO: " + "a b c d " * 6,),
                         block_size=4, num_gpu_blocks=4, num_cpu_blocks=4, max_tokens=2)
    session = EngineSession(spec)
    session.start()
    session.run_to_completion()
    guide = Guide()
    guide.scan(session.take_events())
    guide.settle()
    (card,) = guide.cards
    assert card.idea == "never-runs" and "ignored" in card.what and "AllocStatus.NEVER" in card.function
    session.close()


def test_the_step_at_the_cursor_is_the_step_whose_events_are_on_screen():
    trace = load_trace("fork-cow")
    timeline = Timeline.for_trace(trace)
    ends = timeline.step_ends
    timeline.seek(ends[0] + 1)  # the first event of step 2: before its step_started
    assert cursor_step(timeline)[:2] == (2, "scheduling") and timeline.state.step == 1
    timeline.seek(ends[1])
    assert cursor_step(timeline)[:2] == (2, timeline.state.step_kind)
    cow = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.CopyOnWrite))
    timeline.seek(timeline.step_ends[next(k for k, end in enumerate(ends) if end > cow)])
    said = narrate_step(timeline)
    e = trace.events[cow]
    assert f"request {timeline.state.seqs[e.seq_id].request_id} (seq {e.seq_id}) copied block {e.src_block} on write (→ {e.dst_block})" in said
    assert "so far" not in said and "1 tokens" not in said and "1 blocks" not in said


@pytest.mark.anyio
async def test_s_names_what_the_step_did_and_playing_narrates_steps():
    trace = load_trace("fork-cow")
    cow = next(i for i, e in enumerate(trace.events) if isinstance(e, ev.CopyOnWrite))
    app = BlockvizApp(trace=trace, deterministic=True, play=False)
    async with app.run_test(size=(200, 60)) as pilot:
        app.player.timeline.seek(cow)  # the copy-on-write is the next event
        await pilot.press("s")
        await pilot.pause()
        e = trace.events[cow]
        assert f"copied block {e.src_block} on write" in " ".join(screen_text(app).split())
        await pilot.press("full_stop")  # one event: that event's own sentence
        await pilot.pause()
        timeline = app.player.timeline
        assert app._status.narration.startswith(describe(timeline.current_event, timeline.token_texts, RequestNames(timeline.state)))
        await pilot.press("space")  # playing: what the step has done so far, not each token
        await pilot.pause(0.3)
        assert app.player.playing and re.match(r"step \d+ \w+( so far)?(:|$)", app._status.narration)


def test_run_n_without_a_prompt_is_one_line_and_exit_2(capsys):
    from blockviz.cli import main

    assert main(["run", "--n", "3"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--n 3 applies to --prompt" in err


def test_a_token_holding_part_of_a_character_is_drawn_as_its_bytes_never_as_a_replacement_character():
    from transformers import AutoTokenizer

    from blockviz.model.palette import show_token
    from blockviz.session.engine_session import token_texts
    from engine.model_source import check_model

    tokenizer = AutoTokenizer.from_pretrained(str(check_model("tiny-shakespeare")))
    ids = tokenizer.encode("JULIET: ♥ naïve")
    texts = token_texts(tokenizer, ids)
    assert "\ufffd" in "".join(tokenizer.batch_decode([[i] for i in ids]))  # alone, they would be �
    assert "\ufffd" not in "".join(texts) and "\\xe2" in texts and "\\xc3" in texts
    assert [t for t in texts if "\\x" not in t] == [t for t in tokenizer.batch_decode([[i] for i in ids]) if "\ufffd" not in t]
    assert show_token("caf\ufffd") == "caf◌"  # an old trace's text


@pytest.mark.anyio
async def test_a_live_run_played_guided_opens_on_card_1_stops_on_its_first_idea_and_the_projector_shows_the_card_large():
    from blockviz.session.spec import EngineSpec
    from blockviz.session.engine_thread import EngineBridge
    from test_tui_fake_engine import FakeEngine

    # The fake engine's n=2 request shares its prompt's blocks from the start: its first idea is
    # the copy-on-write of the first decode
    spec = EngineSpec.of(model="fake", prompts=("ROMEO: hi",), n=2, max_tokens=12)
    bridge = EngineBridge(spec, make_engine=lambda: FakeEngine(block_size=4, num_gpu_blocks=24, num_cpu_blocks=8))
    app = BlockvizApp(bridge=bridge, deterministic=True, source_name="fake", guided=True, projector=True)
    async with app.run_test(size=(100, 30)) as pilot:
        await _until(pilot, lambda: app.player is not None and app.player.card is not None, timeout=30)
        await pilot.pause()
        # issue 45 item 3: a live run opens on card 1, as a replay does, paused until space
        assert app.player.card.idea == "kv-cache" and app.player.timeline.position == 0 and not app.player.playing
        assert card_text(app).startswith("card 1: What the cells are")  # not a story: no "of N"
        await pilot.press("space")
        await _until(pilot, lambda: app.player.card is not None and app.player.card.idea != "kv-cache", timeout=30)
        await pilot.pause()
        timeline = app.player.timeline
        assert [idea for idea, _ in first_occurrences(timeline.events)][0] == app.player.card.idea == "copy-on-write"
        assert isinstance(timeline.current_event, ev.CopyOnWrite) and not app.player.playing
        assert "Copy-on-write" in card_text(app)
        assert app.query_one(GuideCard).styles.border_top[0] == "heavy"  # the projector's large card
        await pilot.press("space")  # plays on to the end: no other idea in this run
        await _until(pilot, lambda: app.player.finished and not app.player.playing, timeout=30)
        assert app.player.card is None and [c.idea for c in app.player.guide.cards] == ["kv-cache", "copy-on-write"]


def test_the_guide_counts_from_a_capped_timelines_front():
    """A capped live timeline drops its oldest events (Timeline.dropped_events): the guide's stops
    and cards are asked for by positions from the kept front, as the Player's cursor counts."""
    events = load_trace("swap").events
    whole = Guide()
    whole.scan(events)
    whole.settle()
    swap_out = next(card for card in whole.cards if card.idea == "swap-out")
    cut = swap_out.start - 10
    guide = Guide()
    guide.scan(events[:cut])
    guide.scan(events[cut:], offset=cut)  # the first `cut` events dropped
    guide.settle()
    assert [c.idea for c in guide.cards] == [c.idea for c in whole.cards]
    assert guide.next_stop(0, len(events) - cut) == swap_out.position - cut
    assert guide.card_at(swap_out.position - cut) == swap_out and guide.stop_of(swap_out) == swap_out.position - cut
    assert guide.spanning(swap_out.start + 1 - cut) in (None, swap_out)


def test_a_replay_of_the_story_is_guided_by_default(story_trace_path):
    from blockviz.cli import build_parser
    from blockviz.commands.replay import is_story

    assert is_story(load_trace(story_trace_path).header)
    assert not is_story(load_trace("fork-cow").header)
    parser = build_parser()
    assert parser.parse_args(["replay", "fork-cow"]).guided is None  # the default: on for the story
    assert parser.parse_args(["replay", "fork-cow", "--guided"]).guided is True
    assert parser.parse_args(["run", "--no-guided"]).guided is False


@pytest.mark.anyio
@pytest.mark.parametrize("which", ["story", "v1-story"])
async def test_every_front_end_gives_the_same_figures_at_every_card_of_both_stories(which, story_trace_path, tmp_path):
    """Issue 39 item 2: at each card the step, the card counter, the pools' counts, the memory line
    and the preempted requests' states are one definition each, in the TUI, the notebook and the
    SVG export (the CLI's picture)."""
    from blockviz.cli import main
    from blockviz.jupyter import Visualizer
    from blockviz.model.insight_view import ledger_record, memory_line, memory_record
    from blockviz.model.narration import step_label
    from blockviz.model.view import pool_counts

    trace = load_trace(story_trace_path if which == "story" else "v1-story")
    viz = Visualizer.from_trace(trace)
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
    seen = 0
    async with app.run_test(size=(200, 60)) as pilot:
        guide, timeline = app.player.scan_guide(), app.player.timeline
        for number, card in enumerate(guide.cards, start=1):
            timeline.seek(card.position)
            app.render_views()
            await pilot.pause()
            screen = " ".join(screen_text(app).split())
            label = step_label(timeline)
            counter = f"card {number} of {len(guide.cards)}"
            assert label in screen and f"{counter}: {card.title}" in card_text(app)
            for device, (used, cached, free) in pool_counts(timeline.state).items():
                if timeline.state.pools[device]:
                    assert f"{device.upper()} pool · {used}/{used + cached + free} used" in screen
            viz.seek(card.position)  # the notebook, at the same stop
            frame = viz.frame()
            assert viz.position == card.position and frame["cursor"]["step"] == label
            assert frame["card"]["counter"] == counter and frame["card"]["title"] == card.title
            assert {d: (p["used"], p["cached"], p["free"]) for d, p in frame["pools"].items()} == pool_counts(timeline.state)
            app.insights.sync(timeline)
            ledger = ledger_record(app.insights, timeline.position).to_json()
            assert viz.insight.parts()["ledger"] == ledger
            memory = memory_record(app.insights, timeline.state, timeline.position)
            assert viz.insight.parts()["memory"] == memory.to_json() and memory_line(memory) in screen
            if "swap-in" in card.ideas:  # the request that came back is no longer waiting
                back = [row for row in ledger["rows"] if row["mode"] == "swap"]
                assert back and back[-1]["state"] != "waiting" and back[-1]["resumed_step"] is not None
            for row in ledger["rows"]:
                assert row["step"] <= int(label.split()[1])  # a preemption's step is never past the cursor's
            out = tmp_path / f"{which}-{number}.svg"
            assert main(["export", str(trace.path), "--at", str(card.position), "--out", str(out)]) == 0
            assert f"{label} (of " in out.read_text()
            seen += 1
    viz.close()
    assert seen == len(guide.cards) >= 3


@pytest.mark.anyio
async def test_the_first_minute_defines_its_words_an_opening_card_and_the_glossary_first():
    """Issue 39 item 5: a guided run opens on a card saying what a KV cache is, why it grows per
    token and why blocks; `?` defines the basic words first; each later card names its words."""
    from blockviz.model.glossary import BASICS, DEFINITIONS
    from blockviz.tui.widgets.screens import HelpScreen

    trace = load_trace("v1-story")
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        card = app.player.card
        assert card is not None and card.idea == "kv-cache" and app.player.timeline.position == 0
        text = card_text(app)
        for words in ("K/V", "grows one slot per token", "fixed-size blocks", "PagedAttention", "block table"):
            assert words in text, words
        assert text.startswith(f"card 1 of {len(app.player.guide.cards)}")
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
    async with app.run_test(size=(120, 60)) as pilot:  # the help, tall enough to show the words and the first keys
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        lines = [line.split("█")[1].strip() if line.count("█") >= 2 else "" for line in screen_text(app).splitlines()]
        heads = [next(i for i, line in enumerate(lines) if line.startswith(term + " ")) for term, _ in BASICS]
        assert heads == sorted(heads) and heads[-1] < next(i for i, line in enumerate(lines) if line.startswith("Keys"))
    guide = Guide(opening=True)
    guide.scan(load_trace("fork-cow").events)
    guide.settle()
    assert guide.cards[0].idea == "kv-cache" and all(card.terms for card in guide.cards)
    assert all(term in DEFINITIONS for card in guide.cards for term in card.terms)
    assert {"block table", "ref count", "forking"} <= set(next(c for c in guide.cards if c.idea == "forking").terms)


def story_traces(story_trace_path) -> dict[str, object]:
    """Every guided story there is: the v0 story (recorded, not shipped) and each shipped trace whose
    header is a story's (scenario.is_story: v1's, the hybrid one, any added later)."""
    from blockviz.model.trace import shipped_traces
    from blockviz.session.scenario import is_story

    shipped = {name: load_trace(name) for name in shipped_traces()}
    return {"story": load_trace(story_trace_path), **{name: t for name, t in shipped.items() if is_story(t.header)}}


def blocks_on_screen(app, card) -> list[tuple[str, int]]:
    """The blocks `card` names that are drawn on the screen: inside a shown pool's visible cells
    (PoolGrid.cell_region), the screen's text there starting with the block's number."""
    from blockviz.tui.widgets.pool_grid import PoolGrid

    lines = screen_text(app).splitlines()
    seen = []
    for grid in app.query(PoolGrid):
        for number in sorted(card.blocks_on(grid.device)):
            region = grid.cell_region(number)
            if region is not None and region.y < len(lines) and region.right <= app.size.width and \
                    lines[region.y][region.x:region.right].strip().startswith(str(number)):
                seen.append((grid.device, number))
    return seen


CARD_SIZES = [((80, 24), False), ((80, 24), True), ((100, 30), False), ((100, 30), True)]


@pytest.mark.anyio
@pytest.mark.parametrize("size,projector", CARD_SIZES,
                         ids=[f"{w}x{h}-{'projector' if p else 'plain'}" for (w, h), p in CARD_SIZES])
async def test_every_card_of_every_story_is_on_screen_whole_with_every_block_it_names(size, projector, story_trace_path):
    """Issue 45 item 1: at 80x24 and 100x30, plain and projector, each card of each story (replayed
    guided, stopped at the card) is drawn whole (its title, what happened, the vLLM function) and
    every block it names is in a visible pool cell beside it; the table of the card's sequence is
    on screen too."""
    checked = named = shown = nodes_named = 0
    for name, trace in story_traces(story_trace_path).items():
        app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True, projector=projector)
        async with app.run_test(size=size) as pilot:
            guide, timeline = app.player.scan_guide(), app.player.timeline
            for card in guide.cards:
                timeline.seek(card.position)
                app.render_views()
                await pilot.pause()
                await pilot.pause()
                assert app.player.card == card
                text = card_text(app)
                for words in (card.title, card.what, f"{card.upstream}: {card.function}", " · ".join(card.terms)):
                    assert " ".join(words.split()) in text, (name, size, projector, card.idea, words, text)
                seen = blocks_on_screen(app, card)
                assert sorted(seen) == sorted(card.blocks), (name, size, projector, card.idea, sorted(card.blocks), seen)
                checked, named, shown = checked + 1, named + len(card.blocks), shown + len(seen)
                radix = app.screen.has_class("-radix")  # SGLang's tree: the card's request's row heads its panel
                if card.seqs:
                    from blockviz.tui.widgets.panels import BlockTables
                    from blockviz.tui.widgets.radix_panel import RadixPanel

                    region = app.query_one(RadixPanel if radix else BlockTables).region
                    lines = screen_text(app).splitlines()[region.y:region.bottom]
                    head = f" {RequestNames(timeline.state)(card.seqs[:1])} · "  # its table's head, as the card names it
                    assert any(head in line[region.x:region.right] for line in lines), (name, card.idea, head)
                if radix:  # every radix node the card names is a line of the tree on screen
                    from blockviz.tui.widgets.radix_panel import RadixPanel

                    region = app.query_one(RadixPanel).region
                    lines = [line[region.x:region.right] for line in screen_text(app).splitlines()[region.y:region.bottom]]
                    for node in sorted({int(n) for n in re.findall(r"\b[Nn]ode (\d+)", card.what)}):
                        assert any(re.search(rf"#{node}\b", line) for line in lines), (name, size, projector, card.idea, node, lines)
                        nodes_named += 1
    print(f"{size[0]}x{size[1]} {'projector' if projector else 'plain'}: {checked} cards, {shown}/{named} blocks, "
          f"{nodes_named} radix nodes")
    assert checked >= 17 and shown == named and nodes_named > 0


@pytest.mark.anyio
async def test_the_bracket_key_goes_card_to_card_in_every_story_and_a_live_story_counts_its_cards(story_trace_path):
    """Issue 45 items 2 and 3: guided, `]` stops at the next card and nowhere between (the hybrid
    story's later window slides are no stops), in every story; a live run of a story says "of N"
    before its stream has ended (scenario.story_cards, the count its recording shows)."""
    from blockviz.model.player import SPEEDS
    from blockviz.session.scenario import story_cards

    for name, trace in story_traces(story_trace_path).items():
        app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
        async with app.run_test(size=(100, 30)) as pilot:
            app.player.speed_index = len(SPEEDS) - 1  # the stops, not the pace, are under test
            cards = app.player.scan_guide().cards
            assert story_cards(trace.header) == len(cards), name
            assert app.player.card == cards[0]
            for card in cards[1:]:
                await pilot.press("right_square_bracket")
                await _until(pilot, lambda: not app.player.playing, timeout=30)
                assert app.player.card == card, (name, app.player.timeline.position, card.idea)
        live = Guide(trace.header.get("kv_manager") or "v0", opening=True, header=trace.header)
        live.expected = story_cards(trace.header)
        live.scan(trace.events[:cards[2].position])  # a live run, two ideas in
        assert not live.settled and live.counter(live.cards[1]) == f"card 2 of {len(cards)}"
    for other in ({"num_gpu_blocks": 64}, {"model": "/some/checkpoint"}):  # the story's requests elsewhere
        assert story_cards(dict(trace.header, **other)) is None
    assert story_cards({}) is None


@pytest.mark.anyio
async def test_a_trace_cut_off_mid_run_says_so_at_its_end_and_one_evicted_block_is_singular(tmp_path):
    """Issue 39 item 7: a replay of a truncated trace says it ends before its requests finished;
    a card for one evicted block says "was"."""
    from blockviz.model.trace import Trace

    whole = load_trace("fork-cow")
    cut = Trace(whole.header, whole.events[:len(whole.events) // 2])
    for trace, words in ((whole, "end of trace"), (cut, "it stops before 1 request finished")):
        app = BlockvizApp(trace=trace, deterministic=True, play=False)
        async with app.run_test(size=(200, 60)) as pilot:
            await pilot.press("G")
            await pilot.pause()
            text = " ".join(screen_text(app).split())
            assert words in text and ("stops before" in text) == (trace is cut)
    guide = Guide()
    guide.scan(load_trace("eviction").events)
    guide.settle()
    card = next(c for c in guide.cards if c.idea == "eviction")
    one = card.what.startswith("1 block ")
    assert (" was free" in card.what) == one and (" were free" in card.what) == (not one)


def test_a_character_split_across_tokens_is_drawn_whole_in_the_tables_once_its_bytes_are_complete():
    """An emoji or a CJK character that byte-level BPE splits over two tokens: the block tables and
    the inspector draw the character on the token that completes it ('◌' before it), never its bytes."""
    from transformers import AutoTokenizer

    from blockviz.model.palette import show_tokens
    from blockviz.session.engine_session import token_texts
    from engine.model_source import check_model

    tokenizer = AutoTokenizer.from_pretrained(str(check_model("tiny-shakespeare")))
    for text in ("ROMEO: 🌹", "JULIET: 你好"):
        ids = tokenizer.encode(text)
        pieces = token_texts(tokenizer, ids)
        assert any("\\x" in piece for piece in pieces), pieces  # split into byte pieces
        drawn = show_tokens(list(pieces))
        assert "\\x" not in "".join(drawn) and "".join(drawn).replace("◌", "").replace("·", " ") == text
    assert show_tokens(["x", "\\xf0\\x9f", "y"])[1] == "◌"  # a character never completed: a part of one


def test_bytes_that_never_complete_a_character_are_drawn_as_parts_of_one_never_as_escapes():
    """Lesson 11's hybrid checkpoint prompts token ids 100-115 of the bundled tokenizer: lone UTF-8
    continuation bytes ('\\xa6', '\\xa7', ...), which no neighbour completes. The tables, the hash
    chains and the inspector draw each as '◌' (a part of a character), as they draw the pieces
    before a split character's last; a control character keeps its escape."""
    from transformers import AutoTokenizer

    from blockviz.lessons.lesson11 import A_PROMPT
    from blockviz.model.palette import show_tokens
    from blockviz.session.engine_session import token_texts
    from engine.model_source import check_model

    tokenizer = AutoTokenizer.from_pretrained(str(check_model("tiny-shakespeare")))
    pieces = list(token_texts(tokenizer, A_PROMPT))
    stray = [index for index, piece in enumerate(pieces) if piece.startswith("\\x")]
    assert stray, pieces  # the prompt holds lone bytes
    drawn = show_tokens(pieces)
    assert [drawn[index] for index in stray] == ["◌"] * len(stray) and "\\x" not in "".join(drawn)
    assert show_tokens(["\\xa6\\xa7", "ab\\xa6", "\x1b"]) == ["◌", "ab◌", "\\x1b"]
    assert show_tokens(["\\xf0", "\\x1b[2J"]) == ["◌", "\\x1b[2J"]  # an escape written out is no byte


def test_a_live_hybrid_story_counts_its_cards_from_its_checkpoint_directory():
    """A live run of the hybrid story records tiny-hybrid's checkpoint directory as its model
    (tiny_hybrid.resolve): its cards say "of 6" as its replay's do; another model's do not."""
    from blockviz.session.scenario import STORY_CARDS, story_cards

    header = load_trace("hybrid").header
    assert story_cards(header) == STORY_CARDS["story-hybrid"]
    assert story_cards(dict(header, model="/home/me/.cache/blockviz/tiny-hybrid-v1")) == STORY_CARDS["story-hybrid"]
    assert story_cards(dict(header, model="/home/me/checkpoints/other-model")) is None
