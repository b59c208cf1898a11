"""Lesson 04 (lessons/04_fork_copy_on_write.ipynb): fork shares blocks (vLLM v0
`BlockSpaceManagerV1.fork`)."""

from __future__ import annotations

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import fresh


@exercise("04", "my_ref_count", "count every block table that points at it once the fork by hand is done.",
          slips=[Slip(2, "the two branches of n=2 hold it: what did the fork by hand add?"),
                 Slip(1, "a fork copies the block table, not the blocks: the child points at the same block.")])
def check_ref_count():
    """The ref count of sequence 0's first block after the n=2 run's copy-on-write step and a fork of seq 0."""
    from engine.sequence import SamplingParams

    with fresh({"block_size": 4, "num_gpu_blocks": 16, "num_cpu_blocks": 0},
               prompts="Now is the winter of our discontent",
               sampling_params=SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=8)) as viz:
        viz.step()  # the prefill, which forks the second branch
        viz.step()  # the first decode: copy on write
        viz.fork(0)
        return viz.state.pools["gpu"][viz.state.table_blocks(0)[0]].ref_count
