"""A real hybrid run's trace for the view tests (issue 41, item 4): a tiny random Llama checkpoint
whose `layer_types` mix sliding-window and full-attention layers (saved to a temp dir, as
tests/test_sliding_window.py builds them), run under engine/v1 (kv_manager="v1") with prefix
caching, its events and header written as a trace. Two requests share a prompt prefix, so the
second hits in the full-attention group while the sliding-window group has let its head go.

`window_cursor(events, state_at)` finds a cursor where a window group's table holds the null block
(a freed window slot) while its request still runs, for the tests to draw.
"""

from __future__ import annotations

from pathlib import Path

from conftest import build_tokenizer

from blockviz.model.trace import make_header, write_trace
from engine import events as ev
from engine.designs import V1

WINDOW = 4
BLOCK_SIZE = 4
PROMPTS = ["To be, or not to be, that is the question: whether tis nobler in the mind",
           "To be, or not to be, that is the question: whether tis nobler in the mind to suffer"]


def make_hybrid_llama(path: Path) -> Path:
    """A tiny Llama with layers [sliding, full] (window WINDOW), + tokenizer."""
    import torch
    import transformers

    tokenizer = build_tokenizer()
    eos = tokenizer.eos_token_id
    config = transformers.LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, max_position_embeddings=256,
        initializer_range=0.3, rms_norm_eps=1e-6, num_attention_heads=4, num_key_value_heads=2,
        layer_types=["sliding_attention", "full_attention"], sliding_window=WINDOW,
        vocab_size=len(tokenizer), bos_token_id=eos, eos_token_id=eos)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def record_hybrid_trace(path: Path, checkpoint: Path) -> Path:
    """Run the prompts one after the other (the second hits the first's cached prefix) under
    engine/v1 and write the trace of the run to `path`."""
    from blockviz.session.engine_session import trace_header
    from engine import LLM, SamplingParams

    llm = LLM(str(checkpoint), kv_manager=V1.name, block_size=BLOCK_SIZE, num_gpu_blocks=64, device="cpu",
              enable_prefix_caching=True)
    events: list[ev.Event] = []
    llm.engine.events.subscribe(events.append)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    for prompt in PROMPTS:
        llm.generate([prompt], params)
    write_trace(path, make_header(trace_header(llm.engine), title="hybrid views"), events)
    return path


def window_cursors(timeline) -> list[int]:
    """Positions (after an event) where a window group's table of a running sequence holds the null
    block: a slot the window let go, drawn as the null block."""
    found = []
    for position in range(1, len(timeline) + 1):
        timeline.seek(position)
        state = timeline.state
        for group in range(state.num_kv_cache_groups):
            if state.is_window_group(group) and any(("gpu", 0) in table for table in state.tables_of(group).values()):
                found.append(position)
                break
    return found
