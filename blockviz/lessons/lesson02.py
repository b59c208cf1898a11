"""Lesson 02 (lessons/02_logical_vs_physical.ipynb): a prefill's block table and `can_allocate`
(vLLM v0 `BlockSpaceManagerV1.can_allocate` / `allocate`; here engine.block_manager)."""

from __future__ import annotations

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import fresh

# Exercise 1's prompt: 30 tokens of the bundled model's tokenizer
EXERCISE_PROMPT = "First Citizen:\nBefore we proceed any further, hear me speak.\n\nAll:\nSpeak, speak."
OPTIONS = {"block_size": 4, "num_gpu_blocks": 16, "num_cpu_blocks": 0}


@exercise("02", "my_blocks", "every token printed above needs a slot, and a block has 4.",
          slips=[Slip(7, "where do the tokens of a partly filled last block go?")])
def check_blocks():
    """The blocks a fresh engine's prefill of the exercise's prompt allocates."""
    from engine.sequence import SamplingParams

    with fresh(OPTIONS) as viz:
        request_id = viz.add_request(EXERCISE_PROMPT, SamplingParams(max_tokens=4))
        viz.step()
        return len(viz.state.tables[viz.state.requests[request_id][0]])


@exercise("02", "my_status", "compare the free blocks left after admitting it with the watermark.",
          slips=[Slip(lambda: _status("OK"), "admitting it must leave at least the watermark free; the last free "
                                             "block is the watermark's."),
                 Slip(lambda: _status("NEVER"), "NEVER is for a prompt that could not fit even into an empty "
                                                "pool; this one needs 1 block of 10.")],
          praise="it fits the pool, but not while the watermark block is the last one free.")
def check_status():
    """`can_allocate` of a 4-token prompt on a bare manager of 10 blocks (watermark 10%) holding 9."""
    from engine.block_manager import BlockSpaceManager
    from engine.sequence import Sequence, SequenceGroup

    manager = BlockSpaceManager(block_size=4, num_gpu_blocks=10, num_cpu_blocks=0, watermark=0.1)

    def request(seq_id: int, num_tokens: int) -> SequenceGroup:
        return SequenceGroup(f"r{seq_id}", [Sequence(seq_id, list(range(num_tokens)), block_size=4)])

    manager.allocate(request(0, 36))
    return manager.can_allocate(request(1, 4))


def _status(name: str):
    from engine.block_manager import AllocStatus

    return AllocStatus[name]
