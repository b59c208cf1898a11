"""Lesson 06 (lessons/06_preemption_swap_recompute.ipynb): a swap-out's blocks (vLLM v0
`Scheduler._preempt_by_swap`, `BlockSpaceManagerV1.swap_out`)."""

from __future__ import annotations

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import events_of, fresh

PROMPTS = ["Now is the winter of our discontent", "ROMEO: What light through yonder window breaks?"]


def run_options(mode: str) -> dict:
    return {"block_size": 4, "num_gpu_blocks": 10, "num_cpu_blocks": 8, "preemption_mode": mode}


@exercise("06", "my_blocks", "every block of the preempted request's table moves, full or not: how many "
                             "blocks do its tokens with a slot take?",
          slips=[Slip(4, "does a partly filled last block stay behind?"),
                 Slip(10, "only the preempted request's blocks move, not the whole pool.")])
def check_blocks():
    """The blocks the swap run's single swap-out moved to the CPU pool."""
    from engine import events as ev
    from engine.sequence import SamplingParams

    with fresh(run_options("swap"), prompts=PROMPTS,
               sampling_params=SamplingParams(max_tokens=20, ignore_eos=True)) as viz:
        viz.run_to_completion()
        return len(events_of(viz, ev.SwappedOut)[0].mapping)
