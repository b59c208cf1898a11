"""The hybrid story (`blockviz run --model tiny-hybrid`, scenario.HYBRID_SCENARIO) and the trace shipped
from it (blockviz/traces/hybrid.jsonl) show each moment they are told for, found by event records and
the explainer: a sliding-window group lets blocks go while their request runs (blocks_skipped, then
block_freed, then the request goes on); a hit that holds in both groups; a later lookup cut short by
the window group ("window tail freed") while every full-attention group holds the block it stopped
at. The guide stops there with cards naming vLLM's functions; the trace is what a fresh run writes.

tiny-hybrid is built into a temporary cache directory (BLOCKVIZ_CACHE_DIR) for this module."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from blockviz.cli import build_parser
from blockviz.commands.run import check
from blockviz.model.design import SLIDING_WINDOW, kv_cache_groups_of
from blockviz.model.explain import WINDOW_TAIL, Explainer
from blockviz.model.guide import Guide
from blockviz.model.operation import drawn_state_problems
from blockviz.model.reducer import ReducerState
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace
from blockviz.session.scenario import HYBRID_SCENARIO, HYBRID_SCENARIO_OPTIONS
from blockviz.session.tiny_hybrid import LAYER_TYPES, SLIDING_WINDOW as WINDOW, TINY_HYBRID, tiny_hybrid_checkpoint
from engine import events as ev
from optional_parts import needs_vllm
from story_fixtures import play_card_to_card, run_live


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory):
    """tiny-hybrid is built here, not in the user's cache (subprocesses inherit it)."""
    patch = pytest.MonkeyPatch()
    path = tmp_path_factory.mktemp("blockviz-cache")
    patch.setenv("BLOCKVIZ_CACHE_DIR", str(path))
    yield path
    patch.undo()


def moments(header: dict, events: list[ev.Event]) -> dict[str, int | None]:
    """The index of the first event showing each moment of the hybrid story (None when it never happens)."""
    found: dict[str, int | None] = dict.fromkeys(("window_slides", "hit_in_every_group", "window_tail"))
    groups = kv_cache_groups_of(header)
    windows = {g for g, group in enumerate(groups) if group.kind == SLIDING_WINDOW}
    full = [g for g in range(len(groups)) if g not in windows]
    state = ReducerState.from_header(header)
    explainer = Explainer(header["enable_prefix_caching"], header["kv_manager"], header["prefix_caching_hash_algo"],
                          groups)
    finished: set[int] = set()
    for index, e in enumerate(events):
        if isinstance(e, ev.SequenceFreed):
            finished.add(e.seq_id)
        if (isinstance(e, ev.BlocksSkipped) and e.blocks and e.group in windows and e.seq_id not in finished
                and found["window_slides"] is None):
            frees = events[index + 1:index + 1 + len(e.blocks)]  # the cause, then its effects
            assert all(isinstance(f, ev.BlockFreed) and f.seq_id == e.seq_id and f.group == e.group for f in frees)
            assert sorted(f.block for f in frees) == sorted(e.blocks) and all(f.ref_count == 0 for f in frees)
            later = events[index + 1 + len(e.blocks):]
            ran_on = any(isinstance(x, ev.TokenGenerated) and x.seq_id == e.seq_id for x in later)
            if ran_on:  # mid-request: the sequence generated tokens after its blocks went back
                found["window_slides"] = index
        if isinstance(e, ev.PrefixCacheHit) and found["hit_in_every_group"] is None:
            hits = [x for x in events[index:] if isinstance(x, ev.PrefixCacheHit) and x.seq_ids == e.seq_ids]
            if {x.group for x in hits} == set(range(len(groups))):
                found["hit_in_every_group"] = index
        before = len(explainer.explained)
        explainer.feed(e, state)
        if len(explainer.explained) > before and found["window_tail"] is None:
            explanation = explainer.explained[-1]
            miss = explanation.first_miss
            if miss is not None and miss.verdict == WINDOW_TAIL and explanation.num_hit_blocks > 0:
                assert all(state.cached_block(miss.block_hash, g) is not None for g in full)  # full attention holds it
                named = re.match(r"group (\d+) \(window \d+\) no longer caches L(\d+)", miss.detail)
                group, lost = map(int, named.groups())
                assert group in windows and state.cached_block(explanation.blocks[lost].block_hash, group) is None
                found["window_tail"] = index
        state.apply(e)
    return found


def test_tiny_hybrid_is_built_offline_the_same_every_time(tmp_path):
    first, second = tiny_hybrid_checkpoint(tmp_path / "a", progress=lambda _: None), \
        tiny_hybrid_checkpoint(tmp_path / "b", progress=lambda _: None)
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (first / name).read_bytes() == (second / name).read_bytes(), name
    config = json.loads((first / "config.json").read_text())
    assert config["layer_types"] == list(LAYER_TYPES) and config["sliding_window"] == WINDOW
    assert {"sliding_attention", "full_attention"} == set(config["layer_types"])
    said = []
    assert tiny_hybrid_checkpoint(tmp_path / "a", progress=said.append) == first and said == []  # built once
    tiny_hybrid_checkpoint(tmp_path / "c", progress=said.append)
    assert len(said) == 1 and "random weights" in said[0]


def test_the_shipped_hybrid_trace_shows_every_moment_of_the_story():
    trace = load_trace("hybrid")
    header = trace.header
    assert header["model"] == TINY_HYBRID and header["kv_manager"] == "v1" and header["model_type"] == "llama"
    assert [(a["step"], a["prompt"], a["n"]) for a in header["arrivals"]] == [
        (a.step, a.prompt, a.n) for a in HYBRID_SCENARIO]
    assert (header["block_size"], header["num_gpu_blocks"]) == (
        HYBRID_SCENARIO_OPTIONS["block_size"], HYBRID_SCENARIO_OPTIONS["num_gpu_blocks"])
    kinds = [(g.kind, g.sliding_window) for g in kv_cache_groups_of(header)]
    assert sorted(kinds, key=str) == sorted([(SLIDING_WINDOW, WINDOW), ("full_attention", None)], key=str)
    found = moments(header, trace.events)
    assert all(index is not None for index in found.values()), found
    assert found["window_slides"] < found["hit_in_every_group"] < found["window_tail"]
    timeline = Timeline.for_trace(trace)  # replays to an empty pool
    timeline.seek(len(timeline))
    assert timeline.state.num_used("gpu") == 0


def test_run_with_model_tiny_hybrid_plays_the_hybrid_story():
    spec = check(build_parser().parse_args(["run", "--model", TINY_HYBRID]), device=False)
    assert spec.arrivals == HYBRID_SCENARIO
    assert spec.config.kv_manager == "v1" and spec.config.preemption_mode is None
    assert spec.config.enable_prefix_caching and spec.config.max_num_batched_tokens is None
    config = json.loads((Path(spec.config.model) / "config.json").read_text())
    assert config["layer_types"] == list(LAYER_TYPES)
    mine = check(build_parser().parse_args(["run", "--model", TINY_HYBRID, "--kv-manager", "v1", "--prompt", "ROMEO:"]),
                 device=False)
    assert not mine.arrivals  # your prompts: no story
    default = check(build_parser().parse_args(["run"]), device=False)
    assert default.arrivals != HYBRID_SCENARIO and default.config.kv_manager == "v0"
    run_help = subprocess.run([sys.executable, "-m", "blockviz", "run", "--help"], capture_output=True, text=True,
                              timeout=60)
    squeezed = "".join(run_help.stdout.split())  # argparse wraps "tiny-hybrid" at its hyphen
    assert f"'{TINY_HYBRID}'" in squeezed and "itstextisnoise,itsmemoryreal" in squeezed


@pytest.mark.parametrize("command", ["run", "record", "generate"])
def test_tiny_hybrid_under_v0_is_one_line_exit_2(tmp_path, command):
    extra = ["--out", str(tmp_path / "t.jsonl")] if command == "record" else []
    result = subprocess.run([sys.executable, "-m", "blockviz", command, *extra, "--model", TINY_HYBRID,
                             "--kv-manager", "v0"], capture_output=True, text=True, timeout=60,
                            stdin=subprocess.DEVNULL)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "--kv-manager v0 cannot run this model" in lines[0] and "Traceback" not in result.stderr


def _comparable(event: ev.Event) -> dict:
    """An event less what differs between two machines by nature (tests/test_engine_session.py's)."""
    fields = event.to_dict()
    fields.pop("duration_s", None)
    fields.pop("digest", None)
    return fields


def test_the_hybrid_story_run_live_shows_every_moment_and_equals_the_shipped_trace():
    """The story as `blockviz run --model tiny-hybrid` plays it: its events are the shipped trace's."""
    header, events = run_live(["--model", TINY_HYBRID, "--device", "cpu"])
    found = moments(header, events)
    assert all(index is not None for index in found.values()), found
    shipped = load_trace("hybrid")
    assert [_comparable(e) for e in events] == [_comparable(e) for e in shipped.events]
    engine_fields = set(header) - {"model"}  # the engine's header: a live run's model is the built directory
    assert {k: header[k] for k in engine_fields} == {k: shipped.header[k] for k in engine_fields}
    assert header["kv_cache_groups"] == shipped.header["kv_cache_groups"]


@needs_vllm
def test_run_with_model_tiny_hybrid_and_kv_manager_vllm_plays_the_hybrid_story():
    vllm = check(build_parser().parse_args(["run", "--model", TINY_HYBRID, "--kv-manager", "vllm"]), device=False)
    assert vllm.arrivals == HYBRID_SCENARIO and vllm.config.kv_manager == "vllm"


@needs_vllm
def test_the_hybrid_story_on_vllms_own_manager_shows_every_moment_with_its_cards():
    """`blockviz run --model tiny-hybrid --kv-manager vllm`: the same story on vLLM 0.33's own hybrid
    manager (HybridKVCacheCoordinator, SlidingWindowManager)."""
    header, events = run_live(["--model", TINY_HYBRID, "--device", "cpu", "--kv-manager", "vllm"])
    found = moments(header, events)
    assert all(index is not None for index in found.values()), found
    guide = Guide("vllm", opening=True, header=header)
    guide.scan(events)
    guide.settle()
    assert "noise" in guide.cards[0].what  # a live run's header names the built directory
    starts = {card.idea: card.start for card in guide.cards}
    assert (starts["window-slides"], starts["prefix-hit"], starts["window-tail"]) == (
        found["window_slides"], found["hit_in_every_group"], found["window_tail"])


def test_the_hybrid_story_has_cards_at_its_moments_in_states_the_engine_stops_in():
    trace = load_trace("hybrid")
    found = moments(trace.header, trace.events)
    guide = Guide("v1", opening=True, header=trace.header)
    guide.scan(trace.events)
    guide.settle()
    cards = {card.idea: card for card in guide.cards}
    assert "random weights: the text it writes is noise, the memory it takes is real" in cards["kv-cache"].what
    assert "noise" not in Guide("v1", opening=True, header=load_trace("v1-story").header).cards[0].what
    assert ["window-slides", "prefix-hit", "window-tail"] == [i for i in cards if i.startswith(("window", "prefix"))]
    slides, hit, tail = cards["window-slides"], cards["prefix-hit"], cards["window-tail"]
    assert slides.start == found["window_slides"] and hit.start == found["hit_in_every_group"]
    assert tail.start == found["window_tail"]
    skipped = trace.events[slides.start]
    assert set(slides.blocks_on("gpu")) == set(skipped.blocks) and skipped.seq_id in slides.seqs
    assert "null block" in slides.what and "still running" in slides.what and f"window of {WINDOW}" in slides.what
    assert "remove_skipped_blocks" in slides.function and "single_type_kv_cache_manager.py" in slides.function
    assert "every KV-cache group" in hit.what and "group 0 (sliding window)" in hit.what
    assert "find_longest_cache_hit" in tail.function and "kv_cache_coordinator.py" in tail.function
    assert "HybridKVCacheCoordinator" in tail.function and "no longer caches" in tail.what
    assert "full-attention group still holds" in tail.what
    timeline = Timeline.for_trace(trace)
    for card in (slides, hit, tail):  # each stop is a state the engine can be in
        timeline.seek(card.position)
        assert timeline.operation_at() is None and not drawn_state_problems(timeline.state), card.idea
    plain = Guide("v1")  # without the header's groups: no window-tail card, the window still slides
    plain.scan(trace.events)
    plain.settle()
    assert "window-tail" not in {c.idea for c in plain.cards} and "window-slides" in {c.idea for c in plain.cards}


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_replay_hybrid_plays_guided_and_stops_at_the_window_cards():
    """`blockviz replay hybrid`, headless: the replay command's check reads the shipped trace, and the app
    (guided, as for any story) stops at the window's cards with their text on the screen."""
    from blockviz.commands.replay import check as replay_check
    from blockviz.session.scenario import is_story
    from blockviz.tui.app import BlockvizApp
    from test_guided_story import card_text

    path, trace = replay_check(build_parser().parse_args(["replay", "hybrid"]))
    assert path.name == "hybrid.jsonl" and is_story(trace.header)
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)

    def on_card(card) -> bool:  # a window card's title on the screen; stop after the window tail
        if card.idea.startswith("window"):
            assert card.title in card_text(app)
        return card.idea == "window-tail"

    async with app.run_test(size=(200, 60)) as pilot:
        seen = [card.idea for card in await play_card_to_card(app, pilot, on_card)]
    assert seen.index("window-slides") < seen.index("window-tail")
