"""Lesson 03 (lessons/03_decode_append_slots.ipynb): a new block when the last one fills (vLLM v0
`BlockSpaceManagerV1.append_slot`, `append_slots` here)."""

from __future__ import annotations

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import fresh


@exercise("03", "my_step", "a new block opens when a token finds the last block full: which token is the "
                           "first to need block 5, and which decode step gives it its slot?",
          slips=[Slip(6, "decode step 6 gives a slot to token 16: is there a block 5 yet, and which "
                         "token needs it first?"),
                 Slip(10, "the prompt's 10 tokens got their slots in the prefill: count from token 11.")])
def check_step():
    """The decode step (prefill = step 0) in which a 10-token prompt's fifth 4-token block appears."""
    from engine.sequence import SamplingParams

    with fresh({"block_size": 4, "num_gpu_blocks": 16, "num_cpu_blocks": 0},
               prompts="Now is the winter of our discontent",
               sampling_params=SamplingParams(max_tokens=12, ignore_eos=True)) as viz:
        viz.step()  # the prefill
        decode_step = 0
        while len(viz.state.tables[0]) < 5:
            viz.step()
            decode_step += 1
        return decode_step
