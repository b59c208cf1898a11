"""ModelRunner: one step's forward pass, from scheduled sequences to sampled tokens (vLLM v0
`ModelRunner`: _prepare_prompt / _prepare_decode, execute_model; nano-vllm's `ModelRunner`:
prepare_prefill / prepare_decode, run_model, sampler).

It computes from the scheduler's plan alone (engine/scheduler_output.py): a prefill feeds each
sequence's tokens that the prefix cache did not serve (at least its last), a prefill chunk its
next tokens, a decode its newest token. Either way the attention metadata says where every new
token's K/V goes and which blocks each sequence attends over (engine/attention.py).

On CUDA a decode step replays a CUDA graph (engine/cuda_graphs.py, nano-vllm's `run_model`) unless
`enforce_eager`; prefills and mixed steps, the LM head and sampling run eagerly. A step's inputs
reach the device in one copy, its sampled ids come back in one (`sample`).
KV-cache groups (engine/v1/kv_cache_interface.py): each group's table in the plan drives its own
metadata, and each layer gets its group's (vLLM v1 GPUModelRunner: one AttentionMetadata per
group, applied to the group's layers). A layer's K/V cache is its page of every block
(engine/cache_engine.py: the i-th layers of all groups share page i), indexed by the pool's one
block id space: a group's layers write only into the blocks of the group's table, which no other
group holds.
A model with one group (every full-attention model) gets one metadata, shared by every layer.
"""

from __future__ import annotations

import warnings

import torch

from engine.attention import AttentionMetadata, to_device
from engine.cache_engine import CacheEngine
from engine.cuda_graphs import CUDAGraphCapture, CUDAGraphRunner, EagerCapture
from engine.kernels import resolve_attention_backend
from engine.models import GPT2, Llama
from engine.sampler import sample
from engine.scheduler_output import SchedulerOutput
from engine.sequence import SamplingParams, Sequence


class ModelRunner:
    """Runs the model over one step's plan against the paged KV cache, and samples."""

    def __init__(self, model: GPT2 | Llama, cache_engine: CacheEngine, block_size: int, device: torch.device,
                 attention_backend: str | None = None, kv_cache_groups=None, *, max_num_seqs: int = 64,
                 enforce_eager: bool = False, capture: CUDAGraphCapture | EagerCapture | None = None) -> None:
        """kv_cache_groups: the block manager's KVCacheGroupSpecs, whose layer names are layer
        indices; None or one group: every layer reads the plan's first table. `enforce_eager` or a
        device other than CUDA: no graphs. `capture` overrides how the decode graphs are captured
        (EagerCapture: the stand-in that runs them eagerly, on any device); None captures CUDA graphs
        on CUDA (nano-vllm: `if not enforce_eager: capture_cudagraph()`)."""
        self.model = model
        groups = kv_cache_groups if kv_cache_groups and len(kv_cache_groups) > 1 else None
        # layer index -> its KV-cache group's index (None: one group)
        self.layer_group_ids = None if groups is None else [
            group_id for _, group_id in sorted((int(name), group_id) for group_id, group in enumerate(groups)
                                               for name in group.layer_names)]
        self.cache_engine = cache_engine
        self.block_size = block_size
        self.device = torch.device(device)
        # "torch" or "triton" (engine/kernels); None picks the device's default; ValueError if it cannot run here
        self.attention_backend = resolve_attention_backend(attention_backend, device)
        if capture is None and self.device.type == "cuda":
            capture = CUDAGraphCapture()
        self.graph_runner: CUDAGraphRunner | None = None
        self.graphs_skipped: str | None = None  # why decode runs eagerly although graphs were asked for
        windows = [w for w in getattr(getattr(model, "config", None), "sliding_windows", None) or () if w]
        if windows and self.attention_backend == "torch" and not enforce_eager and capture is not None:
            # the torch decode path narrows each sequence's blocks to its window on the host, from the
            # step's context lengths: a graph would replay the lengths it was captured with
            self.graphs_skipped = "sliding-window layers on the torch attention backend: decode steps run eagerly"
            capture = None
        if self.layer_group_ids is not None and not enforce_eager and capture is not None:
            # a graph's static buffers hold one block table per row; several KV-cache groups need one each
            self.graphs_skipped = "several KV-cache groups: decode steps run eagerly"
            capture = None
        if not enforce_eager and capture is not None:
            try:
                self.graph_runner = CUDAGraphRunner(model, cache_engine.gpu_cache, block_size, max_num_seqs,
                                                    self.attention_backend, self.device, capture)
            except (RuntimeError, torch.cuda.OutOfMemoryError) as exc:  # a capture this device refuses
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                self.graphs_skipped = f"CUDA graphs could not be captured ({first}): decode steps run eagerly"
                warnings.warn(self.graphs_skipped + "; --enforce-eager skips the attempt", RuntimeWarning,
                              stacklevel=2)

    def prepare_inputs_per_group(self, plan: SchedulerOutput) -> tuple[torch.Tensor, list[AttentionMetadata]]:
        """The step's new tokens flattened, sequence after sequence, and one attention metadata per
        KV-cache group (vLLM v1 GPUModelRunner._prepare_inputs): each sequence feeds its tokens from
        num_computed_tokens on, num_new_tokens of them, and attends over each group's block table
        (the same positions and lengths in all)."""
        input_ids: list[int] = []
        query_lens: list[int] = []
        context_lens: list[int] = []
        for s in plan.scheduled:
            input_ids.extend(s.seq.get_token_ids_between(s.num_computed_tokens, s.num_tokens))
            query_lens.append(s.num_new_tokens)
            context_lens.append(s.num_tokens)
        num_groups = 1 if self.layer_group_ids is None else max(self.layer_group_ids) + 1
        metas = [AttentionMetadata.build([s.block_ids[group_id] for s in plan.scheduled], query_lens, context_lens,
                                         self.block_size, self.device, self.attention_backend)
                 for group_id in range(num_groups)]
        (tokens,) = to_device([input_ids], self.device)  # (num_tokens,)
        return tokens, metas

    def execute_model(self, plan: SchedulerOutput) -> torch.Tensor:
        """Write the step's K/V into the cache and return each scheduled sequence's logits at its
        last new token, (num_scheduled, vocab): a decode step by a graph's replay when there are
        graphs (nano-vllm `run_model`), any other step eagerly. With several KV-cache groups the
        model gets a metadata per layer, its group's (a model that takes them says so:
        `takes_layer_metadata`)."""
        if self.graph_runner is not None and self.graph_runner.can_run(plan):
            return self.model.compute_logits(self.graph_runner.run(plan))  # (num_scheduled, vocab)
        tokens, metas = self.prepare_inputs_per_group(plan)
        meta = metas[0] if self.layer_group_ids is None else tuple(metas[g] for g in self.layer_group_ids)
        hidden = self.model(tokens, metas[0].positions, self.cache_engine.gpu_cache, meta)  # (num_tokens, hidden)
        return self.model.compute_logits(hidden[metas[0].last_token_indices])  # (num_scheduled, vocab)

    @staticmethod
    def sample(logits: torch.Tensor, seqs: list[Sequence], params: list[SamplingParams]) -> list[int]:
        """One token per row of `logits`, each drawn with its sequence's own generator."""
        return sample(logits, params, [seq.generator for seq in seqs])
