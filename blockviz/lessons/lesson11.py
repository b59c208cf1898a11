"""Lesson 11 (lessons/11_what_a_token_costs.ipynb): what one token costs in the KV cache for MHA, GQA,
MQA, MLA, a hybrid (sliding-window + full) model and fp8, from published configs, and the prefix-cache
misses users meet on real runs: the one-block floor, a block size chosen large for a hybrid model, and
a sliding-window group that lost its tail.

PUBLISHED is the one table of published figures: each model's Hugging Face id and the config.json
fields (names and values as published) the lesson reads. Bytes follow vLLM 0.33
`vllm/v1/kv_cache_interface.py`: `AttentionSpec.page_size_bytes` (block_size x K/V heads x (head_size +
head_size_v) x dtype bytes per layer; `FullAttentionSpec`, `SlidingWindowSpec`) and `MLAAttentionSpec`
(one latent of kv_lora_rank + qk_rope_head_dim numbers per token per layer, no separate V; DeepSeek's
`get_kv_cache_spec` builds it with num_kv_heads=1). `vllm_block_bytes` asks vLLM's own classes;
`engine_block_bytes` our engine's (engine.cache_engine.CacheEngine.get_cache_block_size, and
engine.v1.kv_cache_interface.kv_cache_specs per layer); tests/test_lessons.py holds them equal.

The lesson has variants (blockviz.lessons.variants): a variant changes the block size of the MLA
and window exercises and the memory of the fp8 one; the published figures stay as published.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from functools import cache
from typing import Any, NamedTuple

from blockviz.lessons import variants
from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import fresh

GiB = 2**30
BLOCK_SIZE = 16  # vLLM's default block size on GPUs
KV_DTYPE_BYTES = {"bfloat16": 2, "fp8": 1}  # vLLM's kv_cache_dtype "auto" on a bfloat16 model, and "fp8"
CONTEXTS = (8_192, 32_768, 131_072)  # 8k, 32k and 128k tokens


@dataclass(frozen=True)
class Published:
    """A published model: its Hugging Face id, its attention design, and the fields of its
    config.json the lesson reads, with their published values."""

    model_id: str
    attention: str
    fields: dict[str, Any]


# Sources: the config.json of each model id on the Hugging Face Hub (field names and values as published).
PUBLISHED: dict[str, Published] = {
    "GPT-2": Published("openai-community/gpt2", "MHA", {
        "model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768}),
    "Llama-3-8B": Published("meta-llama/Meta-Llama-3-8B", "GQA", {
        "model_type": "llama", "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "hidden_size": 4096, "torch_dtype": "bfloat16"}),
    "Qwen2.5-7B": Published("Qwen/Qwen2.5-7B", "GQA", {
        "model_type": "qwen2", "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
        "hidden_size": 3584, "use_sliding_window": False, "torch_dtype": "bfloat16"}),
    "Falcon-7B": Published("tiiuae/falcon-7b", "MQA", {
        "model_type": "falcon", "num_hidden_layers": 32, "num_attention_heads": 71, "hidden_size": 4544,
        "multi_query": True, "new_decoder_architecture": False, "torch_dtype": "bfloat16"}),
    "DeepSeek-V3": Published("deepseek-ai/DeepSeek-V3", "MLA", {
        "model_type": "deepseek_v3", "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 128,
        "v_head_dim": 128, "torch_dtype": "bfloat16"}),
    "gpt-oss-20b": Published("openai/gpt-oss-20b", "hybrid", {
        "model_type": "gpt_oss", "num_hidden_layers": 24, "num_attention_heads": 64, "num_key_value_heads": 8,
        "head_dim": 64, "sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"] * 12,
        "torch_dtype": "bfloat16"}),
}


@dataclass(frozen=True)
class KVShape:
    """What one token leaves in the cache, per layer: `kv_factor` vectors (2: a key and a value;
    1: MLA's one latent) for each of `num_kv_heads` heads of `head_size` numbers; `windows` per
    layer (None: the layer keeps the whole history)."""

    num_layers: int
    num_kv_heads: int
    head_size: int
    kv_factor: int
    windows: tuple[int | None, ...]

    @property
    def num_full_layers(self) -> int:
        return sum(window is None for window in self.windows)


def kv_shape(fields: dict[str, Any]) -> KVShape:
    """The cache shape of a config.json, read as vLLM's model config reads it: GPT-2's n_head heads
    of n_embd / n_head; MLA's one latent of kv_lora_rank + qk_rope_head_dim (vLLM
    `ModelConfig.get_head_size` for MLA, num_kv_heads 1); Falcon's multi_query without
    new_decoder_architecture one K/V head (vLLM `ModelConfig.get_total_num_kv_heads`); otherwise
    num_key_value_heads of head_dim (or hidden_size / num_attention_heads), with the layers'
    windows as engine.model_source.attention_layer_types reads them."""
    from engine.model_source import attention_layer_types

    if fields["model_type"] == "gpt2":
        layers = fields["n_layer"]
        return KVShape(layers, fields["n_head"], fields["n_embd"] // fields["n_head"], 2, (None,) * layers)
    layers = fields["num_hidden_layers"]
    if "kv_lora_rank" in fields:
        return KVShape(layers, 1, fields["kv_lora_rank"] + fields["qk_rope_head_dim"], 1, (None,) * layers)
    if fields["model_type"] == "falcon" and fields["multi_query"] and not fields["new_decoder_architecture"]:
        kv_heads = 1
    else:
        kv_heads = fields.get("num_key_value_heads", fields["num_attention_heads"])
    head_size = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
    layer_types, window = attention_layer_types(fields.get)
    windows = tuple(window if kind == "sliding_attention" else None for kind in layer_types)
    return KVShape(layers, kv_heads, head_size, 2, windows)


def shape_of(name: str) -> KVShape:
    return kv_shape(PUBLISHED[name].fields)


def bytes_per_token(shape: KVShape, dtype_bytes: int) -> int:
    """Bytes one token's K/V (or latent) takes in every layer: layers x kv_factor x K/V heads x
    head_size x dtype bytes."""
    return shape.num_layers * shape.kv_factor * shape.num_kv_heads * shape.head_size * dtype_bytes


def bytes_per_block(shape: KVShape, block_size: int, dtype_bytes: int) -> int:
    """Bytes of one block of `block_size` tokens across every layer (vLLM: the layers' page sizes summed)."""
    return block_size * bytes_per_token(shape, dtype_bytes)


def _torch_dtype(kv_dtype: str):
    import torch

    # vLLM STR_DTYPE_TO_TORCH_DTYPE stores "fp8" as uint8 bytes (vllm/utils/torch_utils.py)
    return {"bfloat16": torch.bfloat16, "fp8": torch.uint8}[kv_dtype]


def engine_block_bytes(shape: KVShape, block_size: int, kv_dtype: str) -> int | None:
    """Bytes of one block as our engine sizes it: CacheEngine.get_cache_block_size (K and V per
    layer), checked against the sum of engine.v1.kv_cache_interface.kv_cache_specs's page sizes (one
    spec per layer, sliding ones included). None for MLA: the engine has no latent cache."""
    from types import SimpleNamespace

    from engine.cache_engine import CacheEngine
    from engine.v1.kv_cache_interface import kv_cache_specs

    if shape.kv_factor != 2:
        return None
    dtype = _torch_dtype(kv_dtype)
    total = CacheEngine.get_cache_block_size(block_size, shape.num_layers, shape.num_kv_heads, shape.head_size, dtype)
    config = SimpleNamespace(num_layers=shape.num_layers, num_kv_heads=shape.num_kv_heads, head_dim=shape.head_size,
                             sliding_windows=shape.windows)
    assert total == sum(spec.page_size_bytes for spec in kv_cache_specs(config, block_size, dtype))
    return total


def vllm_specs(shape: KVShape, block_size: int, kv_dtype: str) -> list | None:
    """One vLLM 0.33 spec per layer, as its attention layers build them (`get_kv_cache_spec`):
    MLAAttentionSpec (num_kv_heads 1, head_size the latent) for MLA, SlidingWindowSpec for a
    window, FullAttentionSpec otherwise; fp8 as uint8 with its KVQuantMode. None without vLLM."""
    try:
        from vllm.v1.kv_cache_interface import (FullAttentionSpec, MLAAttentionSpec, SlidingWindowSpec,
                                                get_kv_quant_mode)
    except ImportError:
        return None
    cache_dtype = {"bfloat16": "auto", "fp8": "fp8"}[kv_dtype]
    common = dict(block_size=block_size, num_kv_heads=shape.num_kv_heads, head_size=shape.head_size,
                  dtype=_torch_dtype(kv_dtype), kv_quant_mode=get_kv_quant_mode(cache_dtype))
    if shape.kv_factor == 1:
        return [MLAAttentionSpec(**common, cache_dtype_str=cache_dtype) for _ in shape.windows]
    return [FullAttentionSpec(**common) if window is None else SlidingWindowSpec(**common, sliding_window=window)
            for window in shape.windows]


# Bytes of one block of 16 tokens across every layer, as vLLM 0.33's own spec classes size it
# (`vllm_block_bytes`), per model and kv dtype: shipped, so the lesson shows vLLM's figures where vLLM
# is not installed (the Jupyter install); tests/test_lessons_vllm.py recomputes them from vLLM's classes.
VLLM_BLOCK_BYTES: dict[str, dict[str, int]] = {
    "GPT-2": {"bfloat16": 589_824, "fp8": 294_912},
    "Llama-3-8B": {"bfloat16": 2_097_152, "fp8": 1_048_576},
    "Qwen2.5-7B": {"bfloat16": 917_504, "fp8": 458_752},
    "Falcon-7B": {"bfloat16": 131_072, "fp8": 65_536},
    "DeepSeek-V3": {"bfloat16": 1_124_352, "fp8": 562_176},
    "gpt-oss-20b": {"bfloat16": 786_432, "fp8": 393_216},
}


def vllm_block_bytes(shape: KVShape, block_size: int, kv_dtype: str) -> int | None:
    """Bytes of one block across every layer by vLLM's own spec classes (page_size_bytes summed);
    None where vLLM is not installed."""
    specs = vllm_specs(shape, block_size, kv_dtype)
    return None if specs is None else sum(spec.page_size_bytes for spec in specs)


def window_blocks(window: int, block_size: int, num_tokens: int) -> int:
    """The most blocks a decoding request of `num_tokens` holds in a sliding-window layer: its
    window's `window - 1` earlier tokens and the new one, over one block boundary more than they
    fill, cdiv(window - 1, block_size) + 1 (vLLM's admission cap,
    `SlidingWindowSpec.max_admission_blocks_per_request`, counts window - 1 + the tokens in flight
    the same way), never more than the tokens need."""
    from engine.v1.kv_cache_interface import cdiv

    return min(cdiv(num_tokens, block_size), cdiv(window - 1, block_size) + 1)


def admission_blocks(window: int, block_size: int, num_in_flight_tokens: int) -> int:
    """vLLM 0.33's admission cap for one request in a sliding-window group
    (`SlidingWindowSpec.max_admission_blocks_per_request`, no extra retained tokens, a long context):
    the window's `window - 1` earlier tokens and every token scheduled but not yet processed, over one
    block boundary more, cdiv(window - 1 + num_in_flight_tokens, block_size) + 1. With one token in
    flight it is `window_blocks`' bound."""
    from engine.v1.kv_cache_interface import cdiv

    return cdiv(window - 1 + num_in_flight_tokens, block_size) + 1


IN_FLIGHT = (1, 2, 2_048, 8_192)  # tokens in flight the lesson prices vLLM's cap at: one decode, two, a token budget's worth


def request_bytes(shape: KVShape, num_tokens: int, block_size: int, dtype_bytes: int) -> int:
    """Bytes of KV one request of `num_tokens` holds while decoding: every block in a full layer,
    the window's blocks in a sliding one."""
    from engine.v1.kv_cache_interface import cdiv

    page = block_size * shape.kv_factor * shape.num_kv_heads * shape.head_size * dtype_bytes  # one layer's block
    return page * sum(cdiv(num_tokens, block_size) if window is None else window_blocks(window, block_size, num_tokens)
                      for window in shape.windows)


# ---------------------------------------------------------------- the exercises: what a token costs


class Figures(NamedTuple):
    """The figures one variant of the lesson computes with: the block size of the MLA exercise,
    the GiB of the fp8 one and the block size of the window one."""

    mla_block_size: int
    pool_gib: int
    window_block_size: int

    def fields(self) -> dict:
        """The figures by name (what hints and the notebook's text are filled with), and vLLM's window
        admission cap at this block size for each count of tokens in flight past one."""
        caps = ", ".join(f"{admission_blocks(128, self.window_block_size, n)} with {n:,}" for n in IN_FLIGHT[1:])
        return {**self._asdict(), "window_admission_caps": caps}


@cache
def figures_of(seed: int | None) -> Figures:
    """The figures of variant `seed` (None: the lesson as stored: vLLM's default block of 16, 1 GiB)."""
    if seed is None:
        return Figures(BLOCK_SIZE, 1, BLOCK_SIZE)
    rng = random.Random(seed)
    return Figures(rng.choice((16, 32, 64)), rng.choice((1, 2, 4)), rng.choice((8, 16, 32)))


variants.register("11", figures_of)

# what a variant's notebook says in place of the stored lesson's figures (key.py --variants)
VARIANT_TEXT = (
    ("with vLLM's default block of 16 tokens: how many bytes", "with blocks of {mla_block_size} tokens: how many bytes"),
    ("fit in exactly 1 GiB (`2**30` bytes)", "fit in exactly {pool_gib} GiB (`{pool_gib} * 2**30` bytes)"),
    ("# your answer: tokens in 1 GiB", "# your answer: tokens in {pool_gib} GiB"),
    ("(`sliding_window` 128), with blocks of 16. At most", "(`sliding_window` 128), with blocks of {window_block_size}. "
                                                           "At most"),
)


def figures() -> Figures:
    """This notebook's figures (its variant's, blockviz.lessons.variants.use)."""
    return figures_of(variants.active())


@exercise("11", "my_mqa_bytes", "layers x 2 (K and V) x K/V heads x head_size x 2 bytes: with multi_query, how "
                                "many K/V heads does Falcon-7B keep?",
          slips=[Slip(581_632, "that counts all 71 heads: what do the query heads of a multi_query model share?"),
                 Slip(4_096, "does a token store only a key?")],
          praise="71 query heads, one K/V head: 71 times less than caching every head.")
def check_mqa_bytes():
    """Bytes per token of Falcon-7B's KV cache in bfloat16."""
    return bytes_per_token(shape_of("Falcon-7B"), 2)


@exercise("11", "my_mla_block", "block_size x layers x (kv_lora_rank + qk_rope_head_dim) x 2 bytes: one latent "
                                "per token per layer, and no separate V.",
          slips=[Slip(lambda: 2 * check_mla_block.truth(), "MLA keeps one latent vector, not a key and a value: is "
                                                           "there a factor 2?"),
                 Slip(lambda: figures().mla_block_size * 61 * 512 * 2, "what else does the latent hold besides "
                                                                       "kv_lora_rank numbers? Look at the rotary key."),
                 Slip(lambda: check_mla_block.truth() // 61, "that is one layer's page: how many layers does "
                                                             "DeepSeek-V3 have?")],
          praise="61 layers x 576 numbers a token: far less than 128 heads of K and V would take.", unit="bytes")
def check_mla_block():
    """Bytes of one block (the variant's block size) of DeepSeek-V3's latent cache in bfloat16 (vLLM MLAAttentionSpec)."""
    return bytes_per_block(shape_of("DeepSeek-V3"), figures().mla_block_size, 2)


@exercise("11", "my_fp8_tokens", "the memory's bytes divided by one token's bytes; how many bytes does one fp8 "
                                 "number take?",
          slips=[Slip(lambda: check_fp8_tokens.truth() // 2, "that counts 2 bytes a number, as bfloat16 does: how "
                                                             "many bits has an fp8 number?"),
                 Slip(lambda: check_fp8_tokens.truth() // 4, "which heads does the cache hold: the query heads or "
                                                             "the K/V heads?")],
          praise="fp8 halves every figure of bfloat16: twice the tokens in the same memory.", unit="tokens")
def check_fp8_tokens():
    """Tokens of Llama-3-8B's KV cache that fit in the variant's GiB with kv_cache_dtype fp8."""
    return figures().pool_gib * GiB // bytes_per_token(shape_of("Llama-3-8B"), KV_DTYPE_BYTES["fp8"])


@cache
def window_blocks_held(window: int, block_size: int, num_tokens: int) -> int:
    """The most blocks one request held in a sliding-window group while decoding `num_tokens`
    tokens one at a time, on engine/v1's KVCacheManager with a full and a sliding-window group
    (the null block counted as none)."""
    from engine.sequence import Sequence
    from engine.v1 import KVCacheManager
    from engine.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec, SlidingWindowSpec, cdiv

    groups = [KVCacheGroupSpec(["0"], FullAttentionSpec(block_size)),
              KVCacheGroupSpec(["1"], SlidingWindowSpec(block_size, sliding_window=window))]
    manager = KVCacheManager(block_size, 2 * cdiv(num_tokens, block_size) + 4, kv_cache_groups=groups)
    seq = Sequence(0, [1], block_size)
    most = 0
    for _ in range(num_tokens - 1):
        assert manager.allocate_slots(seq, 1) is not None
        seq.num_computed_tokens += 1
        seq.append_token_id(1)
        _, window_table = manager.get_block_ids_per_group(seq)
        most = max(most, sum(block != 0 for block in window_table))
    return most


@exercise("11", "my_window_blocks", "the window covers the last 128 positions, and it need not start where a block "
                                    "starts.",
          slips=[Slip(lambda: 128 // figures().window_block_size,
                      "that many blocks hold the window only while it starts on a block boundary: where does it "
                      "start one token later, and which blocks does it touch then?"),
                 Slip(128, "that counts tokens; the question asks for blocks of {window_block_size}.")],
          praise="the window's blocks, and one more when it straddles a boundary. vLLM's admission cap "
                 "(SlidingWindowSpec.max_admission_blocks_per_request) also counts the tokens scheduled but not yet "
                 "processed, so it agrees only with one token in flight: {window_admission_caps} (vLLM reserves "
                 "max_num_batched_tokens for each batch in flight).", unit="blocks")
def check_window_blocks():
    """The most blocks (the variant's block size) one request holds in a gpt-oss sliding-window layer (window 128)."""
    return window_blocks_held(128, figures().window_block_size, 400)


# ---------------------------------------------------------------- the exercises: why is my hit rate 0

# Shakespeare's opening line in the bundled tokenizer: 20 tokens and more
OPENING = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."
QUESTIONS = ("\n\nFirst Citizen:\nYou are all resolved rather to die than to famish?",
             "\n\nSecond Citizen:\nWould you proceed especially against Caius Marcius?")
SHORT = 15  # tokens of the short prompt: less than one block of 16
SHARED = 40  # tokens of the shared opening in the big-block run


def options(kv_manager: str, block_size: int = BLOCK_SIZE, num_gpu_blocks: int = 32) -> dict:
    """The lesson's engine: the bundled model, prefix caching on, no CPU pool, v0's or v1's manager."""
    return {"block_size": block_size, "num_gpu_blocks": num_gpu_blocks, "num_cpu_blocks": 0,
            "enable_prefix_caching": True, "kv_manager": kv_manager}


def prompt_ids(encode, num_tokens: int, tail: str = "") -> dict:
    """The first `num_tokens` tokens of the opening (repeated as needed), then `tail`'s tokens."""
    opening = encode(OPENING)
    while len(opening) < num_tokens:
        opening += encode(OPENING)
    return {"prompt_token_ids": opening[:num_tokens] + (encode(tail) if tail else [])}


def hits_of_the_second(kv_manager: str, block_size: int, first: int, second: int | None = None,
                       tails: tuple[str, str] = ("", "")) -> tuple[Any, Any]:
    """Run a request of the opening's first `first` tokens (+ tails[0]) to the end, then one of
    `second` (default `first`) tokens (+ tails[1]), and return (the second's Explanation, the Visualizer's
    events) as the explainer gives it."""
    from blockviz.model.explain import explain_requests
    from engine.sequence import SamplingParams

    params = SamplingParams(max_tokens=2)
    with fresh(options(kv_manager, block_size)) as viz:
        encode = viz.llm.engine.encode
        viz.add_request(prompt_ids(encode, first, tails[0]), params)
        viz.run_to_completion()
        again = viz.add_request(prompt_ids(encode, first if second is None else second, tails[1]), params)
        viz.step()
        lookups = {x.request_id: x for x in explain_requests(viz.events, block_size, 32, 0, kv_manager=kv_manager)}
        return lookups[again], list(viz.events)


def same_in_both(figure) -> Any:
    """`figure(kv_manager)` for v0 and v1, which agree on these lookups; AssertionError if they do not."""
    v0, v1 = figure("v0"), figure("v1")
    assert v0 == v1, (v0, v1)
    return v1


@exercise("11", "my_floor_hits", "a block gets its hash when it fills: how many full blocks does a 15-token "
                                 "prompt make with blocks of 16?",
          slips=[Slip(SHORT, "do 15 tokens fill a block of 16? Only a full block gets a hash."),
                 Slip(BLOCK_SIZE, "a 15-token prompt fills no 16-token block.")],
          praise="under one block, nothing is ever cached: the one-block floor.")
def check_floor_hits():
    """Tokens the cache serves the 15-token prompt sent a second time (v0 and v1 alike)."""
    return same_in_both(lambda kv_manager: hits_of_the_second(kv_manager, BLOCK_SIZE, SHORT)[0].num_hit_tokens)


@exercise("11", "my_big_block_hits", "a 40-token opening in blocks of 64: is one block of it ever full?",
          slips=[Slip(32, "that is blocks of 16 (two full blocks of the opening): with blocks of 64, "
                          "is any block full before the requests differ?"),
                 Slip(SHARED, "hits come in whole blocks: how many blocks of 64 does the 40-token opening fill?"),
                 Slip(64, "the first 64 tokens differ from token 41 on: that block is not the same block.")],
          praise="the same prompts hit 32 tokens with blocks of 16: the block size alone made the hit rate 0.")
def check_big_block_hits():
    """Tokens the second request's shared 40-token opening is served with 64-token blocks (v0 and v1)."""
    return same_in_both(lambda kv_manager: hits_of_the_second(kv_manager, 64, SHARED, tails=QUESTIONS)[0].num_hit_tokens)


A_PROMPT = tuple(range(100, 116))  # request A: 16 tokens, 4 blocks of 4


HYBRID_BLOCK_SIZE = 4


def hybrid_options(num_gpu_blocks: int = 12) -> dict:
    """The tiny hybrid checkpoint on engine/v1: blocks of 4, prefix caching on (v1's default)."""
    return {"model": hybrid_checkpoint(), "kv_manager": "v1", "block_size": HYBRID_BLOCK_SIZE,
            "num_gpu_blocks": num_gpu_blocks}


def window_tail(viz) -> str:
    """On `viz`'s engine: request A (16 tokens, 2 sampled) runs to the end, its window blocks let go
    while it decodes; then C (8 new tokens) and B (A's first 12 tokens and one more) arrive, and
    one step admits both: C's blocks come from the pool's free queue, A's freed window blocks
    among them. Returns B's request id."""
    from engine.sequence import SamplingParams

    viz.add_request({"prompt_token_ids": list(A_PROMPT)}, SamplingParams(max_tokens=2, ignore_eos=True))
    viz.run_to_completion()
    viz.add_request({"prompt_token_ids": list(range(50, 58))}, SamplingParams(max_tokens=1, ignore_eos=True))
    b = viz.add_request({"prompt_token_ids": list(A_PROMPT[:12]) + [77]}, SamplingParams(max_tokens=1, ignore_eos=True))
    viz.step()
    return b


@cache
def window_tail_hits(model: str = "hybrid") -> int:
    """Tokens B is served from the cache in `window_tail`, on the tiny hybrid checkpoint ("hybrid":
    a full-attention and a sliding-window group) or on the bundled full-attention model ("full")."""
    options = hybrid_options() if model == "hybrid" else {**hybrid_options(), "model": "tiny-shakespeare"}
    with fresh(options) as viz:
        return viz.insight.explain(window_tail(viz)).num_hit_tokens


@exercise("11", "my_window_hit", "a hit must hold in every group: the window group needs the blocks just before the "
                                 "hit's end, and one of A's was evicted.",
          slips=[Slip(12, "the full group holds all 12 tokens, but the window group lost the block a 12-token hit "
                          "would end on."),
                 Slip(0, "the window group needs only the last block before the hit's end; an earlier end still "
                         "has its block.")],
          praise="the hybrid hit is cut to where every group still has what it needs.",
          unit="tokens", other_unit=("blocks", lambda: check_window_hit.truth() // HYBRID_BLOCK_SIZE))
def check_window_hit():
    """Tokens B is served from the cache on the tiny hybrid checkpoint (a full and a window group)."""
    return window_tail_hits("hybrid")


# ---------------------------------------------------------------- a tiny hybrid checkpoint, built locally

HYBRID_LAYERS = ("sliding_attention", "full_attention") * 2  # gpt-oss's pattern, on 4 layers
HYBRID_WINDOW = 4


@cache
def hybrid_checkpoint() -> str:
    """A tiny random Llama checkpoint with gpt-oss's layer pattern (sliding, full, sliding, full;
    window 4) and the bundled model's tokenizer, written once per process into a temporary
    directory removed at exit; returns its path (`LLM(model=path)`). Random weights: its text is
    noise, its KV cache is real."""
    import atexit
    import shutil
    import tempfile
    from pathlib import Path

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    from engine.model_source import BUNDLED_MODELS_DIR, DEFAULT_MODEL

    home = Path(tempfile.mkdtemp(prefix="blockviz-lesson11-"))
    atexit.register(shutil.rmtree, home, True)  # gone when the kernel exits
    path = home / "lesson11-hybrid"  # the name titles and moments show (design.model_name)
    config = LlamaConfig(vocab_size=2048, hidden_size=64, intermediate_size=128, num_hidden_layers=len(HYBRID_LAYERS),
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         layer_types=list(HYBRID_LAYERS), sliding_window=HYBRID_WINDOW, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)
    logging.disable_progress_bar()
    LlamaForCausalLM(config).save_pretrained(path)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(BUNDLED_MODELS_DIR / DEFAULT_MODEL / name, path / name)
    return str(path)
