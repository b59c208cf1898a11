"""`blockviz generate`: run the engine with no UI; print each completion and a block summary."""

from __future__ import annotations

import json
import sys
import time

from blockviz.commands.options import add_engine_options
from blockviz.errors import UsageError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "generate", help="generate text with no UI; print completions and a block summary",
        description="Generate text with the paged-KV engine and print each completion, the block "
                    "tables each sequence ended with, the events by kind and the pools' use.")
    add_engine_options(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON document instead of text")


def execute(args) -> int:
    from blockviz.session.recorder import Recorder
    from blockviz.session.spec import one_line

    session = load_session(args)
    recorder = Recorder(session.header)
    start = time.perf_counter()
    try:  # every prompt is checked before any is queued
        request_ids = session.start()
    except ValueError as exc:
        raise UsageError(one_line(exc)) from None
    if args.n > 1 and args.temperature == 0:
        print(f"blockviz: note: --n {args.n} at temperature 0 is greedy, so the {args.n} completions are the "
              "same; --temperature 1.0 (vLLM's default) samples them, reproducibly for a --seed", file=sys.stderr)
    session.run_to_completion(on_events=recorder)
    summary = _summary(session.spec, session.header, session.num_steps, recorder, time.perf_counter() - start)
    requests = [_request(session.finished[request_id], recorder) for request_id in request_ids]
    if args.json:
        print(json.dumps({"requests": requests, "summary": summary}, indent=2))
    else:
        _print_text(requests, summary)
    return 0


def load_session(args):
    """An engine session over the options' spec (EngineSession: the engine loaded, nothing queued),
    or UsageError (one line) before or while loading."""
    from blockviz.session.engine_session import EngineSession
    from blockviz.session.spec import EngineSpec, one_line, quiet_model_loading

    spec = EngineSpec.from_args(args)
    spec.check_all()
    quiet_model_loading()
    if sys.stderr.isatty() and not args.json:
        print(f"loading {spec.model} ...", file=sys.stderr, flush=True)
    try:
        return EngineSession(spec)
    except (OSError, ValueError) as exc:
        raise UsageError(one_line(exc)) from None


def _summary(spec, header: dict, num_steps: int, recorder, elapsed: float) -> dict:
    state = recorder.state
    return {
        "model": spec.model, "device": header["device"], "dtype": header["dtype"],
        "block_size": header["block_size"], "num_gpu_blocks": header["num_gpu_blocks"],
        "num_cpu_blocks": header["num_cpu_blocks"], "block_bytes": header["block_bytes"],
        "budget_source": header["budget_source"], "prefix_caching": header["enable_prefix_caching"],
        "steps": num_steps, "tokens_generated": state.num_tokens_generated,
        "seconds": round(elapsed, 3),
        "events": dict(sorted(state.counts.items())),
        "gpu_blocks": {"used": state.num_used("gpu"), "free": state.num_free("gpu"),
                       "cached": sum(b.state == "cached" for b in state.pools["gpu"]),
                       "peak_used": recorder.peak_used},
        "cpu_blocks": {"used": state.num_used("cpu"), "free": state.num_free("cpu")},
        "preemptions": state.num_preemptions,
        "prefix_hit_rate": round(state.prefix_hit_rate(), 4),
    }


def _request(output, recorder) -> dict:
    seq_ids = recorder.state.requests.get(output.request_id, ())
    return {
        "request_id": output.request_id, "prompt": output.prompt,
        "num_prompt_tokens": len(output.prompt_token_ids), "num_cached_tokens": output.num_cached_tokens,
        "completions": [
            {"index": c.index, "text": c.text, "token_ids": c.token_ids,
             "finish_reason": c.finish_reason, "finish_detail": c.finish_detail,
             "block_table": [b for _, b in recorder.final_tables.get(seq_id, [])]}
            for c, seq_id in zip(output.outputs, seq_ids)
        ],
    }


def _print_text(requests: list[dict], summary: dict) -> None:
    from rich.console import Console
    from rich.markup import escape

    from blockviz.model.safe_text import safe_line, safe_text

    console = Console(highlight=False, soft_wrap=True)
    for request in requests:
        cached = f", {request['num_cached_tokens']} from the prefix cache" if request["num_cached_tokens"] else ""
        console.print(f"[bold]request {request['request_id']}[/] "
                      f"({request['num_prompt_tokens']} prompt tokens{cached})")
        for completion in request["completions"]:
            reason = completion["finish_reason"] + (f": {completion['finish_detail']}" if completion["finish_detail"] else "")
            # the prompt and the completion are data: their control characters are written visibly (safe_text.py)
            console.print(f"[cyan]{escape(safe_text(request['prompt'] or ''))}[/]{escape(safe_text(completion['text']))}")
            console.print(f"  [dim]finished ({escape(safe_line(reason))}); block table {completion['block_table']}[/]")
        console.print()
    s = summary
    console.print(f"[bold]summary[/] {s['model']} on {s['device']}/{s['dtype']}: block size {s['block_size']}, "
                  f"{s['num_gpu_blocks']} device blocks ({s['budget_source']}), {s['num_cpu_blocks']} swap blocks, "
                  f"{s['block_bytes']:,} bytes per block")
    console.print(f"  {s['steps']} steps, {s['tokens_generated']} tokens in {s['seconds']:.2f} s; "
                  f"peak {s['gpu_blocks']['peak_used']} device blocks in use; {s['preemptions']} preemptions"
                  + (f"; prefix-cache hit rate {s['prefix_hit_rate']:.0%}" if s["prefix_caching"] else ""))
    g, c = s["gpu_blocks"], s["cpu_blocks"]
    console.print(f"  device blocks now: {g['used']} used, {g['free']} free ({g['cached']} of them cached); "
                  f"swap blocks: {c['used']} used, {c['free']} free")
    console.print("  events: " + ", ".join(f"{kind} {count}" for kind, count in s["events"].items()))
