"""The CPU tier's story (issue 45 item 4): `blockviz run --kv-manager vllm --kv-offloading-size [GiB]`
plays scenario.CPU_TIER_SCENARIO ("story-cpu-tier") on vLLM 0.33's own scheduler with its CPU tier,
guided, with a card for a store to the CPU tier, the preempted request, and its prefix loaded back
from the tier (vLLM v1's answer to v0's swap); each card lands at the end of the operation its event
starts. The why panel counts the load as hits from the CPU tier, and the log names the load's
request as the tables do. The shipped trace (blockviz/traces/cpu-tier.jsonl) is what a live run
plays, and `blockviz record --scenario` records what `run` plays (item 3)."""

from __future__ import annotations

import importlib.util
import re
from dataclasses import asdict

import pytest

from blockviz.cli import build_parser, main
from blockviz.commands.record import scenario_spec
from blockviz.commands.run import check
from blockviz.model.design import KV_DESIGNS
from blockviz.model.explain import AFTER_A_MISS, CPU_HIT, Explainer
from blockviz.model.guide import Guide
from blockviz.model.narration import describe
from blockviz.model.names import RequestNames
from blockviz.model.operation import drawn_state_problems
from blockviz.model.reducer import ReducerState
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace, read_trace
from blockviz.session.scenario import CPU_TIER_GIB, CPU_TIER_SCENARIO, DEFAULT_V1_SCENARIO
from engine import events as ev
from story_fixtures import play_card_to_card, run_live

needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


def moments(events) -> dict[str, int]:
    """The index of the first event of each moment the CPU tier's story is told for, read plainly
    off the events: a store, a recompute preemption, the load of a request preempted before it."""
    found: dict[str, int] = {}
    preempted: set[int] = set()
    for index, e in enumerate(events):
        if isinstance(e, ev.OffloadStored) and e.mapping:
            found.setdefault("offload-store", index)
        if isinstance(e, ev.Preempted) and e.mode == "recompute":
            found.setdefault("recompute", index)
            preempted.update(e.seq_ids)
        if isinstance(e, ev.OffloadLoaded) and e.seq_id in preempted:
            found.setdefault("offload-load", index)
    return found


def _comparable(event: ev.Event) -> dict:
    """An event less what differs between two machines by nature (tests/test_hybrid_story.py's)."""
    fields = event.to_dict()
    fields.pop("duration_s", None)
    fields.pop("digest", None)
    return fields


# ---------------------------------------------------------------- which story `run` plays


@needs_vllm
def test_run_with_the_offloading_flag_plays_the_cpu_tier_story():
    """With --kv-offloading-size under vllm, `run` plays the CPU tier's story (the flag alone: the
    story's 2 MiB tier); without it, v1's story on vLLM's scheduler."""
    parse = build_parser().parse_args
    default = check(parse(["run", "--kv-manager", "vllm", "--kv-offloading-size"]), device=False)
    assert default.arrivals == CPU_TIER_SCENARIO and default.config.vllm_options == {"kv_offloading_size": CPU_TIER_GIB}
    assert default.config.kv_manager == "vllm" and default.config.max_num_batched_tokens  # v1's token budget
    sized = check(parse(["run", "--kv-manager", "vllm", "--kv-offloading-size", "0.01"]), device=False)
    assert sized.arrivals == CPU_TIER_SCENARIO and sized.config.vllm_options == {"kv_offloading_size": 0.01}
    plain = check(parse(["run", "--kv-manager", "vllm"]), device=False)
    assert plain.arrivals == DEFAULT_V1_SCENARIO and not plain.config.vllm_options


@needs_vllm
@pytest.mark.parametrize(("name", "flags"), [
    ("story", []), ("story-v1", ["--kv-manager", "v1"]), ("story", ["--kv-manager", "v1"]),
    ("story-hybrid", ["--model", "tiny-hybrid"]), ("story-cpu-tier", ["--kv-manager", "vllm", "--kv-offloading-size"]),
    ("story", ["--kv-manager", "vllm", "--kv-offloading-size"]),
])
def test_record_scenario_builds_the_spec_run_plays(name, flags, tmp_path, monkeypatch):
    """`record --scenario NAME [flags]` and `run [flags]`: the same requests, sampling and engine
    settings (a design without swap has no swap pool: its CPU block count is never read)."""
    monkeypatch.setenv("BLOCKVIZ_CACHE_DIR", str(tmp_path))  # tiny-hybrid is built here
    parse = build_parser().parse_args
    run = check(parse(["run", *flags]), device=False)
    recorded = scenario_spec(name, parse(["record", "--out", str(tmp_path / "t.jsonl"), "--scenario", name, *flags]))
    assert (recorded.arrivals, recorded.prompts, recorded.n, recorded.max_tokens, recorded.temperature) == (
        run.arrivals, run.prompts, run.n, run.max_tokens, run.temperature)

    def engine(config):
        swaps = KV_DESIGNS[config.kv_manager].swap
        return {k: v for k, v in asdict(config).items() if swaps or k != "num_cpu_blocks"}

    assert engine(recorded.config) == engine(run.config)


@pytest.mark.parametrize(("args", "expected"), [
    (["--scenario", "story", "--prompt", "ROMEO:"], "--scenario story plays the story's own requests"),
    (["--scenario", "story-v1", "--n", "2"], "--n applies to --prompt requests"),
], ids=["prompt", "n"])
def test_record_scenario_refuses_what_the_story_sets_in_one_line(tmp_path, capsys, args, expected):
    assert main(["record", "--out", str(tmp_path / "t.jsonl"), *args]) == 2
    err = capsys.readouterr().err
    assert expected in err and err.count("\n") == 1 and "Traceback" not in err, err
    assert not (tmp_path / "t.jsonl").exists()


def test_record_names_the_scenarios_it_knows(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["record", "--out", str(tmp_path / "t.jsonl"), "--scenario", "saga"])
    err = capsys.readouterr().err
    assert raised.value.code == 2 and err.count("\n") == 1 and "story-cpu-tier" in err, err


# ---------------------------------------------------------------- the shipped trace: cards, why, log


def test_the_shipped_cpu_tier_trace_has_each_card_where_its_event_is():
    trace = load_trace("cpu-tier")
    header = trace.header
    assert header["kv_manager"] == "vllm" and header["scenario"] == "cpu-tier"
    assert header["vllm_options"] == {"kv_offloading_size": CPU_TIER_GIB} and header["num_cpu_blocks"] > 0
    assert [a["prompt"] for a in header["arrivals"]] == [a.prompt for a in CPU_TIER_SCENARIO]
    found = moments(trace.events)
    assert found["offload-store"] < found["recompute"] < found["offload-load"], found
    guide = Guide("vllm", opening=True, header=header)
    guide.scan(trace.events)
    guide.settle()
    cards = {card.idea: card for card in guide.cards}
    timeline = Timeline.for_trace(trace)
    for idea, index in found.items():  # each card starts at its event and stops where the operation ends
        card = cards[idea]
        assert card.start == index and card.seq_no == trace.events[index].seq_no, idea
        assert card.position == timeline.operation_end(index + 1), idea
        timeline.seek(card.position)
        assert timeline.operation_at() is None and not drawn_state_problems(timeline.state), idea
    store, load = trace.events[found["offload-store"]], trace.events[found["offload-load"]]
    assert set(cards["offload-store"].blocks) == {("gpu", g) for g, _ in store.mapping} | {("cpu", c) for _, c in store.mapping}
    assert set(cards["offload-load"].blocks) == {("cpu", c) for c, _ in load.mapping}  # its GPU blocks: its table
    assert cards["offload-load"].seqs == (load.seq_id,) and "came back after its preemption" in cards["offload-load"].what
    # one name per request (blockviz.model.names): its sequence only where the request has several
    assert re.search(rf"request {load.request_id}\b(?! \(seq)", cards["offload-load"].what)
    assert "SimpleCPUOffloadScheduler" in cards["offload-store"].function
    assert "get_num_new_matched_tokens" in cards["offload-load"].function
    assert "CPU tier" in cards["recompute"].why and "v0" in cards["offload-load"].why
    for card in (cards["offload-store"], cards["offload-load"]):  # the card names its blocks
        for device, number in card.blocks:
            assert re.search(rf"\b{number}\b", card.what), (card.idea, device, number)
    assert "vLLM" in cards["kv-cache"].what and "are blockviz's" in cards["kv-cache"].what


def test_the_load_is_hits_from_the_cpu_tier_in_the_why_panel_and_the_log_names_its_request():
    """The explainer (the why panel's) counts the loaded blocks as hits from the CPU tier, not
    "evicted ... not looked up: after the first miss"; the log's request is the tables' request."""
    trace = load_trace("cpu-tier")
    header = trace.header
    at = moments(trace.events)["offload-load"]
    load = trace.events[at]
    state = ReducerState.from_header(header)
    explainer = Explainer(header["enable_prefix_caching"], header["kv_manager"], header["prefix_caching_hash_algo"])
    for event in trace.events[:at + 1]:
        explainer.feed(event, state)
        state.apply(event)
    lookup = next(x for x in reversed(explainer.explained) if x.seq_id == load.seq_id)
    assert lookup.recomputed and lookup.num_cpu_hit_blocks == len(load.mapping)
    assert lookup.num_hit_tokens >= load.num_tokens == len(load.mapping) * header["block_size"]
    table = state.tables[load.seq_id]
    for cpu, gpu in load.mapping:
        row = lookup.blocks[table.index(("gpu", gpu))]
        assert row.verdict == CPU_HIT and row.block == cpu and f"gpu block {gpu}" in row.detail
    assert lookup.first_miss is None or lookup.first_miss.verdict != AFTER_A_MISS
    assert "from the CPU tier" in lookup.lines()[-1]
    added = next(e for e in trace.events if isinstance(e, ev.RequestAdded) and load.seq_id in e.seq_ids)
    assert load.request_id == added.request_id  # not the vLLM request id (our seq id)
    assert f"offload LOAD request {added.request_id}:" in describe(load, names=RequestNames(state))


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_replay_cpu_tier_plays_guided_to_its_end_stopping_at_each_card():
    from blockviz.commands.replay import check as replay_check
    from blockviz.session.scenario import is_story
    from blockviz.tui.app import BlockvizApp
    from test_guided_story import card_text

    path, trace = replay_check(build_parser().parse_args(["replay", "cpu-tier"]))
    assert path.name == "cpu-tier.jsonl" and is_story(trace.header)
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
    def on_card(card) -> bool:  # each card's title on the screen; play on to the end
        assert card.title in card_text(app), card.idea
        return False

    async with app.run_test(size=(200, 60)) as pilot:
        seen = await play_card_to_card(app, pilot, on_card)
        assert app.player.timeline.at_end
    ideas = [card.idea for card in seen]
    assert [i for i in ideas if i in ("offload-store", "recompute", "offload-load")] == [
        "offload-store", "recompute", "offload-load"]


# ---------------------------------------------------------------- live: run, record, the shipped trace


@pytest.fixture(scope="module")
def live_cpu_tier():
    """The story as `blockviz run --kv-manager vllm --kv-offloading-size` plays it, with no UI."""
    return run_live(["--kv-manager", "vllm", "--kv-offloading-size", "--device", "cpu"])


@needs_vllm
def test_the_live_cpu_tier_story_equals_the_shipped_trace(live_cpu_tier):
    header, events = live_cpu_tier
    assert set(moments(events)) == {"offload-store", "recompute", "offload-load"}
    shipped = load_trace("cpu-tier")
    assert [_comparable(e) for e in events] == [_comparable(e) for e in shipped.events]
    assert {k: header[k] for k in header} == {k: shipped.header[k] for k in header}


@needs_vllm
def test_record_scenario_writes_what_run_plays(live_cpu_tier, tmp_path):
    """`record --scenario story-cpu-tier` (the CLI, as a user types it): the events `run` plays."""
    header, events = live_cpu_tier
    out = tmp_path / "cpu.jsonl"
    assert main(["record", "--out", str(out), "--scenario", "story-cpu-tier", "--device", "cpu"]) == 0
    trace = read_trace(out)
    assert trace.header["scenario"] == "story-cpu-tier" and trace.header["arrivals"]
    assert [_comparable(e) for e in trace.events] == [_comparable(e) for e in events]


def test_record_scenario_v1_writes_what_run_plays(tmp_path):
    """The same for vLLM v1's story on blockviz's own v1 (`run --kv-manager v1`)."""
    header, events = run_live(["--kv-manager", "v1", "--device", "cpu"])
    out = tmp_path / "v1.jsonl"
    assert main(["record", "--out", str(out), "--scenario", "story", "--kv-manager", "v1", "--device", "cpu"]) == 0
    trace = read_trace(out)
    assert [_comparable(e) for e in trace.events] == [_comparable(e) for e in events]
    assert {k: trace.header[k] for k in header if k != "model"} == {k: header[k] for k in header if k != "model"}


# ---------------------------------------------------------------- vLLM's log noise off the terminal


def test_vllms_loggers_are_quiet_while_its_objects_are_built_then_as_they_were(caplog):
    import logging

    from engine.vllm_core import VLLM_LOGGER, quiet_vllm_logs

    logger = logging.getLogger(VLLM_LOGGER)
    saved = logger.level
    logger.setLevel(logging.INFO)
    try:
        with caplog.at_level(logging.INFO):
            with quiet_vllm_logs():
                logging.getLogger("vllm.platforms.interface").warning("Failed to import from vllm._C")
                logging.getLogger("engine").warning("ours")  # another logger keeps its level
            logging.getLogger("vllm.platforms.interface").warning("after the build")
        said = [record.getMessage() for record in caplog.records]
        assert said == ["ours", "after the build"] and logger.level == logging.INFO
    finally:
        logger.setLevel(saved)


@needs_vllm
@pytest.mark.parametrize("command", ["record", "generate"])
def test_a_vllm_run_on_the_command_line_prints_no_vllm_log_line(tiny_gpt2_dir, tmp_path, command):
    """vLLM's import and connector warnings ("Failed to import from vllm._C", "Initializing
    KVConnectorBase_V1") stay off stderr and stdout: what is printed is blockviz's."""
    import subprocess
    import sys

    extra = ["--out", str(tmp_path / "t.jsonl")] if command == "record" else []
    result = subprocess.run([sys.executable, "-m", "blockviz", command, *extra, "--model", str(tiny_gpt2_dir),
                             "--prompt", "ROMEO:", "--max-tokens", "4", "--block-size", "4", "--num-gpu-blocks", "16",
                             "--kv-manager", "vllm", "--kv-offloading-size", "0.001", "--device", "cpu"],
                            capture_output=True, text=True, timeout=400, stdin=subprocess.DEVNULL)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    for noise in ("vllm._C", "KVConnectorBase", "WARNING", "INFO"):
        assert noise not in output, output
    if command == "record":
        assert result.stdout == "" and result.stderr.splitlines()[-1].startswith("recorded ")


# ---------------------------------------------------------------- what is vLLM's and what is ours, on screen


@pytest.mark.anyio
async def test_a_vllm_run_says_whose_code_drives_it_in_the_tui_notebook_and_svg():
    """A `--kv-manager vllm` run is not drawn as a v1 run: its title names vLLM's scheduler and
    blockviz's model runner (the model layer's engine_title, which every front end shows), and its
    opening card says it in a sentence; a v1 run's title and card say neither."""
    from html import unescape

    from blockviz.jupyter import Visualizer
    from blockviz.model.design import attribution
    from blockviz.model.export import trace_frame, trace_title
    from blockviz.model.svg import frame_svg
    from blockviz.model.trace import engine_title
    from blockviz.tui.app import BlockvizApp
    from test_tui_app import screen_text

    trace, v1 = load_trace("cpu-tier"), load_trace("v1-story")
    version = trace.header["vllm_version"]
    short = f"on vLLM {version}'s own Scheduler and KVCacheManager; model runner: blockviz"
    sentence = f"vLLM {version}'s Scheduler, KVCacheManager and BlockPool drive this run"
    assert short in engine_title(trace.header) and "vLLM" not in engine_title(v1.header)
    assert attribution(trace.header).startswith(sentence) and "blockviz's" in attribution(trace.header)
    assert attribution(v1.header) == ""
    svg = unescape(frame_svg(trace_frame(Timeline.for_trace(trace), trace.header, trace_title(trace)),
                             title=trace_title(trace)))
    assert short in svg
    viz = Visualizer.from_trace(trace)
    try:
        assert short in viz.frame()["cursor"]["title"]
        assert sentence in viz.frame()["card"]["what"]  # a replay of the story opens on card 1
    finally:
        viz.close()
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)
    async with app.run_test(size=(220, 60)) as pilot:
        await pilot.pause()
        assert short in screen_text(app)
    opening = Guide("v1", opening=True, header=v1.header).cards[0]
    assert "vLLM" not in opening.what.split(".")[0] and "drive this run" not in opening.what


def test_a_vllm_runs_opening_card_says_which_scheduling_order_it_ran():
    """vLLM 0.33 schedules asynchronously by default; the CPU tier runs the synchronous order: the
    attribution sentence (card 1, the notebook's and TUI's opening) names the order the header
    records, and blockviz's own designs, which have one order, say nothing of it."""
    from blockviz.model.design import attribution

    header = load_trace("cpu-tier").header
    assert header["async_scheduling"] is False
    assert "vLLM's synchronous order (async_scheduling=false, as the CPU tier needs)" in attribution(header)
    no_tier = {k: v for k, v in header.items() if k not in ("kv_offloading_size", "num_cpu_blocks", "kv_offloading")}
    asynchronous = attribution({**no_tier, "async_scheduling": True})
    assert "default asynchronous order" in asynchronous and "vLLM's synchronous" not in asynchronous
    assert "order" not in attribution(load_trace("v1-story").header)
