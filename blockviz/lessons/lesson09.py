"""Lesson 09 (lessons/09_asking_the_engine.ipynb): the explainer's verdict, the preemption ledger,
memory truth, block sizes compared and a breakpoint at the fork; each on a fresh engine."""

from __future__ import annotations

from functools import cache

from blockviz.lessons.checks import Slip, exercise
from blockviz.lessons.engines import fresh

OPENING, TURN1, TURN2, TURN3 = ("JULIET:", "Who is already sick and pale with grief,",
                                "Arise, fair sun, and kill the envious moon,",
                                "ROMEO: But soft, what light through yonder window breaks?")
PREEMPT_PROMPTS = ["Now is the winter of our discontent", "ROMEO: What light through yonder window breaks?"]
MEMORY_PROMPTS = ["ROMEO:", "Now is the winter of our discontent", "HAMLET: To be, or not to be, that is the question"]
MEMORY_MAX_TOKENS = (40, 24, 12)


@exercise("09", "my_verdict", "a block's hash covers its own tokens and the hash of the block before it. Turn 2's "
                              "tokens are cached, but after turn 1.",
          slips=[Slip("different tokens", "the opening and turn 2 are the same words, token for token; what differs "
                                          "is what came before turn 2."),
                 Slip("evicted", "the pool has 32 blocks and nothing was evicted.")],
          praise="the cache holds prefixes, not pieces of text; everything after the dropped turn misses.")
def check_verdict():
    """The first miss's verdict for the conversation with turn 1 dropped."""
    from blockviz.model.explain import explain_requests
    from engine.sequence import SamplingParams

    with fresh({"block_size": 4, "num_gpu_blocks": 32, "num_cpu_blocks": 0, "enable_prefix_caching": True}) as chat:
        encode = chat.llm.engine.encode

        def conversation(*lines):
            return {"prompt_token_ids": [t for line in lines for t in encode(line)]}

        params = SamplingParams(max_tokens=2)
        chat.add_request(conversation(OPENING, TURN1, TURN2), params)
        chat.run_to_completion()
        trimmed = chat.add_request(conversation(OPENING, TURN2, TURN3), params)
        chat.step()
        lookups = {x.request_id: x for x in explain_requests(chat.events, 4, 32, 0)}
        return lookups[trimmed].first_miss.verdict


@exercise("09", "my_lost", "recompute frees every block of the victim, prompt included; only the token it sampled "
                           "last had no K/V yet.",
          slips=[Slip(12, "its generated tokens' K/V are freed too, not only the prompt's."),
                 Slip(19, "did the token it sampled last have K/V to lose?")])
def check_lost():
    """Tokens lost by the first recompute preemption of the lesson's two requests."""
    from engine.sequence import SamplingParams

    with fresh({"block_size": 4, "num_gpu_blocks": 10, "num_cpu_blocks": 8, "preemption_mode": "recompute"},
               prompts=PREEMPT_PROMPTS, sampling_params=SamplingParams(max_tokens=20, ignore_eos=True)) as viz:
        viz.run_to_completion()
        return viz.insight.ledger()[0].tokens_lost


@cache
def _memory_truth():
    from blockviz.model.insights import max_tokens_of, memory_truth
    from engine.sequence import SamplingParams

    with fresh({"block_size": 4, "num_gpu_blocks": 32, "num_cpu_blocks": 0}, prompts=MEMORY_PROMPTS,
               sampling_params=[SamplingParams(max_tokens=m, ignore_eos=True) for m in MEMORY_MAX_TOKENS]) as viz:
        for _ in range(6):
            viz.step()
        return memory_truth(viz.state, max_tokens_of(viz.events))


@exercise("09", "my_empty", "a sequence with t tokens in blocks of 4 leaves 4 * ceil(t / 4) - t slots empty.",
          slips=[Slip(lambda: sum(s.num_tokens % 4 for s in _memory_truth().seqs.values()),
                      "t % 4 counts the tokens in the last block: how many of its slots are empty?")])
def check_empty():
    """Empty slots in the last blocks of the three sequences after 6 steps."""
    return _memory_truth().internal_fragmentation


@exercise("09", "my_most_blocks", "a block holds block_size tokens, so the same tokens need more of the smaller blocks.",
          slips=[Slip(16, "big blocks leave more empty slots, but the same tokens need fewer of them.")],
          praise="more, smaller blocks, but fewer empty slots in each last block.")
def check_most_blocks():
    """Of block sizes 4, 8 and 16, the one using the most blocks at its peak on the memory workload."""
    from engine.sequence import SamplingParams

    peaks = {}
    for block_size in (4, 8, 16):
        with fresh({"block_size": block_size, "num_gpu_blocks": 64, "num_cpu_blocks": 0}, prompts=MEMORY_PROMPTS,
                   sampling_params=SamplingParams(max_tokens=24)) as viz:
            peak = 0
            while viz.step() is not None:
                peak = max(peak, viz.state.num_used("gpu"))
            peaks[block_size] = peak
    return max(peaks, key=peaks.get)


@exercise("09", "my_ref_count", "right after a fork the child shares every block of its parent.",
          slips=[Slip(1, "a fork copies the block table, not the block: both branches point at it."),
                 Slip(3, "how many sequences does n=2 make, the parent included?")])
def check_ref_count():
    """The ref count, just after the fork, of the block the first copy-on-write copies."""
    from engine import events as ev
    from engine.sequence import SamplingParams

    with fresh({"block_size": 4, "num_gpu_blocks": 16, "num_cpu_blocks": 0},
               prompts="Now is the winter of our discontent",
               sampling_params=SamplingParams(n=2, temperature=1.0, seed=0, max_tokens=8)) as cow:
        copied = cow.run_until(ev.CopyOnWrite.type)
        cow.back_to(ev.Forked.type)
        return cow.state.pools["gpu"][copied.src_block].ref_count
