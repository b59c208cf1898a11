"""Fuzz the traces the engine records: random engine configurations under the `v1` and `vllm`
designs (tiny-hybrid's two KV-cache groups, chunked prefill under small token budgets, pools small
enough to preempt, n > 1, prefix caching on and off, aborts mid-run), each run to completion.

For each configuration: after every step a reducer fed only the engine's events holds the engine's
own picture (engine/v1's manager: blockviz.model.reducer.check_reducer_matches_v1; vLLM's:
`check_reducer_matches_vllm` here); each sequence's lifecycle events come once (one
sequence_finished, one sequence_freed per table it held); and the trace written from the events is
read back through the trace checker (blockviz/model/trace.py's read_trace), as replay, export and
the notebook read it.

    python3 scripts/fuzz_traces.py --runs 200 --seed 0

prints one line per failing configuration (its seed, its settings, the first failure) and a last
line `configurations: N, failures: F`. tests/test_hostile_round3.py runs a few seeds of the same
`fuzz_one`.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
for path in (ROOT, ROOT / "tests"):  # the project, and the reducer-vs-engine checks the tests use
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

OPENING = "To be, or not to be, that is the question: "
PROMPTS = ("whether tis nobler in the mind", "to suffer the slings", "and arrows of outrageous fortune",
           "or to take arms", "against a sea of troubles", "and by opposing end them")


@dataclass(slots=True)
class FuzzConfig:
    """One drawn configuration: the engine's settings and the requests."""

    seed: int
    kv_manager: str
    block_size: int
    num_gpu_blocks: int
    max_num_seqs: int
    max_num_batched_tokens: int | None
    enable_prefix_caching: bool
    prompts: list[str]
    n: int
    max_tokens: int
    abort_at_step: int | None = None
    extra: dict = field(default_factory=dict)


def draw(seed: int) -> FuzzConfig:
    """A configuration drawn from `seed` alone (the same one on every machine)."""
    rng = random.Random(seed)
    kv_manager = rng.choice(("v1", "vllm"))
    block_size = rng.choice((2, 4, 8))
    num_prompts = rng.randint(1, 4)
    prompts = [(OPENING if rng.random() < 0.5 else "") + rng.choice(PROMPTS) for _ in range(num_prompts)]
    max_tokens = rng.randint(4, 48)
    n = rng.choice((1, 1, 2))
    max_num_seqs = rng.choice((2, 4, 8))
    budget = rng.choice((None, 8, 16, 32))
    if budget is not None:
        budget = max(budget, max_num_seqs)
    # pools from "too small for the longest request" (refused) through "preempting" to "everything fits"
    longest = 24 + max_tokens  # a rough token count of the longest request
    blocks_per_group = rng.randint(3, 2 * longest // block_size + 4)
    return FuzzConfig(seed=seed, kv_manager=kv_manager, block_size=block_size,
                      num_gpu_blocks=2 * blocks_per_group + 1, max_num_seqs=max_num_seqs,
                      max_num_batched_tokens=budget, enable_prefix_caching=rng.random() < 0.8,
                      prompts=prompts, n=n, max_tokens=max_tokens,
                      abort_at_step=rng.choice((None, None, None, rng.randint(1, 30))))


def check_reducer_matches_vllm(reducer, scheduler) -> None:
    """A reducer fed only the event tap's events holds vLLM's manager's picture: each group's tables
    (vLLM's req_to_blocks, a request holding none left out), the ref counts and the free queue."""
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    for group, single in enumerate(manager.coordinator.single_type_managers):
        tables = {int(r): [("gpu", b.block_id) for b in blocks] for r, blocks in single.req_to_blocks.items() if blocks}
        assert reducer.tables_of(group) == tables, f"group {group}'s tables differ from vLLM's"
    assert [b.ref_count for b in reducer.pools["gpu"][1:]] == [b.ref_cnt for b in pool.blocks[1:]], "ref counts differ"
    assert reducer.free_queue == [b.block_id for b in pool.free_block_queue.get_all_free_blocks()], "free queue differs"


def check_lifecycle(events) -> None:
    """Each sequence finishes once and is freed at most once per finish or preemption."""
    from engine import events as ev

    finished = Counter(e.seq_id for e in events if isinstance(e, ev.SequenceFinished))
    twice = [seq_id for seq_id, count in finished.items() if count > 1]
    assert not twice, f"sequence_finished twice for seq {twice[0]}"
    freed = Counter(e.seq_id for e in events if isinstance(e, ev.SequenceFreed))
    preempted = Counter(seq_id for e in events if isinstance(e, ev.Preempted) for seq_id in e.seq_ids)
    for seq_id, count in freed.items():
        assert count <= preempted[seq_id] + 1, f"seq {seq_id} freed {count} times, preempted {preempted[seq_id]}"


_LOADED: dict[str, tuple[str, object]] = {}


def tiny_hybrid():
    """tiny-hybrid's checkpoint directory and its loaded model (loaded once per process)."""
    if "tiny-hybrid" not in _LOADED:
        import torch

        from blockviz.session.tiny_hybrid import tiny_hybrid_checkpoint
        from engine.model_loader import load_model

        path = str(tiny_hybrid_checkpoint())
        _LOADED["tiny-hybrid"] = (path, load_model(path, "cpu", torch.float32))
    return _LOADED["tiny-hybrid"]


def fuzz_one(config: FuzzConfig, out_dir: Path) -> Counter:
    """Run `config` to completion with every check; raise AssertionError (or the checker's
    TraceError) at the first failure. Returns what the run did: steps, preemptions, chunked prefill
    steps (a prompt computed over several steps), blocks a window let go, aborts, refusals."""
    from blockviz.model.reducer import ReducerState
    from blockviz.model.safe_text import safe_struct
    from reducer_checks import check_reducer_matches_v1
    from blockviz.model.trace import make_header, read_trace, write_trace
    from blockviz.session.engine_session import trace_header
    from engine import SamplingParams
    from engine import events as ev
    from engine.config import EngineConfig
    from engine.designs import VLLM
    from engine.llm_engine import LLMEngine

    path, loaded = tiny_hybrid()
    options = {"max_num_batched_tokens": config.max_num_batched_tokens} if config.max_num_batched_tokens else {}
    engine = LLMEngine(EngineConfig(model=path, device="cpu", kv_manager=config.kv_manager,
                                    block_size=config.block_size, num_gpu_blocks=config.num_gpu_blocks,
                                    max_num_seqs=config.max_num_seqs, seed=config.seed,
                                    enable_prefix_caching=config.enable_prefix_caching, **options),
                       loaded=loaded)
    header = make_header(trace_header(engine), title=f"fuzz {config.seed}")
    reducer = ReducerState.from_header(header)
    events: list = []
    # the events made safe to draw as EngineSession makes them (safe_text.py), as the trace holds them
    engine.events.subscribe(lambda event: events.append(safe_struct(event)))
    engine.events.subscribe(lambda event: reducer.apply(events[-1]))
    if engine.design is VLLM:
        check = lambda: check_reducer_matches_vllm(reducer, engine.scheduler.vllm)  # noqa: E731
    else:
        check = lambda: check_reducer_matches_v1(reducer, engine.kv_manager)  # noqa: E731
    params = SamplingParams(max_tokens=config.max_tokens, n=config.n, ignore_eos=True,
                            temperature=0.0 if config.n == 1 else 1.0)
    request_ids = [engine.add_request(prompt, params) for prompt in config.prompts]
    steps = 0
    while engine.has_unfinished_requests():
        if steps == config.abort_at_step:
            for request_id in request_ids[::2]:
                if engine.is_unfinished(request_id):
                    engine.abort_request(request_id)
        engine.step()
        steps += 1
        check()
        assert steps < 5_000, "the run did not finish in 5,000 steps"
    assert not engine.events.errors, engine.events.errors
    check_lifecycle(events)
    out = out_dir / f"fuzz-{config.seed}.jsonl"
    write_trace(out, header, events)
    trace = read_trace(out)
    assert ReducerState.from_header(trace.header).apply_all(trace.events).freeze() == reducer.freeze(), (
        "the trace read back replays to another state")
    out.unlink()
    done = Counter(steps=steps)
    for e in events:
        done["preemptions"] += isinstance(e, ev.Preempted)
        done["skipped_blocks"] += len(e.blocks) if isinstance(e, ev.BlocksSkipped) else 0
        done["aborts"] += isinstance(e, ev.SequenceFinished) and e.reason == "abort"
        done["refusals"] += isinstance(e, ev.SequenceFinished) and e.reason == "ignored"
        if isinstance(e, ev.TokensScheduled):
            done["chunked_prefills"] += sum(done_ > 0 and new > 1 for done_, new in zip(e.num_computed_tokens,
                                                                                      e.num_new_tokens))
    return done


def run(seeds, say=print) -> tuple[int, list[tuple[FuzzConfig, str]], Counter]:
    """Fuzz each seed's configuration; returns (configurations run, failures, runs that did each thing)."""
    failures: list[tuple[FuzzConfig, str]] = []
    count = 0
    covered: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            config = draw(seed)
            count += 1
            try:
                covered.update({what for what, number in fuzz_one(config, Path(tmp)).items() if number})
            except Exception as exc:  # every failure is a finding: report it and go on
                text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                failures.append((config, text))
                say(f"FAIL seed {seed}: {text} | {asdict(config)}")
    return count, failures, covered


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="configurations to run")
    parser.add_argument("--seed", type=int, default=0, help="the first configuration's seed")
    parser.add_argument("--minutes", type=float, default=None, help="stop starting new runs after this long")
    args = parser.parse_args(argv)
    start = time.monotonic()

    def seeds():
        for seed in range(args.seed, args.seed + args.runs):
            if args.minutes is not None and time.monotonic() - start > 60 * args.minutes:
                return
            yield seed

    import logging

    logging.disable(logging.WARNING)
    count, failures, covered = run(seeds())
    designs = Counter(draw(seed).kv_manager for seed in range(args.seed, args.seed + count))
    print(f"configurations: {count} ({', '.join(f'{k} {v}' for k, v in sorted(designs.items()))}), "
          f"failures: {len(failures)}, {time.monotonic() - start:.0f} s")
    print("runs with " + ", ".join(f"{what} {number}" for what, number in sorted(covered.items()) if what != "steps"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
