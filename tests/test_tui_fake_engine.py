"""A small deterministic engine over the REAL BlockSpaceManager, for fast TUI tests without torch.

`FakeEngine` has the LLMEngine surface an EngineSession uses (events, config, budget, check_request,
add_request, step, has_unfinished_requests, fork, preempt, abort_request, set_kv_digests_per_step,
emit_kv_digests). Its
memory planning is the real block manager's; only the "model" is fake: prompts are tokenized one
character per token and each sequence samples words from a fixed list. Scheduling follows vLLM v0:
swap in first, then prefill the waiting requests that fit, else decode the running ones (slots
appended before the forward pass, so the newest sampled token has no slot until the next step),
preempting the newest request by swap (or recompute) when a decode step runs out of blocks.

The tests at the bottom check the fake against the reducer, so every other TUI test can trust it.
"""

from __future__ import annotations

import zlib
from types import SimpleNamespace

from engine.block_manager import AllocStatus, BlockSpaceManager
from engine.kv_sizing import BlockBudget
from engine.config import EngineConfig
from engine.events import (
    EventBus,
    KVDigest,
    Preempted,
    RequestAdded,
    SequenceFinished,
    StepFinished,
    StepStarted,
    TokenGenerated,
)
from blockviz.model.reducer import ReducerState
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus
from blockviz.session.engine_session import trace_header

WORDS = (" the", " king", " shall", " be", ",", " my", " lord", "\n", " and", " thou", " art", ".")
WORD_BASE = 1000


def text_of(token_id: int) -> str:
    return WORDS[token_id - WORD_BASE] if token_id >= WORD_BASE else chr(token_id)


class FakeEngine:
    """Deterministic stand-in for engine.LLMEngine (see the module docstring)."""

    def __init__(self, block_size: int = 4, num_gpu_blocks: int = 16, num_cpu_blocks: int = 8,
                 enable_prefix_caching: bool = False, preemption_mode: str = "swap") -> None:
        self.events = EventBus()
        self.block_size = block_size
        self.preemption_mode = preemption_mode
        self.enable_prefix_caching = enable_prefix_caching
        self.block_manager = BlockSpaceManager(block_size, num_gpu_blocks, num_cpu_blocks, watermark=0.0,
                                               enable_caching=enable_prefix_caching, events=self.events)
        self.groups: dict[str, SequenceGroup] = {}
        self.waiting: list[SequenceGroup] = []
        self.running: list[SequenceGroup] = []
        self.swapped: list[SequenceGroup] = []
        self._next_seq_id = 0
        self._next_request = 0
        self._step = 0
        # what blockviz.session.engine_session.trace_header reads of an LLMEngine
        self.config = EngineConfig(model="fake", block_size=block_size, num_gpu_blocks=num_gpu_blocks,
                                   num_cpu_blocks=num_cpu_blocks, enable_prefix_caching=enable_prefix_caching,
                                   preemption_mode=preemption_mode, device="cpu")
        # a pretend model of 1 layer, 1 K/V head of 4 dims: 2 x 4 x 4-byte floats per slot
        geometry = SimpleNamespace(model_type="fake", num_layers=1, num_heads=1, num_kv_heads=1, head_dim=4)
        self.loaded = SimpleNamespace(dtype="float32", config=geometry)
        self.budget = BlockBudget(num_gpu_blocks, num_cpu_blocks, block_bytes=2 * 4 * 4 * block_size, source="explicit")
        self.device = "cpu"
        self.max_model_len = 1024

    # ------------------------------------------------------------------ requests

    def check_request(self, prompt: str, params: SamplingParams | None = None):
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        return [ord(ch) for ch in prompt], prompt, params or SamplingParams()

    def add_request(self, prompt: str, params: SamplingParams | None = None) -> str:
        params = params or SamplingParams()
        request_id = str(self._next_request)
        self._next_request += 1
        token_ids = [ord(ch) for ch in prompt]
        seqs = []
        for _ in range(params.n):
            seqs.append(Sequence(self._next_seq_id, token_ids, self.block_size))
            self._next_seq_id += 1
        group = SequenceGroup(request_id, seqs, params, prompt=prompt)
        self.groups[request_id] = group
        self.waiting.append(group)
        if self.events.active:
            self.events.emit(RequestAdded, request_id=request_id, seq_ids=group.seq_ids, prompt=prompt,
                             prompt_token_ids=tuple(token_ids), prompt_tokens_text=tuple(prompt),
                             n=params.n, max_tokens=params.max_tokens)
        return request_id

    def has_unfinished_requests(self) -> bool:
        return bool(self.waiting or self.running or self.swapped)

    def fork(self, seq_id: int) -> int:
        for group in self.running:
            for seq in group.get_seqs(SequenceStatus.RUNNING):
                if seq.seq_id == seq_id:
                    child = seq.fork(self._next_seq_id)
                    self._next_seq_id += 1
                    self.block_manager.fork(seq, child)
                    group.add(child)
                    return child.seq_id
        raise ValueError(f"sequence {seq_id} is not running")

    def preempt(self, request_id: str) -> None:
        group = self.groups.get(request_id)
        if group is None or group not in self.running:
            raise ValueError(f"request {request_id} is not running")
        self._preempt(group, "swap", "user request")

    def abort_request(self, request_id: str) -> None:
        group = self.groups[request_id]
        for queue in (self.waiting, self.running, self.swapped):
            if group in queue:
                queue.remove(group)
        for seq in group.get_unfinished_seqs():
            self._finish(group, seq, SequenceStatus.FINISHED_ABORTED)

    def set_kv_digests_per_step(self, per_step: bool) -> None:
        """The fake digests the blocks each step wrote during that step, whatever is asked."""

    def emit_kv_digests(self) -> None:
        """Nothing held back (see set_kv_digests_per_step)."""

    # ------------------------------------------------------------------ stepping

    def step(self) -> None:
        self._step += 1
        bm = self.block_manager
        while self.swapped and bm.can_swap_in(self.swapped[0]) == AllocStatus.NEVER:
            group = self.swapped.pop(0)
            for seq in group.get_unfinished_seqs():
                self._finish(group, seq, SequenceStatus.FINISHED_IGNORED)
        while self.swapped and bm.can_swap_in(self.swapped[0]) == AllocStatus.OK:
            group = self.swapped.pop(0)
            bm.swap_in(group)
            for seq in group.get_seqs(SequenceStatus.SWAPPED):
                seq.status = SequenceStatus.RUNNING
            self.running.append(group)
        prefill = []
        while self.waiting and not self.swapped and bm.can_allocate(self.waiting[0]) == AllocStatus.OK:
            group = self.waiting.pop(0)
            bm.allocate(group)
            for seq in group.get_seqs(SequenceStatus.WAITING):
                seq.status = SequenceStatus.RUNNING
            prefill.append(group)
        if prefill:
            self._run("prefill", prefill)
            self.running.extend(prefill)
            return
        for group in list(self.running):
            while not bm.can_append_slots(group):
                victim = self.running[-1]
                mode = self.preemption_mode if bm.can_swap_out(victim) else "recompute"
                self._preempt(victim, mode, "out of free GPU blocks")
                if victim is group:
                    break
        scheduled = [g for g in self.running]
        if scheduled:
            self._run("decode", scheduled)

    def _run(self, kind: str, groups: list[SequenceGroup]) -> None:
        bm, emit = self.block_manager, self.events.emit
        seqs = [(g, s) for g in groups for s in g.get_seqs(SequenceStatus.RUNNING)]
        num_tokens = sum(s.get_len() if kind == "prefill" else 1 for _, s in seqs)
        emit(StepStarted, step=self._step, kind=kind, seq_ids=tuple(s.seq_id for _, s in seqs),
             num_tokens=num_tokens)
        for group, seq in seqs:
            if kind == "decode":
                for src, dst in bm.append_slots(seq):
                    emit(KVDigest, device="gpu", block=dst, digest=self._digest_of(bm, seq, dst))
            table = bm.block_tables[seq.seq_id]
            last = table[-1]
            emit(KVDigest, device="gpu", block=last.block_number, digest=_digest(last.token_ids))
            bm.mark_blocks_as_computed(seq)
        for group, seq in seqs:
            token_id = WORD_BASE + (seq.seq_id * 5 + seq.get_output_len() * 3) % len(WORDS)
            seq.append_token_id(token_id)
            emit(TokenGenerated, seq_id=seq.seq_id, token_id=token_id, text=text_of(token_id),
                 position=seq.get_len() - 1)
            if seq.get_output_len() >= group.sampling_params.max_tokens:
                self._finish(group, seq, SequenceStatus.FINISHED_LENGTH_CAPPED)
        for group in groups:
            if group.is_finished() and group in self.running:
                self.running.remove(group)
        emit(StepFinished, step=self._step, kind=kind, num_tokens=num_tokens, duration_s=0.01)

    @staticmethod
    def _digest_of(bm, seq, block_number) -> str:
        for block in bm.block_tables[seq.seq_id]:
            if block.block_number == block_number:
                return _digest(block.token_ids[:-1])
        return "?"

    def _finish(self, group: SequenceGroup, seq: Sequence, status: SequenceStatus) -> None:
        seq.status = status
        if seq.seq_id in self.block_manager.block_tables:
            self.block_manager.free(seq)
        self.events.emit(SequenceFinished, seq_id=seq.seq_id, request_id=group.request_id,
                         reason=status.finish_reason, detail="")

    def _preempt(self, group: SequenceGroup, mode: str, reason: str) -> None:
        bm = self.block_manager
        self.running.remove(group)
        seqs = group.get_seqs(SequenceStatus.RUNNING)
        lost = sum(s.get_len() for s in seqs) if mode == "recompute" else 0
        self.events.emit(Preempted, request_id=group.request_id, seq_ids=tuple(s.seq_id for s in seqs),
                         mode=mode, reason=reason, num_tokens_lost=lost)
        if mode == "swap":
            bm.swap_out(group)
            for seq in seqs:
                seq.status = SequenceStatus.SWAPPED
            self.swapped.append(group)
        else:
            for seq in seqs:
                bm.free(seq)
                seq.reset_for_recompute()
            self.waiting.insert(0, group)


def _digest(token_ids) -> str:
    return f"{zlib.crc32(repr(tuple(token_ids)).encode()):08x}"


def run_scenario(engine: FakeEngine, prompts, n: int = 1, max_tokens: int = 6, max_steps: int = 100) -> list:
    """Run prompts to completion; returns every event."""
    events: list = []
    engine.events.subscribe(events.append)
    for prompt in prompts:
        engine.add_request(prompt, SamplingParams(n=n, max_tokens=max_tokens))
    for _ in range(max_steps):
        if not engine.has_unfinished_requests():
            break
        engine.step()
    return events


# ---------------------------------------------------------------------------- the fake's own tests


def _check_against_reducer(engine: FakeEngine, events: list) -> None:
    header = trace_header(engine)
    state = ReducerState(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"])
    state.apply_all(events)
    bm = engine.block_manager
    assert {s: state.table_blocks(s) for s in state.tables} == {
        s: [b.block_number for b in t] for s, t in bm.block_tables.items()}
    assert state.num_free("gpu") == bm.get_num_free_gpu_blocks()


def test_fake_engine_runs_to_completion_and_matches_the_reducer():
    engine = FakeEngine()
    events = run_scenario(engine, ["ROMEO:", "JULIET: hi"], n=2)
    assert not engine.has_unfinished_requests()
    kinds = {e.type for e in events}
    assert {"block_allocated", "copy_on_write", "token_generated", "block_freed", "step_finished"} <= kinds
    _check_against_reducer(engine, events)


def test_fake_engine_swaps_when_the_pool_is_small():
    engine = FakeEngine(block_size=2, num_gpu_blocks=6, num_cpu_blocks=8)
    events = run_scenario(engine, ["abc", "def"], max_tokens=6)
    kinds = [e.type for e in events]
    assert "swap_out" in kinds and "swap_in" in kinds
    _check_against_reducer(engine, events)
