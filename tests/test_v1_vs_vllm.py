"""blockviz's v1 KVCacheManager (engine/v1/) against vLLM's own `vllm.v1.core.KVCacheManager`,
driven with the same seeded random operation sequences (issue 32, item 5).

Each sequence builds both managers over the same pool (one full-attention KV cache group:
a `KVCacheConfig` holding one `FullAttentionSpec` group on vLLM's side) and applies, in the
order the random generator picks, what vLLM's v1 scheduler does to a request:

- admit: `get_computed_blocks`, then `allocate_slots` for the tokens not hit (or, chunked
  prefill, for a first chunk of them);
- decode: append a sampled token, then `allocate_slots` for it (a decode that gets None keeps its
  uncomputed token and retries on its next turn);
- free: `free` (a finished or preempted request); a request that reaches max_model_len is freed
  there, as vLLM's scheduler finishes it (neither manager is meant for a request past it).

Prompts share prefixes drawn from a few stems over a small vocabulary, so hits, shared blocks,
lazy eviction of freed cached blocks and running out of blocks (`allocate_slots` returning None)
all happen. After every operation the two managers must agree on: the return (None or the ids of
the new blocks), the hit tokens, the block ids each request holds, the free queue from head to
tail, the block ids evicted from the prefix cache during the operation, every block's ref count, and
which blocks hold a hash.

What is mapped rather than compared:

- The hash algorithm: blockviz hashes with its own sha256 or xxhash chain over (parent, tokens,
  extra keys), taken in turn by seed, vLLM with its `sha256` over its pickled tuples, so the hash
  values differ. The test compares
  block ids and hit counts, and checks that the pairing of blockviz hash to vLLM hash, per block
  that both have hashed, is one to one over the whole sequence (equal prefixes, equal hashes on
  both sides).
- Requests: blockviz takes a `Sequence` (engine/sequence.py) keyed by an int seq_id, vLLM a
  `Request` keyed by a string id, with its block hashes on the request (`get_request_block_hasher`).
- Eviction: vLLM reports removed hashes (KV events), blockviz BlockEvicted events with block ids;
  the test records vLLM's evicted block ids by wrapping its pool's `_maybe_evict_cached_block`.
"""

from __future__ import annotations

import random

import pytest

pytest.importorskip("vllm", reason="vLLM 0.33 is not installed (CI installs it: see .ci/run)")
torch = pytest.importorskip("torch")
try:
    from vllm.sampling_params import SamplingParams as VllmSamplingParams
    from vllm.utils.hashing import sha256 as vllm_sha256
    from vllm.v1.core.kv_cache_manager import KVCacheManager as VllmKVCacheManager
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request
except ImportError as exc:  # an installed vLLM whose v1 core API moved
    pytest.skip(f"vLLM's v1 KV cache manager is not importable: {exc}", allow_module_level=True)

from engine.events import BlockEvicted, EventBus
from engine.sequence import Sequence
from engine.v1 import KVCacheManager
from engine.v1.kv_cache_utils import HASH_FUNCTIONS

MAX_MODEL_LEN = 4096
NUM_SEQUENCES = 300
NUM_OPS = 40
HASH_ALGOS = sorted(HASH_FUNCTIONS)


def ref_counts(blocks) -> list[int]:
    return [b.ref_cnt for b in blocks[1:]]  # block 0: the null block on both sides


def hashes(blocks) -> dict[int, object]:
    """block id -> its hash, for the blocks that hold one (in the prefix cache or evictable)."""
    return {b.block_id: b.block_hash for b in blocks if b.block_hash is not None}


class VllmSide:
    """vLLM's KVCacheManager on the CPU, one FullAttentionSpec group (as vLLM's
    tests/v1/core/test_prefix_caching.py builds it), or the KV-cache groups given."""

    def __init__(self, block_size: int, num_blocks: int, enable_caching: bool, max_model_len: int,
                 kv_cache_groups: list | None = None, max_in_flight_tokens: int | None = None) -> None:
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
        config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                               kv_cache_groups=kv_cache_groups or [KVCacheGroupSpec(["layer"], spec)])
        self.manager = VllmKVCacheManager(config, max_model_len=max_model_len, scheduler_block_size=block_size,
                                          hash_block_size=block_size, enable_caching=enable_caching,
                                          max_in_flight_tokens=max_in_flight_tokens)
        init_none_hash(vllm_sha256)
        self.hasher = get_request_block_hasher(block_size, vllm_sha256)
        self.pool = self.manager.block_pool
        self.evicted: list[int] = []
        evict = self.pool._maybe_evict_cached_block

        def record_eviction(block):
            block_id = block.block_id
            evicted = evict(block)
            if evicted:
                self.evicted.append(block_id)
            return evicted

        self.pool._maybe_evict_cached_block = record_eviction

    def request(self, rid: int, prompt: list[int]) -> Request:
        return Request(str(rid), list(prompt), VllmSamplingParams(max_tokens=MAX_MODEL_LEN), None,
                       block_hasher=self.hasher)

    def block_ids(self, rid: int) -> list[int] | None:
        blocks = self.manager.coordinator.single_type_managers[0].req_to_blocks.get(str(rid))
        return None if not blocks else [b.block_id for b in blocks]

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]


class BlockvizSide:
    def __init__(self, block_size: int, num_blocks: int, hash_algo: str, enable_caching: bool,
                 max_model_len: int, **groups) -> None:
        """groups: KVCacheManager's kv_cache_groups and max_in_flight_tokens, when given."""
        self.bus = EventBus()
        self.evicted: list[int] = []
        self.bus.subscribe(lambda e: self.evicted.append(e.block) if isinstance(e, BlockEvicted) else None)
        self.manager = KVCacheManager(block_size, num_blocks, max_model_len=max_model_len,
                                      enable_caching=enable_caching, hash_algo=hash_algo, events=self.bus, **groups)
        self.pool = self.manager.block_pool

    def block_ids(self, seq: Sequence) -> list[int] | None:
        return self.manager.get_block_ids(seq) if self.manager.has_blocks(seq) else None

    def free_queue(self) -> list[int]:
        return [b.block_id for b in self.pool.free_block_queue]


class Differential:
    """Both managers, the requests live on each side, and the hash pairing seen so far."""

    def __init__(self, block_size: int, num_blocks: int, hash_algo: str = "sha256",
                 enable_caching: bool = True, max_model_len: int = MAX_MODEL_LEN) -> None:
        self.block_size = block_size
        self.max_model_len = max_model_len
        self.ours = BlockvizSide(block_size, num_blocks, hash_algo, enable_caching, max_model_len)
        self.theirs = VllmSide(block_size, num_blocks, enable_caching, max_model_len)
        self.seqs: dict[int, Sequence] = {}
        self.reqs: dict[int, Request] = {}
        self.pairs: dict[object, object] = {}  # blockviz hash -> vLLM hash
        self.reverse: dict[object, object] = {}
        self.log: list[str] = []
        self.counts = {"hits": 0, "evicted": 0, "none": 0}  # how often each case came up

    def admit(self, rid: int, prompt: list[int], chunk: int | None = None) -> None:
        """Admit a waiting request; with `chunk`, prefill at most that many tokens now (chunked
        prefill: its next decode turn computes the rest before it samples)."""
        prompt = prompt[: self.max_model_len]  # vLLM rejects a longer prompt before the scheduler
        seq, req = Sequence(rid, list(prompt), self.block_size), self.theirs.request(rid, prompt)
        blocks, hit = self.ours.manager.get_computed_blocks(seq)
        vblocks, vhit, _ = self.theirs.manager.get_computed_blocks(req)
        assert hit == vhit, self._where(f"admit {rid}: hits {hit} vs vLLM {vhit}")
        self.counts["hits"] += hit > 0
        assert [b.block_id for b in blocks] == vblocks.get_block_ids()[0], self._where(f"admit {rid}: hit blocks")
        num_new = seq.get_len() - hit if chunk is None else min(chunk, seq.get_len() - hit)
        new = self.ours.manager.allocate_slots(seq, num_new, hit, blocks)
        vnew = self.theirs.manager.allocate_slots(req, num_new, vhit, vblocks)
        self._same_result(f"admit {rid} ({len(prompt)} tokens, {hit} hit, {num_new} new)", new, vnew)
        if new is not None:
            seq.num_computed_tokens = req.num_computed_tokens = hit + num_new
            self.seqs[rid], self.reqs[rid] = seq, req

    def decode(self, rid: int, token: int) -> None:
        seq, req = self.seqs[rid], self.reqs[rid]
        if seq.num_computed_tokens == seq.get_len() == self.max_model_len:
            return self.free(rid)  # it finished at max_model_len (vLLM check_stop)
        if seq.num_computed_tokens == seq.get_len():  # else: a retried decode or a prefill's rest
            seq.append_token_id(token)
            req.append_output_token_ids(token)
        num_new = seq.get_len() - seq.num_computed_tokens
        new = self.ours.manager.allocate_slots(seq, num_new)
        vnew = self.theirs.manager.allocate_slots(req, num_new)
        self._same_result(f"decode {rid} ({num_new} new)", new, vnew)
        if new is not None:
            seq.num_computed_tokens = req.num_computed_tokens = seq.get_len()

    def free(self, rid: int) -> None:
        self.ours.manager.free(self.seqs.pop(rid))
        self.theirs.manager.free(self.reqs.pop(rid))
        self.log.append(f"free {rid}")
        self.check()

    def _same_result(self, what: str, new, vnew) -> None:
        self.log.append(what)
        got = None if new is None else [b.block_id for b in new]
        want = None if vnew is None else vnew.get_block_ids()[0]
        assert got == want, self._where(f"{what}: new blocks {got} vs vLLM {want}")
        self.counts["none"] += new is None
        self.check()

    def check(self) -> None:
        """The state both managers must agree on after every operation."""
        for rid, seq in self.seqs.items():
            assert self.ours.block_ids(seq) == self.theirs.block_ids(rid), self._where(f"blocks of {rid}")
        assert self.ours.free_queue() == self.theirs.free_queue(), self._where("free queue")
        assert ref_counts(self.ours.pool.blocks) == ref_counts(self.theirs.pool.blocks), self._where("ref counts")
        assert self.ours.evicted == self.theirs.evicted, self._where("evicted")
        self.counts["evicted"] += len(self.ours.evicted)
        self.ours.evicted.clear()
        self.theirs.evicted.clear()
        ours, theirs = hashes(self.ours.pool.blocks), hashes(self.theirs.pool.blocks)
        assert sorted(ours) == sorted(theirs), self._where("blocks with a hash")
        for block_id, our_hash in ours.items():  # the hash algorithms differ: map them one to one
            their_hash = theirs[block_id]
            assert self.pairs.setdefault(our_hash, their_hash) == their_hash, self._where(f"hash of {block_id}")
            assert self.reverse.setdefault(their_hash, our_hash) == our_hash, self._where(f"hash of {block_id}")

    def _where(self, what: str) -> str:
        return f"{what}; after: {self.log[-8:]}"


def run_sequence(seed: int, enable_caching: bool = True, max_model_len: int = MAX_MODEL_LEN) -> Differential:
    """One random operation sequence: a pool of 4 to 12 blocks of 1 to 4 tokens, prompts from
    three stems over four token ids; blockviz's hash algorithm taken in turn (vLLM's stays
    sha256: the test pairs hashes, it never compares their values)."""
    rng = random.Random(seed)
    block_size = rng.randint(1, 4)
    hash_algo = HASH_ALGOS[seed % len(HASH_ALGOS)]
    diff = Differential(block_size, rng.randint(4, 12), hash_algo, enable_caching, max_model_len)
    random_operations(rng, diff, block_size, NUM_OPS)
    return diff


def random_operations(rng: random.Random, diff: Differential, block_size: int, num_ops: int) -> None:
    """Admit, decode and free in the order `rng` picks, prompts from three stems over four token
    ids, then free what is left; the free queues agree at the end."""
    stems = [[rng.randrange(4) for _ in range(rng.randint(1, 3 * block_size))] for _ in range(3)]
    next_id = 0
    for _ in range(num_ops):
        op = rng.random()
        if op < 0.4 or not diff.seqs:
            prompt = rng.choice(stems)[: rng.randint(1, 3 * block_size)]
            prompt += [rng.randrange(4) for _ in range(rng.randint(0, 2 * block_size))]
            chunk = rng.randint(1, 2 * block_size) if rng.random() < 0.3 else None
            diff.admit(next_id, prompt or [0], chunk)
            next_id += 1
        elif op < 0.8:
            diff.decode(rng.choice(sorted(diff.seqs)), rng.randrange(4))
        else:
            diff.free(rng.choice(sorted(diff.seqs)))
    for rid in sorted(diff.seqs):
        diff.free(rid)
    assert diff.ours.free_queue() == diff.theirs.free_queue()


@pytest.mark.parametrize("chunk", range(6))
def test_random_sequences_match_vllm(chunk):
    """NUM_SEQUENCES seeded sequences in six chunks: both managers agree after every operation."""
    for seed in range(chunk, NUM_SEQUENCES, 6):
        run_sequence(seed)


def test_random_sequences_match_vllm_without_prefix_caching():
    """enable_caching=False on both sides: no hits, no hashes, freed blocks go to the head."""
    for seed in range(40):
        diff = run_sequence(seed, enable_caching=False)
        assert diff.counts["hits"] == 0 and not diff.pairs


def test_random_sequences_match_vllm_with_a_short_max_model_len():
    """Requests finish (are freed) when they reach a max_model_len of a few blocks."""
    for seed in range(60):
        run_sequence(seed, max_model_len=5 + seed % 9)


def test_the_sequences_reach_hits_eviction_and_a_full_pool():
    """The random sequences are not trivial: across them, requests hit the prefix cache, cached
    blocks are evicted, and allocate_slots returns None."""
    totals = {"hits": 0, "evicted": 0, "none": 0}
    for seed in range(30):
        for key, count in run_sequence(seed).counts.items():
            totals[key] += count
    assert all(count > 0 for count in totals.values()), totals
