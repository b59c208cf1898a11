"""SGLang's story (issue 49 item 4): `blockviz run --kv-manager sglang` plays scenario.SGLANG_SCENARIO
("story-sglang") on SGLang 0.5.23's own RadixCache and scheduling policy, guided, with a card for a
node split, a lock along a running request's path, the page floor (page_size 4), lpm reordering the
waiting queue and an eviction of whole leaves that frees more than it was asked; each card names
SGLang's function and says only what the run's events say, checked here against the events (and
the reducer's tree, which tests/test_sglang_core.py holds equal to SGLang's root_node after every
step) and, in a live run, against what SGLang's RadixCache.evict returned. The shipped trace
(blockviz/traces/sglang-story.jsonl) is what a live run plays; replaying it needs no SGLang."""

from __future__ import annotations

import re
import subprocess
import sys
from dataclasses import asdict

import pytest

from blockviz.cli import build_parser
from blockviz.model.guide import Guide
from blockviz.model.operation import drawn_state_problems
from blockviz.model.timeline import Timeline
from blockviz.model.trace import load_trace
from blockviz.session.scenario import SGLANG_SCENARIO, STORY_CARDS, is_story, story_cards
from engine import events as ev
from optional_parts import needs_sglang
from story_fixtures import play_card_to_card, run_live

RADIX_IDEAS = ("radix-split", "radix-lock", "page-floor", "lpm-order", "eviction")


@pytest.fixture(scope="module")
def story():
    trace = load_trace("sglang-story")
    guide = Guide(trace.header["kv_manager"], opening=True, header=trace.header)
    guide.scan(trace.events)
    guide.settle()
    return trace, {card.idea: card for card in guide.cards}, guide.cards


def _comparable(event: ev.Event) -> dict:
    """An event less what differs between two machines by nature (tests/test_cpu_tier_story.py's)."""
    fields = event.to_dict()
    fields.pop("duration_s", None)
    fields.pop("digest", None)
    return fields


def _hits(events, seq_id: int) -> list[ev.PrefixCacheHit]:
    """The seq's hits at its admission: the PrefixCacheHit events of its first lookup."""
    first = next(i for i, e in enumerate(events) if isinstance(e, ev.PrefixCacheHit) and e.seq_ids == (seq_id,))
    hits = []
    for e in events[first:]:
        if not (isinstance(e, ev.PrefixCacheHit) and e.seq_ids == (seq_id,)):
            break
        hits.append(e)
    return hits


def _prompts(events) -> dict[int, tuple[int, ...]]:
    return {e.seq_ids[0]: e.prompt_token_ids for e in events if isinstance(e, ev.RequestAdded)}


def _state_at(trace, position: int):
    timeline = Timeline.for_trace(trace)
    timeline.seek(position)
    return timeline.state


# ---------------------------------------------------------------- which story `run` plays


@needs_sglang
def test_run_with_the_sglang_design_plays_the_sglang_story_on_its_settings():
    """`run --kv-manager sglang` plays story-sglang: page_size 4 and lpm from the story's
    sglang_options, v1's token budget; an option given on the command line goes on top, and the
    story's page follows --block-size."""
    from blockviz.commands.record import scenario_spec
    from blockviz.commands.run import check

    parse = build_parser().parse_args
    spec = check(parse(["run", "--kv-manager", "sglang"]), device=False)
    assert spec.arrivals == SGLANG_SCENARIO and spec.config.kv_manager == "sglang"
    assert spec.config.sglang_options == {"page_size": 4, "schedule_policy": "lpm"} and spec.config.block_size == 4
    assert spec.config.max_num_batched_tokens == 16
    given = check(parse(["run", "--kv-manager", "sglang", "--block-size", "8", "--sglang-option", "schedule_policy=fcfs"]),
                  device=False)
    assert given.config.sglang_options == {"page_size": 8, "schedule_policy": "fcfs"} and given.config.block_size == 8
    recorded = scenario_spec("story-sglang", parse(["record", "--out", "t.jsonl", "--scenario", "story-sglang"]))
    def engine(config):  # a design without swap has no swap pool: its CPU block count is never read
        return {k: v for k, v in asdict(config).items() if k != "num_cpu_blocks"}

    assert recorded.arrivals == spec.arrivals and engine(recorded.config) == engine(spec.config)


def test_without_sglang_run_names_the_install_command_in_one_line():
    code = ("import sys; sys.modules['sglang'] = None; from blockviz.cli import main; "
            "sys.exit(main(['run', '--kv-manager', 'sglang']))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "pip install --no-deps sglang==0.5.23" in lines[0]


# ---------------------------------------------------------------- the shipped trace: each card's claim


def test_the_shipped_story_is_a_guided_story_with_every_radix_card(story):
    trace, cards, ordered = story
    header = trace.header
    assert header["kv_manager"] == "sglang" and header["scenario"] == "sglang-story" and is_story(header)
    assert header["sglang_options"] == {"page_size": 4, "schedule_policy": "lpm"}
    assert [a["prompt"] for a in header["arrivals"]] == [a.prompt for a in SGLANG_SCENARIO]
    assert set(RADIX_IDEAS) <= set(cards) and story_cards(header) == len(ordered) == STORY_CARDS["story-sglang"]
    assert "prefix-hit" not in cards  # a hit on the tree is a lock or the page floor, not vLLM's hash hit
    timeline = Timeline.for_trace(trace)
    for idea in RADIX_IDEAS:  # each card's function is SGLang's, and it stops between operations
        card = cards[idea]
        assert "sglang/srt/" in card.function and "vllm" not in card.function.lower(), idea
        assert card.position == timeline.operation_end(card.start + 1), idea
        timeline.seek(card.position)
        assert timeline.operation_at() is None and not drawn_state_problems(timeline.state), idea
        for _, number in card.blocks:  # the card names the blocks it highlights
            assert re.search(rf"\b{number}\b", card.what), (idea, number)
    assert "chunked-prefill" in cards and "chunked_prefill_size" in cards["chunked-prefill"].why
    assert not any("max_num_batched_tokens" in card.why for card in ordered)  # SGLang's knobs, not vLLM's
    assert "SGLang 0.5.23's RadixCache" in ordered[0].what and "Scheduler, KVCacheManager" not in ordered[0].what


def test_each_front_end_labels_an_sglang_card_by_sglang(story):
    """Issue 49: a card naming SGLang's function says "SGLang:" (the TUI's card, the notebook's
    card record the JS draws as "in SGLang:", the trace page's moments), the opening card, naming
    the PagedAttention paper and vLLM's managers, "vLLM:"."""
    from blockviz.jupyter.visualizer import Visualizer
    from blockviz.model.view import card_record
    from blockviz.webpage.page import moments

    trace, cards, ordered = story
    assert ordered[0].upstream == "vLLM"
    for card in ordered[1:]:
        assert card.upstream == ("SGLang" if "sglang/srt/" in card.function else "vLLM"), card.idea
        assert card_record(card)["upstream"] == card.upstream
    assert all(card.upstream == "SGLang" for card in ordered[1:])
    shots = moments(Visualizer.from_trace("sglang-story"))
    assert len(shots) == len(ordered)
    for shot, card in zip(shots, ordered):
        assert f"{card.upstream}: {card.function}" in shot.lines, card.idea
        assert card.upstream == "vLLM" or not any(line.startswith("vLLM: ") for line in shot.lines), card.idea


def test_the_split_card_says_where_the_node_split(story):
    trace, cards, _ = story
    card = cards["radix-split"]
    split = trace.events[card.start]
    assert isinstance(split, ev.RadixNodeSplit) and card.start == next(
        i for i, e in enumerate(trace.events) if isinstance(e, ev.RadixNodeSplit))
    nodes = _state_at(trace, card.position).radix_nodes
    head, tail = nodes[split.new_node_id], nodes[split.node_id]
    assert tail.parent_id == split.new_node_id and len(head.token_ids) == split.num_tokens
    assert f"split that node at token {split.num_tokens}" in card.what and f"node {split.node_id}" in card.what
    assert f"other {len(tail.token_ids)}" in card.what
    pages = {slot // trace.header["block_size"] for slot in head.slots + tail.slots}
    assert {b for _, b in card.blocks} == pages
    # the request it names shares exactly the path down to the split with the cached prompt
    (seq_id,) = card.seqs
    path, node = [], split.new_node_id
    while node is not None:
        path[:0] = nodes[node].token_ids
        node = nodes[node].parent_id
    assert _prompts(trace.events)[seq_id][:len(path)] == tuple(path) and f"for {len(path)} tokens" in card.what


def test_the_lock_card_shows_the_path_locked_up_to_the_root(story):
    trace, cards, _ = story
    card = cards["radix-lock"]
    (seq_id,) = card.seqs
    hits = _hits(trace.events, seq_id)
    assert trace.events[card.start] is hits[0] and {b for _, b in card.blocks} == {h.block for h in hits}
    state = _state_at(trace, card.position)
    page_size = trace.header["block_size"]
    last = next(n for n, node in state.radix_nodes.items() if hits[-1].block in {s // page_size for s in node.slots})
    path = []
    while last is not None:  # every node from the request's last one to the root is locked
        node = state.radix_nodes[last]
        assert node.lock_ref > 0, last
        path.append(f"node {last} (lock_ref {node.lock_ref})")
        last = node.parent_id
    assert len(path) >= 2 and " → ".join(path) + " → root" in card.what
    protected = sum(len(n.token_ids) for n in state.radix_nodes.values() if n.lock_ref > 0)
    evictable = sum(len(n.token_ids) for n in state.radix_nodes.values() if n.lock_ref == 0)
    assert f"Protected (lock_ref > 0): {protected} tokens; evictable: {evictable}" in card.what
    assert f"found {len(hits) * page_size} tokens" in card.what


def test_the_page_floor_card_reads_its_hit_and_the_partial_page_off_the_events(story):
    trace, cards, _ = story
    card = cards["page-floor"]
    seq_id, other = card.seqs
    page_size = trace.header["block_size"]
    hits = _hits(trace.events, seq_id)
    hit = len(hits) * page_size
    prompts = _prompts(trace.events)
    shared = next(k for k in range(len(prompts[seq_id]) + 1)
                  if k == len(prompts[seq_id]) or k == len(prompts[other]) or prompts[seq_id][k] != prompts[other][k])
    assert hit % page_size == 0 and hit < shared < hit + page_size, (hit, shared)
    first = next(e for e in trace.events if isinstance(e, ev.TokensScheduled) and seq_id in e.seq_ids)
    assert first.num_computed_tokens[first.seq_ids.index(seq_id)] == hit  # what SGLang's match gave it
    assert f"the same {shared} tokens as request {other}'s" in card.what and f"its hit is {hit} tokens" in card.what
    state = _state_at(trace, card.position)
    partial = state.tables[other][hit // page_size][1]
    in_tree = {slot // page_size for node in state.radix_nodes.values() for slot in node.slots}
    assert partial not in in_tree and f"block {partial}" in card.what  # the partial last page is not in the tree
    assert ("gpu", partial) in card.blocks


def test_the_lpm_card_names_a_request_that_arrived_later_and_ran_first(story):
    trace, cards, _ = story
    card = cards["lpm-order"]
    first, *waited = card.seqs
    events = trace.events
    added = [e.seq_ids[0] for e in events if isinstance(e, ev.RequestAdded)]
    scheduled = [s for e in events if isinstance(e, ev.TokensScheduled) for s in e.seq_ids]
    first_run = {seq: scheduled.index(seq) for seq in set(scheduled)}
    for seq in waited:
        assert added.index(seq) < added.index(first) and first_run[seq] > first_run[first], seq
    step = events[card.start]
    assert isinstance(step, ev.TokensScheduled) and first in step.seq_ids and not set(waited) & set(step.seq_ids)
    cached = step.num_computed_tokens[step.seq_ids.index(first)]
    assert cached > 0 and f"request {first} has {cached} (pages " in card.what and "schedule_policy=lpm" in card.what


def test_the_eviction_card_freed_more_than_asked_and_names_the_leaves(story):
    trace, cards, _ = story
    card = cards["eviction"]
    events = trace.events
    call_at = max(i for i in range(card.start) if isinstance(events[i], ev.RadixEvict))
    call = events[call_at]
    leaves = [e for e in events[call_at + 1:card.start] if isinstance(e, ev.RadixNodeEvicted)]
    assert call.num_tokens_evicted > call.num_tokens and sum(len(leaf.token_ids) for leaf in leaves) == call.num_tokens_evicted
    assert f"asked for {call.num_tokens} and freed {call.num_tokens_evicted}" in card.what
    assert all(f"node {leaf.node_id} " in card.what for leaf in leaves)
    page_size = trace.header["block_size"]
    evicted = {slot // page_size for leaf in leaves for slot in leaf.slots}
    assert {b for _, b in card.blocks} == evicted
    state = _state_at(trace, card.position)
    assert not {leaf.node_id for leaf in leaves} & set(state.radix_nodes)


# ---------------------------------------------------------------- played guided, 80x24


@pytest.fixture
def anyio_backend():
    return "asyncio"


@pytest.mark.anyio
async def test_replay_of_the_sglang_story_plays_guided_to_its_end_at_80x24_landing_on_every_card(story):
    from blockviz.commands.replay import check as replay_check
    from blockviz.tui.app import BlockvizApp
    from test_guided_story import card_text

    _, _, ordered = story
    path, trace = replay_check(build_parser().parse_args(["replay", "sglang-story"]))
    assert path.name == "sglang-story.jsonl"
    app = BlockvizApp(trace=trace, deterministic=True, play=False, guided=True)

    def on_card(card) -> bool:  # each card's title on the screen; play on to the end
        assert card.title in card_text(app), card.idea
        return False

    async with app.run_test(size=(80, 24)) as pilot:
        assert app.player.card == ordered[0]
        seen = await play_card_to_card(app, pilot, on_card)
        assert app.player.timeline.at_end
    assert [card.idea for card in seen] == [card.idea for card in ordered[1:]]


# ---------------------------------------------------------------- live: the shipped trace, SGLang's own evict


@pytest.fixture(scope="module")
def live_story():
    """The story as `blockviz run --kv-manager sglang` plays it, with no UI, each call of SGLang's
    RadixCache.evict recorded as SGLang returned it."""
    from unittest import mock

    from engine.sglang_core.imports import sglang_classes

    RadixCache = sglang_classes().RadixCache  # SGLang's modules imported as the engine imports them
    calls = []
    evict = RadixCache.evict

    def recorded(self, params):
        result = evict(self, params)
        calls.append((params.num_tokens, result.num_tokens_evicted))
        return result

    with mock.patch.object(RadixCache, "evict", recorded):
        header, events = run_live(["--kv-manager", "sglang", "--device", "cpu"])
    return header, events, calls


@needs_sglang
@pytest.mark.slow
def test_the_live_sglang_story_equals_the_shipped_trace_and_sglangs_evictions(live_story):
    header, events, calls = live_story
    shipped = load_trace("sglang-story")
    assert [_comparable(e) for e in events] == [_comparable(e) for e in shipped.events]
    assert {k: header[k] for k in header} == {k: shipped.header[k] for k in header}
    told = [(e.num_tokens, e.num_tokens_evicted) for e in events if isinstance(e, ev.RadixEvict)]
    assert told == calls and any(freed > asked for asked, freed in calls)


def test_the_explainer_of_an_sglang_run_finds_the_pages_its_tree_served():
    """"Why hit or miss" on an SGLang trace: each request's lookup hits exactly the pages the run's
    prefix_cache_hit events placed in its table at admission (the adapter names pages by a digest of
    their prefix; the explainer chains the same names), and misses after them."""
    from blockviz.model.design import kv_manager_of
    from blockviz.model.explain import HIT, explain_requests

    trace = load_trace("sglang-story")
    header = trace.header
    explained = explain_requests(trace.events, header["block_size"], header["num_gpu_blocks"],
                                 header["num_cpu_blocks"], True, kv_manager_of(header))
    first_hits: dict[int, int] = {}  # seq id -> pages hit before its first fresh page
    fresh: set[int] = set()
    for e in trace.events:
        if e.type == "block_allocated":
            fresh.update(e.seq_ids)
        elif e.type == "prefix_cache_hit":
            for seq_id in e.seq_ids:
                if seq_id not in fresh:
                    first_hits[seq_id] = first_hits.get(seq_id, 0) + 1
    assert sum(first_hits.values()) >= 13  # the split, lock and page-floor cards' requests hit
    for explanation in explained:
        verdicts = [block.verdict for block in explanation.blocks]
        hits = first_hits.get(explanation.seq_id, 0)
        assert verdicts[:hits] == [HIT] * hits and HIT not in verdicts[hits:], (explanation.request_id, verdicts)


def test_the_text_summary_of_an_sglang_run_counts_pages_not_hashes(story):
    """The text summary (`blockviz replay --text`, the notebook's text view) of a radix run names what
    SGLang's tree holds: cached pages and prompt pages looked up, not vLLM's block hashes."""
    from blockviz.model.view import summary_text

    trace, _, _ = story
    timeline = Timeline.for_trace(trace)
    timeline.seek(len(trace.events))
    state = timeline.state
    line = next(line for line in summary_text(state).splitlines() if line.startswith("prefix cache:"))
    assert line == (f"prefix cache: {len(state.hash_map)} cached pages · hits {state.num_prefix_hits}"
                    f"/{state.num_prompt_blocks_looked_up} prompt pages"), line
    assert state.num_prefix_hits > 0
