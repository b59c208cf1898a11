"""engine/v1's KVCacheManager with several KV-cache groups against vLLM 0.33's own
`vllm.v1.core.KVCacheManager` (its HybridKVCacheCoordinator, FullAttentionManager and
SlidingWindowManager), driven with the same seeded random operation sequences (issue 41, item 2).

Both managers are built over the same pool from the same groups (on vLLM's side a hand-made
`KVCacheConfig`; on ours `KVCacheGroupSpec`s): one full-attention group and one sliding-window
group, or a sliding-window group alone (the unitary coordinator over a window), or a full group
with two window groups (equal windows: vLLM looks them up as one spec group; unequal: its
fixed-point loop runs more than one round). Block sizes run 1..16, windows from 1 token to more
than three blocks. The operations are those of tests/test_v1_vs_vllm.py: admit
(get_computed_blocks, then allocate_slots for the tokens not hit or a first chunk of them, with or
without vLLM's whole-sequence admission gate), decode (one more token, or the rest of a chunked
prefill, so requests grow past their windows and let blocks go), free; prompts share openings so
hits happen, and pools are small so allocate_slots returns None.

After every operation the two must agree on: the return (None, or each group's new block ids), the
hit tokens and each group's hit block ids (the null block, id 0, included), each request's table
in every group (null blocks included), the free queue from head to tail, the blocks evicted, every
block's ref count, and which blocks hold a hash, paired one to one with vLLM's (block hash, group
id) keys; and our manager keeps its invariants (engine/v1/invariants.py).
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (CI installs it: see .ci/run)")
from tests.test_v1_vs_vllm import BlockvizSide, VllmSide, torch  # noqa: E402 (skips with that module)
from tests.test_v1_vs_vllm import Differential as OneGroupDifferential  # noqa: E402
from tests.test_v1_vs_vllm import random_operations  # noqa: E402

from vllm.v1.kv_cache_interface import FullAttentionSpec as VllmFull  # noqa: E402
from vllm.v1.kv_cache_interface import KVCacheGroupSpec as VllmGroup  # noqa: E402
from vllm.v1.kv_cache_interface import SlidingWindowSpec as VllmWindow  # noqa: E402

from engine.sequence import Sequence  # noqa: E402
from engine.v1.invariants import check_kv_cache_invariants  # noqa: E402
from engine.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec  # noqa: E402

MAX_MODEL_LEN = 4096
NUM_OPS = 40
LAYOUTS = ("full+window", "window", "full+window+window", "full+window+other window")


def layout_windows(layout: str, window: int, other: int) -> list[int | None]:
    """Each group's window (None: full attention)."""
    return {"full+window": [None, window], "window": [window], "full+window+window": [None, window, window],
            "full+window+other window": [None, window, other]}[layout]


def vllm_side(block_size: int, num_blocks: int, windows: list[int | None], enable_caching: bool,
              max_model_len: int, max_in_flight_tokens: int) -> VllmSide:
    """vLLM's KVCacheManager on the CPU over hand-made groups, one layer each."""
    shape = dict(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    groups = [VllmGroup([f"layer.{i}"], VllmFull(**shape) if w is None else VllmWindow(**shape, sliding_window=w))
              for i, w in enumerate(windows)]
    return VllmSide(block_size, num_blocks, enable_caching, max_model_len, groups, max_in_flight_tokens)


def our_side(block_size: int, num_blocks: int, windows: list[int | None], enable_caching: bool,
             max_model_len: int, max_in_flight_tokens: int) -> BlockvizSide:
    groups = [KVCacheGroupSpec([f"layer.{i}"], FullAttentionSpec(block_size) if w is None
                               else SlidingWindowSpec(block_size, sliding_window=w)) for i, w in enumerate(windows)]
    return BlockvizSide(block_size, num_blocks, "sha256", enable_caching, max_model_len, kv_cache_groups=groups,
                        max_in_flight_tokens=max_in_flight_tokens)


def per_group(blocks, num_groups: int) -> list[list[int]]:
    """Our blocks as handed out (one group's list, or a list per group) as block ids per group."""
    groups = [blocks] if num_groups == 1 else blocks
    return [[b.block_id for b in group] for group in groups]


class Differential(OneGroupDifferential):
    """Both managers over the same groups; decode and free as with one group, the results,
    hits and state compared per group."""

    def __init__(self, block_size: int, num_blocks: int, windows: list[int | None], enable_caching: bool = True,
                 max_model_len: int = MAX_MODEL_LEN, max_in_flight_tokens: int = MAX_MODEL_LEN) -> None:
        self.block_size = block_size
        self.num_groups = len(windows)
        self.max_model_len = max_model_len
        args = (block_size, num_blocks, windows, enable_caching, max_model_len, max_in_flight_tokens)
        self.ours, self.theirs = our_side(*args), vllm_side(*args)
        self.seqs, self.reqs = {}, {}
        self.pairs, self.reverse = {}, {}  # (our hash, its group) <-> vLLM's hash-with-group key
        self.log = []
        self.num_nulls: dict[int, int] = {}  # rid -> null blocks in its tables at the last check
        self.counts = {"hits": 0, "null hits": 0, "evicted": 0, "none": 0, "slid": 0}
        self.gate = random.Random(num_blocks)

    def our_tables(self, seq: Sequence) -> list[list[int]]:
        return list(self.ours.manager.get_block_ids_per_group(seq))

    def their_tables(self, rid: int) -> list[list[int]]:
        return [[b.block_id for b in blocks] for blocks in self.theirs.manager.coordinator.get_blocks(str(rid))]

    def admit(self, rid: int, prompt: list[int], chunk: int | None) -> None:
        """get_computed_blocks and allocate_slots on both sides, with vLLM's whole-sequence
        admission gate one time in three."""
        full_sequence_must_fit = self.gate.random() < 0.3
        prompt = prompt[: self.max_model_len]
        seq, req = Sequence(rid, list(prompt), self.block_size), self.theirs.request(rid, prompt)
        blocks, hit = self.ours.manager.get_computed_blocks(seq)
        vblocks, vhit, _ = self.theirs.manager.get_computed_blocks(req)
        assert hit == vhit, self._where(f"admit {rid}: hits {hit} vs vLLM {vhit}")
        ours_hit = per_group(blocks, self.num_groups)
        theirs_hit = [list(ids) for ids in vblocks.get_block_ids()]
        if hit:  # vLLM hands back empty lists for no hit
            assert ours_hit == theirs_hit, self._where(f"admit {rid}: hit blocks {ours_hit} vs vLLM {theirs_hit}")
        self.counts["hits"] += hit > 0
        self.counts["null hits"] += any(0 in ids for ids in ours_hit)
        num_new = seq.get_len() - hit if chunk is None else min(chunk, seq.get_len() - hit)
        new = self.ours.manager.allocate_slots(seq, num_new, hit, blocks, full_sequence_must_fit=full_sequence_must_fit)
        vnew = self.theirs.manager.allocate_slots(req, num_new, vhit, vblocks, full_sequence_must_fit=full_sequence_must_fit)
        self._same_result(f"admit {rid} ({len(prompt)} tokens, {hit} hit, {num_new} new, gate {full_sequence_must_fit})",
                          new, vnew)
        if new is not None:
            seq.num_computed_tokens = req.num_computed_tokens = hit + num_new
            self.seqs[rid], self.reqs[rid] = seq, req
        else:  # a refused request holds nothing; vLLM's defaultdicts may hold empty tables for it
            assert not self.ours.manager.has_blocks(seq), self._where(f"refused {rid} holds blocks")
            self.theirs.manager.free(req)

    def _same_result(self, what: str, new, vnew) -> None:
        self.log.append(what)
        got = None if new is None else per_group(new, self.num_groups)
        want = None if vnew is None else [list(ids) for ids in vnew.get_block_ids()]
        assert got == want, self._where(f"{what}: new blocks {got} vs vLLM {want}")
        self.counts["none"] += new is None
        self.check()

    def check(self) -> None:
        """The state both managers must agree on after every operation."""
        for rid, seq in self.seqs.items():
            tables = self.our_tables(seq)
            assert tables == self.their_tables(rid), self._where(f"tables of {rid}: {tables} vs vLLM "
                                                                 f"{self.their_tables(rid)}")
            num_nulls = sum(ids.count(0) for ids in tables)
            self.counts["slid"] += num_nulls > self.num_nulls.get(rid, num_nulls)
            self.num_nulls[rid] = num_nulls
        assert self.ours.free_queue() == self.theirs.free_queue(), self._where(
            f"free queue {self.ours.free_queue()} vs vLLM {self.theirs.free_queue()}")
        ours_refs = [b.ref_cnt for b in self.ours.pool.blocks[1:]]
        assert ours_refs == [b.ref_cnt for b in self.theirs.pool.blocks[1:]], self._where("ref counts")
        assert self.ours.evicted == self.theirs.evicted, self._where(
            f"evicted {self.ours.evicted} vs vLLM {self.theirs.evicted}")
        self.counts["evicted"] += len(self.ours.evicted)
        self.ours.evicted.clear()
        self.theirs.evicted.clear()
        groups = self.ours.pool.cached_block_group_ids
        ours = {b.block_id: (b.block_hash, groups[b.block_id]) for b in self.ours.pool.blocks if b.block_hash is not None}
        theirs = {b.block_id: b.block_hash for b in self.theirs.pool.blocks if b.block_hash is not None}
        assert sorted(ours) == sorted(theirs), self._where(f"blocks with a hash {sorted(ours)} vs vLLM {sorted(theirs)}")
        for block_id, our_key in ours.items():
            their_key = theirs[block_id]
            assert self.pairs.setdefault(our_key, their_key) == their_key, self._where(f"hash of {block_id}")
            assert self.reverse.setdefault(their_key, our_key) == our_key, self._where(f"hash of {block_id}")
        check_kv_cache_invariants(self.ours.manager)


def run_sequence(seed: int, layout: str, block_size: int | None = None, enable_caching: bool = True,
                 max_model_len: int = MAX_MODEL_LEN) -> Differential:
    """One random operation sequence (tests/test_v1_vs_vllm.random_operations): block size 1..16
    (or the one given), a window from 1 token to more than three blocks, a pool of a few blocks
    per group."""
    rng = random.Random(seed)
    bs = block_size or rng.choice([1, 2, 3, 4, 5, 8, 16])
    window = rng.choice([1, 2, bs - 1, bs, bs + 1, 2 * bs, 3 * bs + 1, rng.randint(1, 4 * bs)])
    window = max(window, 1)
    other = rng.randint(1, 4 * bs)
    windows = layout_windows(layout, window, other)
    num_blocks = rng.randint(3, 6 * len(windows) + 6)
    diff = Differential(bs, num_blocks, windows, enable_caching, max_model_len, rng.randint(1, 4 * bs))
    random_operations(rng, diff, bs, NUM_OPS)
    return diff


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("chunk", range(3))
def test_random_sequences_match_vllm(layout, chunk):
    """Seeded sequences per layout, in chunks: both managers agree after every operation."""
    for seed in range(chunk, 90, 3):
        run_sequence(seed, layout)


@pytest.mark.parametrize("block_size", range(1, 17))
def test_every_block_size_from_1_to_16(block_size):
    """A full and a window group at each block size, windows below, at and above the block."""
    for seed in range(8):
        run_sequence(1000 + seed, "full+window", block_size=block_size)


def test_random_sequences_match_vllm_without_prefix_caching():
    """enable_caching=False on both sides: no hits, no hashes; windows still let blocks go."""
    for seed in range(40):
        diff = run_sequence(seed, LAYOUTS[seed % len(LAYOUTS)], enable_caching=False)
        assert diff.counts["hits"] == 0 and not diff.pairs


def test_random_sequences_match_vllm_with_a_short_max_model_len():
    """Requests finish (are freed) when they reach a max_model_len of a few blocks."""
    for seed in range(40):
        run_sequence(seed, LAYOUTS[seed % len(LAYOUTS)], max_model_len=5 + seed % 19)


def test_the_sequences_reach_hits_null_hits_sliding_eviction_and_a_full_pool():
    """The random sequences are not trivial: across them requests hit the prefix cache, hits
    hold the null block where the window does not need the prefix, blocks leave a window mid
    request, cached blocks are evicted, and allocate_slots returns None."""
    totals = dict.fromkeys(("hits", "null hits", "evicted", "none", "slid"), 0)
    for seed in range(40):
        for key, count in run_sequence(seed, "full+window").counts.items():
            totals[key] += count
    assert all(count > 0 for count in totals.values()), totals
