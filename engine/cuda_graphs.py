"""CUDA graphs for decode steps: one captured forward per batch size, replayed over static buffers.

References: nano-vllm `nanovllm/engine/model_runner.py` (`capture_cudagraph`: static input buffers,
batch sizes 1, 2, 4, 8, then every 16, captured largest first into one memory pool; `run_model`:
copy the step's rows into the front of the buffers, replay the smallest graph that holds them);
vLLM v0 `vllm/worker/model_runner.py` `CUDAGraphRunner` and `_get_graph_batch_size`; vLLM's
`PAD_SLOT_ID` (-1: a padding row writes no K/V).

A decode step launches a few kernels per layer, each too small to keep the GPU busy: the CPU's
launches are the step's time. A graph replays the whole forward as one launch. What it cannot do
is change shape or read host values: so every decode step of `num_seqs` sequences runs the graph
captured for the smallest batch size >= num_seqs, its rows `num_seqs..` padding (token 0, position
0, slot -1 so it writes nothing, context length 0 so attention reads nothing and returns 0), and
every block table is full width (the blocks of `max_model_len`). Prefills, mixed steps, the LM
head and sampling stay eager (engine/model_runner.py).

The capture itself is a strategy: `CUDAGraphCapture` records with `torch.cuda.graph`;
`EagerCapture` is a stand-in that runs the same function, on the same static buffers, each time the
graph would be replayed. The captured function reads nothing per step but those buffers, so the
stand-in computes what a replay computes: the tests run the graph path on the CPU through it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.attention import AttentionMetadata, DecodeGroup, decode_key_mask, to_device
from engine.scheduler_output import SchedulerOutput

KVCache = tuple[torch.Tensor, torch.Tensor]
PAD_SLOT_ID = -1  # vLLM's: a row whose K/V is written nowhere
NUM_INPUT_ROWS = 4  # the per-sequence inputs: token id, position, slot, context length


def capture_sizes(max_num_seqs: int) -> list[int]:
    """The batch sizes captured, ascending: 1, 2, 4, 8, then every 16 up to `max_num_seqs`, and
    `max_num_seqs` itself, so every decode batch the scheduler can form has a graph (nano-vllm's
    `graph_bs`; vLLM's `cudagraph_capture_sizes`)."""
    sizes = [size for size in (1, 2, 4, 8, *range(16, max_num_seqs + 1, 16)) if size <= max_num_seqs]
    return sizes if sizes[-1] == max_num_seqs else [*sizes, max_num_seqs]


def padded_batch_size(num_seqs: int, sizes: Sequence[int]) -> int:
    """The smallest captured size that holds `num_seqs` rows (vLLM v0 `_get_graph_batch_size`)."""
    for size in sizes:
        if size >= num_seqs:
            return size
    raise ValueError(f"no graph holds {num_seqs} sequences: the largest captured is {sizes[-1]}")


class CUDAGraphCapture:
    """Captures with `torch.cuda.graph`, every graph into one memory pool (nano-vllm's
    `graph_pool`): captured largest first, the smaller graphs reuse the largest one's memory."""

    def __init__(self) -> None:
        self.pool = None

    def capture(self, forward: Callable[[], None]) -> Callable[[], None]:
        """Run `forward` once (Triton compiles, cuBLAS picks its kernels), record it, and return
        the graph's replay."""
        forward()
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self.pool):
            forward()
        if self.pool is None:
            self.pool = graph.pool()
        torch.cuda.synchronize()
        return graph.replay


class EagerCapture:
    """The stand-in: `capture(forward)` runs it once and returns it, so each "replay" runs the same
    padded forward over the same static buffers eagerly. Works on any device."""

    def capture(self, forward: Callable[[], None]) -> Callable[[], None]:
        forward()
        return forward


class CUDAGraphRunner:
    """The decode graphs of one model over one KV cache (nano-vllm `capture_cudagraph` /
    `run_model`; vLLM v0 `CUDAGraphRunner`, one per batch size there, all sizes here).

    Static buffers, made once: `inputs` (4, max_batch) int64 rows of token ids, positions, slots
    and context lengths; `block_tables` (max_batch, max_num_blocks) int64; `outputs` (max_batch,
    hidden_size). A step sends its rows to the device in one copy (`stage`) and replays.
    """

    def __init__(self, model: torch.nn.Module, kv_caches: Sequence[KVCache], block_size: int, max_num_seqs: int,
                 attention_backend: str, device: torch.device, capture: CUDAGraphCapture | EagerCapture) -> None:
        self.model = model
        self.kv_caches = kv_caches
        self.block_size = block_size
        self.attention_backend = attention_backend
        self.device = device
        self.max_model_len = model.config.max_model_len
        self.max_num_blocks = -(-self.max_model_len // block_size)  # a full-width block table
        self.sizes = capture_sizes(max_num_seqs)
        max_batch = self.sizes[-1]
        # the token embedding, the model's first Embedding, gives the hidden states' width and dtype
        embedding = next(m for m in model.modules() if isinstance(m, torch.nn.Embedding))
        hidden_size, dtype = embedding.embedding_dim, embedding.weight.dtype
        with torch.inference_mode():
            self.inputs = torch.zeros(NUM_INPUT_ROWS, max_batch, dtype=torch.int64, device=device)
            self.input_ids, self.positions, self.slot_mapping, self.context_lens = self.inputs  # views, (max_batch,)
            self.slot_mapping.fill_(PAD_SLOT_ID)
            self.block_tables = torch.zeros(max_batch, self.max_num_blocks, dtype=torch.int64, device=device)
            self.outputs = torch.zeros(max_batch, hidden_size, dtype=dtype, device=device)
            self.arange = torch.arange(max(max_batch + 1, self.max_num_blocks * block_size), device=device)
            self.capture_order: list[int] = []
            self.graphs: dict[int, Callable[[], None]] = {}
            for size in reversed(self.sizes):  # largest first: the pool grows once
                self.graphs[size] = capture.capture(lambda size=size: self._forward(size))
                self.capture_order.append(size)

    def can_run(self, plan: SchedulerOutput) -> bool:
        """A decode-shaped step (one new token per sequence) that a captured size holds."""
        return len(plan.scheduled) <= self.sizes[-1] and all(s.num_new_tokens == 1 for s in plan.scheduled)

    def metadata(self, size: int) -> AttentionMetadata:
        """Attention metadata over the first `size` rows of the static buffers: decode only, one
        length group of full-width tables, its key mask computed on the device from the context
        lengths. Built from the buffers alone, so a graph may hold it."""
        rows = self.arange[:size]
        context_lens = self.context_lens[:size]
        tables = self.block_tables[:size]
        return AttentionMetadata(
            slot_mapping=self.slot_mapping[:size], positions=self.positions[:size], block_tables=tables,
            context_lens_tensor=context_lens, query_start_loc=self.arange[:size + 1], query_starts=tuple(range(size + 1)),
            last_token_indices=rows, query_lens=(1,) * size,
            context_lens=(self.max_model_len,) * size,  # unknown at capture: the bound the model checks
            block_size=self.block_size, prefill_seq_ids=(), decode_token_ids=rows,
            decode_groups=(DecodeGroup(None, tables, decode_key_mask(context_lens, tables.shape[1] * self.block_size)),),
            decode_only=True, attention_backend=self.attention_backend, padded=True,
        )

    def _forward(self, size: int) -> None:
        """What a graph holds: the model over the first `size` rows, into `outputs`."""
        hidden = self.model(self.input_ids[:size], self.positions[:size], self.kv_caches, self.metadata(size))
        self.outputs[:size].copy_(hidden)

    @torch.inference_mode()
    def stage(self, plan: SchedulerOutput) -> int:
        """Copy the step's rows into the front of the static buffers, padding rows after them up to
        the captured size, in one host-to-device copy; returns that size.

        The host packs (4, size) inputs and the (num_seqs, width) tables, width the step's longest
        table; table columns past it, and the padding rows' tables, keep what they held (valid block
        numbers): the triton kernel reads a row's blocks up to its context only, the torch path
        gathers the rest but masks it out.
        """
        num_seqs = len(plan.scheduled)
        size = padded_batch_size(num_seqs, self.sizes)
        pad = size - num_seqs
        input_ids, positions, slots, lens, tables = [], [], [], [], []
        block_size = self.block_size
        for s in plan.scheduled:
            table, position = s.block_ids[0], s.num_computed_tokens
            input_ids.extend(s.seq.get_token_ids_between(position, position + 1))
            positions.append(position)
            slots.append(table[position // block_size] * block_size + position % block_size)
            lens.append(position + 1)
            tables.append(table)
        width = min(max(len(t) for t in tables), self.max_num_blocks)  # a context needs no more
        inputs, block_tables = to_device(
            [[input_ids + [0] * pad, positions + [0] * pad, slots + [PAD_SLOT_ID] * pad, lens + [0] * pad],
             [list(t[:width]) + [0] * (width - len(t)) for t in tables]], self.device)
        self.inputs[:, :size].copy_(inputs)  # (4, size)
        self.block_tables[:num_seqs, :width].copy_(block_tables)  # (num_seqs, width)
        return size

    @torch.inference_mode()
    def run(self, plan: SchedulerOutput) -> torch.Tensor:
        """The step's final hidden states, (num_scheduled, hidden_size): stage, replay, the real rows."""
        size = self.stage(plan)
        self.graphs[size]()
        return self.outputs[:len(plan.scheduled)]
