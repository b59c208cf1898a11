"""CacheEngine moves real block contents; pool sizing; model-name resolution errors."""

from __future__ import annotations

import logging
import time

import pytest
import torch
import xxhash

from engine.cache_engine import CacheEngine
from engine.kv_sizing import DEFAULT_CPU_KV_CACHE_BYTES, BlockBudget, determine_num_blocks
from engine.model_loader import DEFAULT_MODEL, ModelNotFoundError, check_model, load_model, resolve_model
from engine.models.gpt2 import GPT2Config

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NUM_LAYERS, NUM_HEADS, HEAD_DIM, BLOCK_SIZE = 3, 2, 4, 4


@pytest.fixture
def cache() -> CacheEngine:
    """A cache whose every block holds distinct random data in every layer, K and V."""
    engine = CacheEngine(NUM_LAYERS, NUM_HEADS, HEAD_DIM, BLOCK_SIZE, num_gpu_blocks=8, num_cpu_blocks=5,
                         device=DEVICE, dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    for pool in (engine.gpu_cache, engine.cpu_cache):
        for k, v in pool:
            k.copy_(torch.randn(k.shape, generator=gen))
            v.copy_(torch.randn(v.shape, generator=gen))
    return engine


def block(pool, index: int) -> torch.Tensor:
    """(num_layers, 2, block_size, heads, head_dim) contents of one block, on the CPU."""
    return torch.stack([torch.stack([k[index], v[index]]) for k, v in pool]).cpu()


def test_shapes_and_pools(cache):
    assert len(cache.gpu_cache) == len(cache.cpu_cache) == NUM_LAYERS
    k, v = cache.gpu_cache[0]
    assert k.shape == v.shape == (8, BLOCK_SIZE, NUM_HEADS, HEAD_DIM)
    assert k.device.type == torch.device(DEVICE).type
    assert cache.cpu_cache[0][0].shape == (5, BLOCK_SIZE, NUM_HEADS, HEAD_DIM)
    assert cache.cpu_cache[0][0].device.type == "cpu"
    assert cache.cpu_cache[0][0].is_pinned() == (DEVICE == "cuda")


def test_copy_moves_every_layer(cache):
    before = block(cache.gpu_cache, 6)
    assert cache.block_fingerprint("gpu", 1) != cache.block_fingerprint("gpu", 6)
    cache.copy([(1, 6), (2, 7)])
    assert torch.equal(block(cache.gpu_cache, 6), block(cache.gpu_cache, 1))
    assert torch.equal(block(cache.gpu_cache, 7), block(cache.gpu_cache, 2))
    assert not torch.equal(block(cache.gpu_cache, 6), before)
    assert cache.block_fingerprint("gpu", 6) == cache.block_fingerprint("gpu", 1)


def test_copy_reads_sources_before_writing(cache):
    b0, b1 = block(cache.gpu_cache, 0), block(cache.gpu_cache, 1)
    cache.copy([(0, 1), (1, 0)])  # a swap of two blocks
    assert torch.equal(block(cache.gpu_cache, 0), b1) and torch.equal(block(cache.gpu_cache, 1), b0)


def test_swap_out_then_in_round_trips(cache):
    gpu3 = block(cache.gpu_cache, 3)
    assert cache.block_fingerprint("gpu", 3) != cache.block_fingerprint("cpu", 4)
    cache.swap_out([(3, 4), (5, 0)])
    assert torch.equal(block(cache.cpu_cache, 4), gpu3)
    assert torch.equal(block(cache.cpu_cache, 0), block(cache.gpu_cache, 5))
    assert cache.block_fingerprint("cpu", 4) == cache.block_fingerprint("gpu", 3)

    cache.gpu_cache[0][0][3].zero_()  # the device block is reused by someone else
    cache.swap_in([(4, 2)])
    assert torch.equal(block(cache.gpu_cache, 2), gpu3)
    assert cache.block_fingerprint("gpu", 2) == cache.block_fingerprint("cpu", 4)


def test_fingerprint_is_short_stable_and_sensitive(cache):
    fp = cache.block_fingerprint("gpu", 0)
    assert len(fp) == 8 and int(fp, 16) >= 0
    assert cache.block_fingerprint("gpu", 0) == fp
    cache.gpu_cache[NUM_LAYERS - 1][1][0, 0, 0, 0] += 1.0  # one V element in the last layer
    assert cache.block_fingerprint("gpu", 0) != fp


def test_kv_digests_follow_first_layer_k_and_v_through_copies_and_swaps(cache):
    digests = cache.kv_digests("gpu", [1, 6, 3])
    assert len(digests) == 3 and all(len(d) == 8 and int(d, 16) >= 0 for d in digests)
    assert len(set(digests)) == 3
    cache.copy([(1, 6)])
    cache.swap_out([(3, 4)])
    assert cache.kv_digests("gpu", [6]) == [digests[0]]
    assert cache.kv_digests("cpu", [4]) == [digests[2]]
    assert cache.kv_digests("gpu", [1, 1]) == [digests[0]] * 2
    for kv in (0, 1):  # one element of the first layer's first head: in K, then in V
        before = cache.kv_digests("gpu", [6])
        cache.gpu_cache[0][kv][6, BLOCK_SIZE - 1, 0, HEAD_DIM - 1] += 1.0
        assert cache.kv_digests("gpu", [6]) != before
    assert cache.kv_digests("gpu", []) == []
    with pytest.raises(IndexError):
        cache.kv_digests("gpu", [8])
    with pytest.raises(ValueError):
        cache.kv_digests("disk", [0])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # numpy's path on the CPU; torch's
def test_kv_digest_is_xxh3_of_the_first_heads_k_then_v(dtype):
    cache = CacheEngine(NUM_LAYERS, NUM_HEADS, HEAD_DIM, BLOCK_SIZE, num_gpu_blocks=6, num_cpu_blocks=2,
                        device=DEVICE, dtype=dtype)
    k, v = cache.gpu_cache[0]  # (num_blocks, block_size, heads, head_dim)
    gen = torch.Generator().manual_seed(1)
    k.copy_(torch.randn(k.shape, generator=gen))
    v.copy_(torch.randn(v.shape, generator=gen))

    def expected(b: int) -> str:
        data = b"".join(t[b, :, 0].contiguous().cpu().view(torch.uint8).numpy().tobytes() for t in (k, v))
        return f"{xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF:08x}"

    assert cache.kv_digests("gpu", [4, 0, 2]) == [expected(4), expected(0), expected(2)]


def test_bad_block_numbers_and_pool_names_raise(cache):
    with pytest.raises(IndexError):
        cache.copy([(0, 8)])
    with pytest.raises(IndexError):
        cache.swap_in([(5, 0)])
    with pytest.raises(ValueError):
        cache.block_fingerprint("disk", 0)
    cache.copy([])  # nothing to do is fine


def test_model_writes_land_in_gpu_cache_views(cache):
    """gpu_cache pairs are views of the pool: writing through them is what swap/copy move."""
    k, _ = cache.gpu_cache[1]
    k[2].fill_(7.0)
    cache.swap_out([(2, 1)])
    assert torch.all(cache.cpu_cache[1][0][1] == 7.0)


def test_cache_block_size_formula():
    # seed 001: block_size * num_layers * 2 * num_kv_heads * head_dim * element size
    assert CacheEngine.get_cache_block_size(16, 12, 12, 64, torch.float32) == 16 * 12 * 2 * 12 * 64 * 4
    assert CacheEngine.get_cache_block_size(16, 12, 12, 64, torch.float16) == 16 * 12 * 2 * 12 * 64 * 2
    engine = CacheEngine(2, 4, 8, 3, 2, 0, "cpu", torch.float32)
    assert engine.block_bytes == 3 * 2 * 2 * 4 * 8 * 4
    assert engine.cpu_cache[0][0].shape[0] == 0


# --- KV-cache groups: a block holds one page per layer of its own group ---------------------------

HYBRID_SPECS = ("w", "f", "w", "w", "f", "w")  # 2 full : 4 sliding -> (f1, f4), (w0, w3), (w2, w5)


def hybrid_groups(block_size: int = BLOCK_SIZE):
    from engine.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec, get_kv_cache_groups

    shape = dict(num_kv_heads=NUM_HEADS, head_size=HEAD_DIM, dtype=torch.float32)
    return get_kv_cache_groups([FullAttentionSpec(block_size, **shape) if kind == "f" else
                                SlidingWindowSpec(block_size, **shape, sliding_window=3) for kind in HYBRID_SPECS])


@pytest.fixture
def hybrid_cache() -> CacheEngine:
    """Six layers in three groups of two: a block holds two pages, random in every block."""
    engine = CacheEngine(len(HYBRID_SPECS), NUM_HEADS, HEAD_DIM, BLOCK_SIZE, num_gpu_blocks=8, num_cpu_blocks=5,
                         device=DEVICE, dtype=torch.float32, kv_cache_groups=hybrid_groups())
    gen = torch.Generator().manual_seed(2)
    for pool in (engine._gpu_kv, engine._cpu_kv):
        pool.copy_(torch.randn(pool.shape, generator=gen))
    return engine


def test_a_hybrid_block_holds_one_page_per_layer_of_the_largest_group(hybrid_cache):
    groups = hybrid_groups()
    assert [g.layer_names for g in groups] == [["0", "3"], ["2", "5"], ["1", "4"]]
    assert hybrid_cache.layer_pages == [0, 0, 0, 1, 1, 1]  # each layer's position in its group
    assert hybrid_cache.num_pages == 2
    page = 2 * BLOCK_SIZE * NUM_HEADS * HEAD_DIM * 4
    assert hybrid_cache.block_bytes == 2 * page  # not six pages
    for device, num_blocks in (("gpu", 8), ("cpu", 5)):
        assert hybrid_cache.pool_bytes(device) == num_blocks * hybrid_cache.block_bytes
    k0, k1, k3 = (hybrid_cache.gpu_cache[layer][0] for layer in (0, 1, 3))
    assert k0.shape == (8, BLOCK_SIZE, NUM_HEADS, HEAD_DIM)
    assert k0.data_ptr() == k1.data_ptr() != k3.data_ptr()  # layers 0 and 1 (two groups) share page 0
    k1[5].fill_(3.0)  # a full-attention layer writes block 5: layer 0 reads it through the same page
    assert torch.all(hybrid_cache.gpu_cache[0][0][5] == 3.0)
    assert not torch.any(hybrid_cache.gpu_cache[3][0][5] == 3.0)


def test_one_group_keeps_a_page_per_layer():
    """A one-group run is the layout as it was: one page per layer, in layer order."""
    from engine.v1.kv_cache_interface import FullAttentionSpec, get_kv_cache_groups

    groups = get_kv_cache_groups([FullAttentionSpec(BLOCK_SIZE)] * NUM_LAYERS)
    plain = CacheEngine(NUM_LAYERS, NUM_HEADS, HEAD_DIM, BLOCK_SIZE, 4, 2, "cpu", torch.float32)
    grouped = CacheEngine(NUM_LAYERS, NUM_HEADS, HEAD_DIM, BLOCK_SIZE, 4, 2, "cpu", torch.float32, groups)
    for cache in (plain, grouped):
        assert cache.layer_pages == list(range(NUM_LAYERS)) and cache._gpu_kv.shape[0] == NUM_LAYERS
        assert cache.block_bytes == CacheEngine.get_cache_block_size(BLOCK_SIZE, NUM_LAYERS, NUM_HEADS, HEAD_DIM,
                                                                     torch.float32)
        assert len({k.data_ptr() for k, _ in cache.gpu_cache}) == NUM_LAYERS


def test_groups_that_miss_a_layer_are_refused():
    from engine.v1.kv_cache_interface import KVCacheGroupSpec

    groups = [KVCacheGroupSpec(["0"], None), KVCacheGroupSpec(["2"], None)]
    with pytest.raises(ValueError, match=r"name layers \[0, 2\], the model has 3"):
        CacheEngine(3, NUM_HEADS, HEAD_DIM, BLOCK_SIZE, 4, 0, "cpu", torch.float32, groups)


def test_swap_copy_and_digests_move_every_page_of_a_hybrid_block(hybrid_cache):
    """Swap-out, copy-on-write and swap-in move a block's two pages (whichever group holds it), and
    the K/V digest follows its first page, the first layer of the group that holds it."""
    def pages(pool, index):  # (num_pages, 2, heads, block_size, head_dim)
        return pool[:, :, :, index].clone().cpu()

    gpu3, digest3 = pages(hybrid_cache._gpu_kv, 3), hybrid_cache.kv_digests("gpu", [3])
    hybrid_cache.swap_out([(3, 4)])
    assert torch.equal(pages(hybrid_cache._cpu_kv, 4), gpu3)
    assert hybrid_cache.kv_digests("cpu", [4]) == digest3
    assert hybrid_cache.block_fingerprint("cpu", 4) == hybrid_cache.block_fingerprint("gpu", 3)
    hybrid_cache.gpu_cache[3][1][3].zero_()  # another group's layer takes block 3 (page 1, V)
    assert hybrid_cache.block_fingerprint("gpu", 3) != hybrid_cache.block_fingerprint("cpu", 4)
    hybrid_cache.swap_in([(4, 6)])
    assert torch.equal(pages(hybrid_cache._gpu_kv, 6), gpu3)
    hybrid_cache.copy([(6, 7)])
    assert torch.equal(pages(hybrid_cache._gpu_kv, 7), gpu3)
    assert hybrid_cache.kv_digests("gpu", [6, 7]) == digest3 * 2
    # the digest reads page 0 of layer 2's group as of layer 0's: both are that page
    before = hybrid_cache.kv_digests("gpu", [7])
    hybrid_cache.gpu_cache[2][0][7, 0, 0, 0] += 1.0
    assert hybrid_cache.kv_digests("gpu", [7]) != before


CONFIG = GPT2Config(vocab_size=100, n_positions=64, n_embd=32, n_layer=2, n_head=4)
BLOCK_BYTES = 16 * 2 * 2 * 4 * 8 * 4


def test_determine_num_blocks_explicit_and_budget(caplog):
    common = dict(model=None, config=CONFIG, block_size=16, device="cpu", dtype=torch.float32,
                  max_num_batched_tokens=256)
    with caplog.at_level(logging.INFO, logger="engine"):
        explicit = determine_num_blocks(**common, num_gpu_blocks=12, num_cpu_blocks=3,
                                        kv_cache_memory_bytes=1 << 30)
    assert (explicit.num_gpu_blocks, explicit.num_cpu_blocks, explicit.source) == (12, 3, "explicit")
    assert explicit.block_bytes == BLOCK_BYTES
    assert "12 device blocks" in caplog.text

    budget = determine_num_blocks(**common, kv_cache_memory_bytes=10 * BLOCK_BYTES + 5, swap_space_bytes=4 * BLOCK_BYTES)
    assert (budget.num_gpu_blocks, budget.num_cpu_blocks, budget.source) == (10, 4, "budget")
    assert budget.total_bytes == 10 * BLOCK_BYTES + 5


def test_determine_num_blocks_cpu_default():
    budget = determine_num_blocks(None, CONFIG, 16, "cpu", torch.float32, 256)
    assert budget.source == "default-cpu"
    assert budget.num_gpu_blocks == DEFAULT_CPU_KV_CACHE_BYTES // BLOCK_BYTES
    assert budget.num_cpu_blocks > 0


def test_budget_too_small_is_a_clear_error():
    with pytest.raises(ValueError, match="no room for KV blocks"):
        determine_num_blocks(None, CONFIG, 16, "cpu", torch.float32, 256, kv_cache_memory_bytes=BLOCK_BYTES - 1)
    with pytest.raises(ValueError):
        BlockBudget(num_gpu_blocks=4, num_cpu_blocks=-1, block_bytes=1, source="explicit")


# --- model-name resolution -------------------------------------------------------------------


@pytest.fixture
def offline_empty_hf_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)


def test_uncached_hub_model_offline_fails_fast_with_one_line(offline_empty_hf_cache):
    import huggingface_hub  # noqa: F401 - time the lookup, not a first import on a busy machine

    start = time.monotonic()
    with pytest.raises(ModelNotFoundError) as info:
        load_model("gpt2", device="cpu")
    assert time.monotonic() - start < 5
    message = str(info.value)
    assert "\n" not in message and "'gpt2'" in message and "tiny-shakespeare" in message
    assert isinstance(info.value, ValueError)
    with pytest.raises(ModelNotFoundError, match="'gpt2'"):
        check_model("gpt2")


def test_uncached_hub_model_unreachable_hub_fails_fast(monkeypatch, tmp_path):
    """Without HF_HUB_OFFLINE, an unreachable hub is detected by one short probe, not retries."""
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # discard port: connection refused
    import huggingface_hub.constants as hf_constants

    monkeypatch.setattr(hf_constants, "HF_HUB_OFFLINE", False)
    start = time.monotonic()
    with pytest.raises(ModelNotFoundError, match="cannot be downloaded") as info:
        load_model("openai-community/gpt2", device="cpu")
    assert time.monotonic() - start < 10
    assert "\n" not in str(info.value) and "openai-community/gpt2" in str(info.value)


def test_resolve_model_routes(tiny_gpt2_dir, tmp_path):
    assert resolve_model(tiny_gpt2_dir) == tiny_gpt2_dir
    assert check_model(str(tiny_gpt2_dir)) == tiny_gpt2_dir
    assert resolve_model("gpt2") == "gpt2"
    with pytest.raises(ModelNotFoundError, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    (tmp_path / "a-file").write_text("not a checkpoint")
    with pytest.raises(ModelNotFoundError, match="is not a checkpoint directory"):
        resolve_model(str(tmp_path / "a-file"))
    with pytest.raises(ModelNotFoundError, match="no config.json"):
        resolve_model(tmp_path)


def test_bundled_default_resolves_or_explains(monkeypatch, tmp_path):
    import engine.model_source as model_source

    monkeypatch.setattr(model_source, "BUNDLED_MODELS_DIR", tmp_path)
    with pytest.raises(ModelNotFoundError, match=DEFAULT_MODEL) as info:
        resolve_model(None)
    assert "\n" not in str(info.value)


def test_non_gpt2_checkpoint_is_rejected(tmp_path):
    from transformers import BertConfig

    BertConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="'bert'"):
        load_model(tmp_path, device="cpu")


def test_load_model_defaults(tiny_gpt2_dir):
    loaded = load_model(tiny_gpt2_dir)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert loaded.device.type == expected
    assert loaded.dtype == (torch.float16 if expected == "cuda" else torch.float32)
    assert next(loaded.model.parameters()).dtype == loaded.dtype
    assert loaded.tokenizer.eos_token == "<|endoftext|>"
    assert loaded.config.n_layer == 2 and loaded.name == str(tiny_gpt2_dir)


def test_hub_name_loads_from_the_local_cache_offline(tiny_gpt2_dir, monkeypatch, tmp_path):
    """A hub name already in the Hugging Face cache loads with no network (like a cached "gpt2")."""
    import shutil

    commit = "0" * 40
    repo = tmp_path / "hf-home" / "hub" / "models--blockviz-tests--tiny-gpt2"
    shutil.copytree(tiny_gpt2_dir, repo / "snapshots" / commit)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)

    loaded = load_model("blockviz-tests/tiny-gpt2", device="cpu")
    assert loaded.path == "blockviz-tests/tiny-gpt2" and loaded.config.n_layer == 2
    reference = load_model(tiny_gpt2_dir, device="cpu")
    for ours, theirs in zip(loaded.model.parameters(), reference.model.parameters()):
        assert torch.equal(ours, theirs)
