"""Parity of the paged GPT-2 with transformers' GPT2LMHeadModel (minGPT-style: token for token).

Block tables are built by hand from shuffled physical blocks, so a sequence's blocks are
non-contiguous and out of order; block sizes 1, 3 and 16 cover one-token blocks, blocks that
split prompts mid-way, and prompts shorter than one block.
"""

from __future__ import annotations

import random

import pytest
import torch
from transformers import GPT2LMHeadModel

from engine.attention import AttentionMetadata
from engine.cache_engine import CacheEngine
from engine.model_loader import load_model
from engine.models.gpt2 import GPT2, GPT2Config

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
ATOL = 1e-4
BLOCK_SIZES = [1, 3, 16]
NUM_BLOCKS = 256


@pytest.fixture(scope="module")
def models(tiny_gpt2_dir):
    """(our model, the transformers reference) on DEVICE in float32."""
    loaded = load_model(tiny_gpt2_dir, device=DEVICE, dtype=torch.float32)
    hf = GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir, dtype=torch.float32).to(DEVICE).eval()
    hf.generation_config.eos_token_id = None  # never stop early: we compare fixed-length runs
    hf.generation_config.pad_token_id = loaded.tokenizer.eos_token_id
    return loaded.model, hf


class Pool:
    """Hands out physical blocks in a shuffled order and grows block tables on demand."""

    def __init__(self, block_size: int, seed: int = 0):
        self.block_size = block_size
        self.free = list(range(NUM_BLOCKS))
        random.Random(seed).shuffle(self.free)
        self.cache = CacheEngine(2, 4, 16, block_size, NUM_BLOCKS, 0, DEVICE, torch.float32)

    def grow(self, table: list[int], num_tokens: int) -> list[int]:
        while len(table) * self.block_size < num_tokens:
            table.append(self.free.pop())
        return table


def random_prompts(lengths, vocab_size, seed=0) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(vocab_size) for _ in range(n)] for n in lengths]


def step(model, pool, token_lists, tables, query_lens, context_lens):
    """Run one engine step; returns all-token logits (num_tokens, vocab) and the metadata."""
    meta = AttentionMetadata.build(tables, query_lens, context_lens, pool.block_size, device=DEVICE)
    input_ids = torch.tensor([t for tokens in token_lists for t in tokens], device=DEVICE)
    hidden = model(input_ids, meta.positions, pool.cache.gpu_cache, meta)
    return model.compute_logits(hidden), meta


def hf_logits(hf, tokens) -> torch.Tensor:
    with torch.inference_mode():
        return hf(torch.tensor([tokens], device=DEVICE)).logits[0].float()  # (len, vocab)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_prefill_batch_matches_transformers(models, block_size):
    model, hf = models
    pool = Pool(block_size)
    prompts = random_prompts([5, 17, 1, 33, 16], model.config.vocab_size)
    tables = [pool.grow([], len(p)) for p in prompts]
    lens = [len(p) for p in prompts]
    logits, meta = step(model, pool, prompts, tables, lens, lens)
    assert logits.shape == (sum(lens), model.config.vocab_size)
    starts = meta.query_start_loc.tolist()
    for i, prompt in enumerate(prompts):
        ref = hf_logits(hf, prompt)
        torch.testing.assert_close(logits[starts[i]:starts[i + 1]], ref, atol=ATOL, rtol=0)
        torch.testing.assert_close(logits[meta.last_token_indices[i]], ref[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_greedy_decode_matches_generate(models, block_size):
    model, hf = models
    pool = Pool(block_size, seed=block_size)
    prompts = random_prompts([4, 11, 1, 20], model.config.vocab_size, seed=1)
    num_steps = 24
    seqs = [list(p) for p in prompts]
    tables = [pool.grow([], len(p)) for p in prompts]
    lens = [len(p) for p in prompts]
    logits, meta = step(model, pool, prompts, tables, lens, lens)
    step_logits = [logits[meta.last_token_indices]]
    for _ in range(num_steps - 1):
        next_tokens = step_logits[-1].argmax(-1).tolist()
        for seq, table, token in zip(seqs, tables, next_tokens):
            seq.append(token)
            pool.grow(table, len(seq))
        logits, meta = step(model, pool, [[t] for t in next_tokens], tables, [1] * len(seqs), [len(s) for s in seqs])
        assert meta.decode_only and not meta.is_prefill
        step_logits.append(logits)
    for seq, token in zip(seqs, step_logits[-1].argmax(-1).tolist()):
        seq.append(token)

    for i, prompt in enumerate(prompts):
        ref = hf.generate(
            torch.tensor([prompt], device=DEVICE), attention_mask=torch.ones(1, len(prompt), dtype=torch.long, device=DEVICE),
            max_new_tokens=num_steps, do_sample=False,
        )[0].tolist()
        assert seqs[i] == ref, f"sequence {i} diverged from transformers' greedy generate"
        # each step's logits equal the full-sequence forward at that position
        full = hf_logits(hf, seqs[i][:-1])[len(prompt) - 1:]  # (num_steps, vocab)
        ours = torch.stack([logits[i] for logits in step_logits])
        torch.testing.assert_close(ours, full, atol=ATOL, rtol=0)


def test_greedy_output_is_not_one_repeated_token(models):
    """The fixture's weights must make output depend on context, or parity proves little."""
    model, hf = models
    prompt = random_prompts([6], model.config.vocab_size, seed=3)[0]
    out = hf.generate(torch.tensor([prompt], device=DEVICE), max_new_tokens=30, do_sample=False)[0, 6:].tolist()
    assert len(set(out)) >= 5, out


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_prefix_cached_suffix_matches_transformers(models, block_size):
    """A second sequence whose first blocks are the first one's computes only its suffix."""
    model, hf = models
    pool = Pool(block_size, seed=7)
    first = random_prompts([40], model.config.vocab_size, seed=4)[0]
    first_table = pool.grow([], len(first))
    step(model, pool, [first], [first_table], [len(first)], [len(first)])

    num_shared_blocks = 2 if block_size > 1 else 29
    num_cached = num_shared_blocks * block_size
    suffix = random_prompts([9], model.config.vocab_size, seed=5)[0]
    second = first[:num_cached] + suffix
    second_table = pool.grow(first_table[:num_shared_blocks], len(second))
    logits, meta = step(model, pool, [suffix], [second_table], [len(suffix)], [len(second)])
    assert meta.positions.tolist() == list(range(num_cached, len(second)))
    torch.testing.assert_close(logits, hf_logits(hf, second)[num_cached:], atol=ATOL, rtol=0)


@pytest.mark.parametrize("block_size", BLOCK_SIZES)
def test_mixed_step_prefill_suffix_and_decodes(models, block_size):
    """One step holding a fresh prefill, a prefix-cached suffix, a one-token prefill and a decode."""
    model, hf = models
    pool = Pool(block_size, seed=11)
    a, b = random_prompts([19, 35], model.config.vocab_size, seed=6)
    table_a, table_b = pool.grow([], len(a)), pool.grow([], len(b))
    logits, meta = step(model, pool, [a, b], [table_a, table_b], [len(a), len(b)], [len(a), len(b)])
    a.append(int(logits[meta.last_token_indices[0]].argmax()))
    pool.grow(table_a, len(a))

    c = random_prompts([13], model.config.vocab_size, seed=8)[0]  # fresh prefill
    shared = (len(b) // block_size) * block_size - block_size  # full blocks of b, at least one left uncached
    d = b[:shared] + c[:5]  # prefix-cached suffix of 5 tokens
    e = c[:1]  # a one-token prompt rides the batched decode path
    table_c, table_d, table_e = pool.grow([], len(c)), pool.grow(table_b[: shared // block_size], len(d)), pool.grow([], 1)
    logits, meta = step(
        model, pool, [c, a[-1:], d[shared:], e], [table_c, table_a, table_d, table_e],
        [len(c), 1, len(d) - shared, 1], [len(c), len(a), len(d), 1],
    )
    assert meta.num_prefills == 2 and meta.num_decodes == 2
    starts = meta.query_start_loc.tolist()
    torch.testing.assert_close(logits[starts[0]:starts[1]], hf_logits(hf, c), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[starts[1]], hf_logits(hf, a)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[starts[2]:starts[3]], hf_logits(hf, d)[shared:], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[starts[3]], hf_logits(hf, e)[0], atol=ATOL, rtol=0)


def test_cacheless_profile_run_matches_cached_prefill(models):
    model, hf = models
    prompts = random_prompts([7, 12], model.config.vocab_size, seed=9)
    lens = [len(p) for p in prompts]
    meta = AttentionMetadata.build([[0], [0]], lens, lens, block_size=16, device=DEVICE)
    input_ids = torch.tensor(prompts[0] + prompts[1], device=DEVICE)
    logits = model.compute_logits(model(input_ids, meta.positions, None, meta))
    torch.testing.assert_close(logits[:7], hf_logits(hf, prompts[0]), atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[7:], hf_logits(hf, prompts[1]), atol=ATOL, rtol=0)


def test_config_variants_follow_the_checkpoint(tiny_gpt2_factory):
    """Non-default MLP width, layer-norm eps, activation and per-layer attention scaling."""
    path = tiny_gpt2_factory(n_inner=96, layer_norm_epsilon=1e-3, activation_function="gelu",
                             scale_attn_by_inverse_layer_idx=True, n_layer=3)
    model = load_model(path, device=DEVICE, dtype=torch.float32).model
    hf = GPT2LMHeadModel.from_pretrained(path, dtype=torch.float32).to(DEVICE).eval()
    pool = Pool(3)
    pool.cache = CacheEngine(3, 4, 16, 3, NUM_BLOCKS, 0, DEVICE, torch.float32)
    prompt = random_prompts([21], model.config.vocab_size, seed=10)[0]
    logits, _ = step(model, pool, [prompt], [pool.grow([], 21)], [21], [21])
    torch.testing.assert_close(logits, hf_logits(hf, prompt), atol=ATOL, rtol=0)


def test_load_hf_state_dict_transposes_conv1d(tiny_gpt2_dir):
    hf = GPT2LMHeadModel.from_pretrained(tiny_gpt2_dir, dtype=torch.float32)
    model = GPT2.from_hf(hf)
    hf_w = hf.transformer.h[1].mlp.c_fc.weight  # Conv1D: (n_embd, n_inner)
    assert torch.equal(model.transformer.h[1].mlp.c_fc.weight, hf_w.t())
    assert model.lm_head is None  # tied to wte


def test_context_longer_than_n_positions_is_rejected(models):
    model, _ = models
    n = model.config.n_positions + 1
    meta = AttentionMetadata.build([list(range(n))], [1], [n], block_size=1)
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.zeros(1, dtype=torch.long), meta.positions, None, meta)


def test_non_gpt2_config_is_rejected():
    class FakeConfig:
        model_type = "llama"

    with pytest.raises(ValueError, match="llama"):
        GPT2Config.from_hf(FakeConfig())


def test_metadata_build_slot_mapping_and_offsets():
    meta = AttentionMetadata.build(
        block_tables=[[7, 2, 5], [4], [9, 1]], query_lens=[8, 1, 2], context_lens=[8, 3, 6], block_size=3
    )
    # seq 0 positions 0..7 over blocks 7, 2, 5; seq 1 position 2 in block 4; seq 2 positions 4, 5 in block 1
    assert meta.slot_mapping.tolist() == [21, 22, 23, 6, 7, 8, 15, 16] + [14] + [4, 5]
    assert meta.positions.tolist() == list(range(8)) + [2] + [4, 5]
    assert meta.query_start_loc.tolist() == [0, 8, 9, 11]
    assert meta.last_token_indices.tolist() == [7, 8, 10]
    assert meta.block_tables.tolist() == [[7, 2, 5], [4, 0, 0], [9, 1, 0]]
    assert meta.prefill_seq_ids == (0, 2) and meta.decode_token_ids.tolist() == [8]
    assert len(meta.decode_groups) == 1 and meta.decode_groups[0].key_mask.shape == (1, 1, 1, 3)
    assert (meta.num_seqs, meta.num_tokens, meta.is_prefill) == (3, 11, True)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(block_tables=[[0]], query_lens=[2], context_lens=[1]), "query_len"),
        (dict(block_tables=[[0]], query_lens=[1], context_lens=[5]), "cannot hold"),
        (dict(block_tables=[[0], [1]], query_lens=[1], context_lens=[1]), "differ"),
        (dict(block_tables=[], query_lens=[], context_lens=[]), "at least one"),
    ],
)
def test_metadata_build_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionMetadata.build(block_size=4, **kwargs)


def test_plain_block_major_caches_give_the_same_logits(models):
    """paged_attention does not depend on CacheEngine's head-major storage: contiguous
    (num_blocks, block_size, heads, head_dim) tensors work the same (only slower)."""
    model, hf = models
    pool = Pool(3, seed=12)
    plain = [(torch.zeros(NUM_BLOCKS, 3, 4, 16, device=DEVICE), torch.zeros(NUM_BLOCKS, 3, 4, 16, device=DEVICE))
             for _ in range(2)]
    prompts = random_prompts([10, 4], model.config.vocab_size, seed=13)
    tables = [pool.grow([], 11), pool.grow([], 5)]
    results = []
    for caches in (pool.cache.gpu_cache, plain):
        meta = AttentionMetadata.build(tables, [10, 4], [10, 4], 3, device=DEVICE)
        first = model(torch.tensor(prompts[0] + prompts[1], device=DEVICE), meta.positions, caches, meta)
        meta = AttentionMetadata.build(tables, [1, 1], [11, 5], 3, device=DEVICE)
        second = model(torch.tensor([7, 9], device=DEVICE), meta.positions, caches, meta)
        results.append(model.compute_logits(torch.cat([first, second])))
    assert not pool.cache.gpu_cache[0][0].is_contiguous() and plain[0][0].is_contiguous()
    torch.testing.assert_close(results[0], results[1], atol=ATOL, rtol=0)
    torch.testing.assert_close(results[1][-2], hf_logits(hf, prompts[0] + [7])[-1], atol=ATOL, rtol=0)
