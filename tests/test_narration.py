"""The "what just happened" line: one plain sentence per event, from the state after it."""

from __future__ import annotations

import pytest

from blockviz.model.names import RequestNames
from blockviz.model.timeline import Timeline
from blockviz.model.narration import describe, narrate
from blockviz.model.trace import load_trace, resolve_trace_path, shipped_traces


@pytest.mark.parametrize("name", shipped_traces())
def test_every_event_of_every_shipped_trace_has_one_line(name):
    timeline = Timeline.for_trace(load_trace(resolve_trace_path(name)))
    assert narrate(None, timeline.state) == ""
    kinds = set()
    while timeline.forward():
        line = narrate(timeline.current_event, timeline.state)
        assert line and "\n" not in line
        kinds.add(timeline.current_event.type)
        assert line != timeline.current_event.type.replace("_", " ")  # every kind has its sentence
    assert {"block_allocated", "slot_appended", "step_started"} <= kinds


def test_fork_and_copy_on_write_say_what_is_shared_and_what_is_copied():
    timeline = Timeline.for_trace(load_trace(resolve_trace_path("fork-cow")))
    lines = {}
    while timeline.forward():
        event = timeline.current_event
        if event.type in ("fork", "copy_on_write") and event.type not in lines:
            lines[event.type] = (event, narrate(event, timeline.state),
                                 describe(event, names=RequestNames(timeline.state)))
    fork, fork_line, fork_log = lines["fork"]
    assert fork_line.startswith(fork_log + ": ")  # the log's text, then what it means
    request = timeline.state.seqs[fork.parent_seq_id].request_id  # the sequence named by its request (n is 2)
    assert fork_line.startswith(f"fork request {request} (seq {fork.parent_seq_id}) → request {request} "
                                f"(seq {fork.child_seq_id}) shares ")
    assert "nothing copied" in fork_line and "(ref 2)" in fork_line
    cow, cow_line, _ = lines["copy_on_write"]
    assert f"copied to block {cow.dst_block}" in cow_line and f"block {cow.src_block} keeps" in cow_line


def test_a_scheduled_line_names_each_sequences_part_as_the_step_kind_counts_it():
    """A chunk, a whole prefill and a decode: the log's words per sequence, with the decode test
    the step's kind uses (engine/scheduler_output.py is_decode)."""
    from engine import events as ev

    line = describe(ev.TokensScheduled(seq_no=0, step=3, seq_ids=(0, 1, 2), num_computed_tokens=(0, 4, 8),
                                       num_new_tokens=(4, 5, 1), num_tokens=(10, 9, 9)))
    assert line == "step 3 schedules seq 0 0+4/10 chunk, seq 1 4+5/9 prefill, seq 2 8+1/9 decode"


def test_radix_events_say_what_sglangs_tree_did():
    """Issue 49: the log's line for each radix event of the SGLang story: the node and its tokens
    inserted, the split's two nodes, the lock_ref and what it protects, an evict call's asked and
    freed, the leaf it took."""
    from engine import events as ev

    timeline = Timeline.for_trace(load_trace("sglang-story"))
    said: dict[type, list[str]] = {}
    while timeline.forward():
        event = timeline.current_event
        if type(event).__name__.startswith("Radix"):
            line = narrate(event, timeline.state, timeline.token_texts)
            said.setdefault(type(event), []).append(line)
            if isinstance(event, ev.RadixNodeInserted):
                assert line.startswith(f"radix insert node {event.node_id} under ") and f"lock_ref {event.lock_ref}" in line
            elif isinstance(event, ev.RadixNodeSplit):
                assert f"new node {event.new_node_id} takes its first {event.num_tokens} token" in line
            elif isinstance(event, ev.RadixLockRef):
                assert line.startswith(f"radix node {event.node_id} lock_ref {event.lock_ref}: ")
                assert ("protected" in line) == (event.lock_ref > 0)
            elif isinstance(event, ev.RadixEvict):
                assert f"asked for {event.num_tokens} token" in line and f"freed {event.num_tokens_evicted}" in line
            elif isinstance(event, ev.RadixNodeEvicted):
                assert line.startswith(f"radix evict node {event.node_id}: {len(event.token_ids)} token")
    assert len(said) == 5, sorted(kind.__name__ for kind in said)
