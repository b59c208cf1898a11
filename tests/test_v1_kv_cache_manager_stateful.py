"""Hypothesis stateful test of vLLM v1's KVCacheManager (engine/v1/): random admissions (with
prefix-cache hits and chunked prefills), decodes, frees and failed allocations never break
check_kv_cache_invariants; a block's hash is set once and cleared only when it is evicted; the
reducer fed only the events equals the manager after every operation; everything ends free."""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from blockviz.model.reducer import ReducerState
from reducer_checks import check_reducer_matches_v1
from blockviz.model.trace_check import TraceChecker
from engine.events import BlockEvicted, EventBus
from engine.sequence import Sequence
from engine.v1 import KVCacheManager
from engine.v1.invariants import check_kv_cache_invariants
from engine.designs import V1

VOCAB = st.integers(min_value=0, max_value=2)  # a tiny vocabulary makes hits and equal hashes common


class KVCacheManagerMachine(RuleBasedStateMachine):
    @initialize(block_size=st.integers(1, 4), num_blocks=st.integers(2, 16), enable_caching=st.booleans(),
                hash_algo=st.sampled_from(["sha256", "xxhash"]))
    def setup(self, block_size, num_blocks, enable_caching, hash_algo):
        self.bus = EventBus()
        self.reducer = ReducerState(block_size, num_blocks, 0, "v1")
        self.checker = TraceChecker(block_size, num_blocks, 0, kv_manager=V1.name)
        self.events: list = []
        self.bus.subscribe(self.events.append)
        self.bus.subscribe(self.reducer.apply)
        self.bus.subscribe(self.checker.check)
        self.manager = KVCacheManager(block_size, num_blocks, enable_caching=enable_caching,
                                      hash_algo=hash_algo, events=self.bus)
        self.waiting: list[Sequence] = []
        self.running: list[Sequence] = []
        self.next_id = 0
        self.hashes = self._hashes()

    def _hashes(self):
        return [b.block_hash for b in self.manager.block_pool.blocks]

    @rule(tokens=st.lists(VOCAB, min_size=1, max_size=12))
    def add(self, tokens):
        self.next_id += 1
        self.waiting.append(Sequence(self.next_id, tokens, self.manager.block_size))

    @precondition(lambda self: self.waiting)
    @rule(data=st.data(), budget=st.integers(1, 12))
    def admit(self, data, budget):
        """A waiting request's hits and a first chunk of at most `budget` tokens; None leaves it
        waiting and nothing changed."""
        seq = data.draw(st.sampled_from(self.waiting))
        blocks, num_computed = self.manager.get_computed_blocks(seq)
        assert num_computed <= seq.get_len() - 1
        num_new = min(seq.get_len() - num_computed, budget)
        before = self._snapshot()
        if self.manager.allocate_slots(seq, num_new, num_computed, blocks) is None:
            assert self._snapshot() == before, "a refused allocate_slots changed something"
            return
        seq.num_computed_tokens = num_computed + num_new
        self.waiting.remove(seq)
        self.running.append(seq)

    @precondition(lambda self: self.running)
    @rule(data=st.data(), budget=st.integers(1, 12), token=VOCAB)
    def advance(self, data, budget, token):
        """The next chunk of a prefill, or a decode of one new token."""
        seq = data.draw(st.sampled_from(self.running))
        if seq.num_computed_tokens == seq.get_len():
            seq.append_token_id(token)
        num_new = min(seq.get_len() - seq.num_computed_tokens, budget)
        before = self._snapshot()
        if self.manager.allocate_slots(seq, num_new) is None:
            assert self._snapshot() == before, "a refused allocate_slots changed something"
            return
        seq.num_computed_tokens += num_new

    @precondition(lambda self: self.running)
    @rule(data=st.data())
    def free(self, data):
        """A request finishes, or is preempted (then it waits to be recomputed)."""
        seq = data.draw(st.sampled_from(self.running))
        self.manager.free(seq)
        self.running.remove(seq)
        if data.draw(st.booleans()):
            seq.reset_for_recompute()
            self.waiting.append(seq)

    def _snapshot(self):
        pool = self.manager.block_pool
        return ([b.block_id for b in pool.free_block_queue], [(b.ref_cnt, b.block_hash) for b in pool.blocks],
                {k: list(v) for k, v in self.manager.req_to_blocks.items()}, len(self.events))

    @invariant()
    def manager_is_consistent(self):
        check_kv_cache_invariants(self.manager)

    @invariant()
    def reducer_equals_manager(self):
        check_reducer_matches_v1(self.reducer, self.manager)

    @invariant()
    def hashes_are_cleared_only_by_eviction(self):
        now = self._hashes()
        evicted = {e.block for e in self.events if isinstance(e, BlockEvicted)}
        for e in self.events:  # what the run covered (pytest --hypothesis-show-statistics)
            if isinstance(e, BlockEvicted):
                event("a cached block evicted")
            elif e.type == "block_hashed" and not e.registered:
                event("two blocks with one hash")
            elif e.type == "prefix_cache_hit" and e.ref_count == 1:
                event("a hit on a free cached block")
        for block_id, (old, new) in enumerate(zip(self.hashes, now)):
            if old is not None and new != old:
                assert block_id in evicted, f"block {block_id} lost its hash without an eviction"
        self.events.clear()
        self.hashes = now

    def teardown(self):
        if not hasattr(self, "manager"):
            return
        for seq in list(self.running):
            self.manager.free(seq)
        check_kv_cache_invariants(self.manager)
        check_reducer_matches_v1(self.reducer, self.manager)
        pool = self.manager.block_pool
        assert pool.get_num_free_blocks() == pool.num_gpu_blocks - 1 and self.manager.req_to_blocks == {}


TestKVCacheManagerStateful = KVCacheManagerMachine.TestCase
TestKVCacheManagerStateful.settings = settings(max_examples=300, stateful_step_count=50, deadline=None)
