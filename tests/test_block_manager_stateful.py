"""Hypothesis stateful test: random interleavings of add / allocate / append / fork / swap out /
swap in / free never break check_invariants, the reducer fed only events equals the manager after
every operation, and everything ends free."""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine import AllocStatus, BlockSpaceManager, EventBus, Sequence, SequenceGroup, SequenceStatus
from reducer_checks import check_reducer_matches
from engine.invariants import check_invariants
from blockviz.model.reducer import CACHED, FREE, ReducerState

VOCAB = st.integers(min_value=0, max_value=3)  # a tiny vocabulary makes prefix hits common


class BlockManagerMachine(RuleBasedStateMachine):
    @initialize(
        block_size=st.integers(1, 4),
        num_gpu_blocks=st.integers(1, 24),
        num_cpu_blocks=st.integers(0, 16),
        enable_caching=st.booleans(),
    )
    def setup(self, block_size, num_gpu_blocks, num_cpu_blocks, enable_caching):
        self.bus = EventBus()
        self.reducer = ReducerState(block_size, num_gpu_blocks, num_cpu_blocks)
        self.bus.subscribe(self.reducer.apply)
        self.manager = BlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark=0.0,
                                         enable_caching=enable_caching, events=self.bus)
        self.block_size = block_size
        self.waiting: list[SequenceGroup] = []
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self.next_id = 0

    def _new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    @rule(tokens=st.lists(VOCAB, min_size=1, max_size=12))
    def add(self, tokens):
        seq = Sequence(self._new_id(), tokens, self.block_size)
        self.waiting.append(SequenceGroup(f"r{seq.seq_id}", [seq]))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), compute=st.booleans())
    def allocate(self, data, compute):
        """Allocate, and write the K/V now or later (until then another allocation in the same
        "step" may hit the new blocks, as in a prefill step of several requests)."""
        group = data.draw(st.sampled_from(self.waiting))
        if self.manager.can_allocate(group) is not AllocStatus.OK:
            return
        self.manager.allocate(group)
        self.waiting.remove(group)
        self.running.append(group)
        for seq in group.get_seqs():
            seq.status = SequenceStatus.RUNNING
            if compute:
                self.manager.mark_blocks_as_computed(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def compute(self, data):
        group = data.draw(st.sampled_from(self.running))
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            self.manager.mark_blocks_as_computed(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), token=VOCAB)
    def append(self, data, token):
        group = data.draw(st.sampled_from(self.running))
        if not self.manager.can_append_slots(group):
            return
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            seq.append_token_id(token)
            self.manager.append_slots(seq)
            self.manager.mark_blocks_as_computed(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def fork(self, data):
        group = data.draw(st.sampled_from(self.running))
        parent = data.draw(st.sampled_from(group.get_seqs(SequenceStatus.RUNNING)))
        child = parent.fork(self._new_id())
        group.add(child)
        self.manager.fork(parent, child)

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def swap_out(self, data):
        group = data.draw(st.sampled_from(self.running))
        if not self.manager.can_swap_out(group):
            return
        self.manager.swap_out(group)
        for seq in group.get_seqs(SequenceStatus.RUNNING):
            seq.status = SequenceStatus.SWAPPED
        self.running.remove(group)
        self.swapped.append(group)

    @precondition(lambda self: self.swapped)
    @rule(data=st.data())
    def swap_in(self, data):
        group = data.draw(st.sampled_from(self.swapped))
        if self.manager.can_swap_in(group) is not AllocStatus.OK:
            return
        self.manager.swap_in(group)
        for seq in group.get_seqs(SequenceStatus.SWAPPED):
            seq.status = SequenceStatus.RUNNING
        self.swapped.remove(group)
        self.running.append(group)

    @precondition(lambda self: self.running or self.swapped)
    @rule(data=st.data())
    def free(self, data):
        group = data.draw(st.sampled_from(self.running + self.swapped))
        seq = data.draw(st.sampled_from(group.get_unfinished_seqs()))
        self.manager.free(seq)
        seq.status = SequenceStatus.FINISHED_ABORTED
        if group.is_finished():
            (self.running if group in self.running else self.swapped).remove(group)

    @invariant()
    def manager_is_consistent(self):
        check_invariants(self.manager)

    @invariant()
    def reducer_equals_manager(self):
        check_reducer_matches(self.reducer, self.manager)

    def teardown(self):
        if not hasattr(self, "manager"):
            return
        for group in self.running + self.swapped:
            for seq in group.get_unfinished_seqs():
                self.manager.free(seq)
        check_invariants(self.manager)
        assert self.manager.get_num_free_gpu_blocks() == self.manager.num_total_gpu_blocks
        assert self.manager.get_num_free_cpu_blocks() == self.manager.num_total_cpu_blocks
        assert self.manager.block_tables == {}
        at_rest = (FREE, CACHED) if self.manager.enable_caching else (FREE,)  # v0 caches in both pools
        assert all(b.state in at_rest for b in self.reducer.pools["gpu"])
        assert all(b.state in at_rest for b in self.reducer.pools["cpu"])


BlockManagerMachine.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
TestBlockManagerStateful = BlockManagerMachine.TestCase
