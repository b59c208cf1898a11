"""`blockviz explain --prompt A --prompt B [...] [engine options]`: why each prompt's prefix lookup
hit or missed. The prompts run through the real engine one after another (each to completion, so
a later one meets what the earlier ones left in the cache, or `--together` in one batch), with
prefix caching on; then each request's chain is printed block by block (blockviz/model/explain.py).
"""

from __future__ import annotations

import json
import sys

from blockviz.commands.options import add_engine_options
from blockviz.model.design import kv_cache_groups_of, kv_manager_of
from blockviz.errors import UsageError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "explain", help="why each prompt's prefix-cache lookup hit or missed",
        description="Run the prompts through the engine in order and print, for each request, its "
                    "chain of blocks against the prefix cache as it was when the request was allocated: "
                    "the hits, and why the first miss missed (different tokens, different parent, "
                    "evicted, last prompt block, partial block).")
    add_engine_options(parser, enable_prefix_caching=True, max_tokens=8)
    parser.add_argument("--together", action="store_true",
                        help="submit every prompt at once (one prefill step) instead of one after another")
    parser.add_argument("--json", action="store_true", help="print JSON instead of text")


def execute(args) -> int:
    from blockviz.commands.generate import load_session
    from blockviz.model.explain import explain_requests
    from blockviz.session.spec import one_line

    if not args.prompts:
        raise UsageError("give the prompts to compare: --prompt A --prompt B ...")
    session = load_session(args)
    events: list = []
    try:
        session.check_requests()
    except ValueError as exc:
        raise UsageError(one_line(exc)) from None
    batches = [session.spec.prompts] if args.together else [[prompt] for prompt in session.spec.prompts]
    for batch in batches:  # each batch to completion: a later one meets what the earlier left cached
        for prompt in batch:
            session.add_request(prompt)
        session.run_to_completion(on_events=events.extend)
    header = session.header
    explanations = explain_requests(events, header["block_size"], header["num_gpu_blocks"],
                                    header["num_cpu_blocks"], header["enable_prefix_caching"],
                                    kv_manager_of(header), header.get("prefix_caching_hash_algo") or "sha256",
                                    kv_cache_groups_of(header))
    if args.json:
        print(json.dumps([{
            "request_id": x.request_id, "seq_id": x.seq_id, "num_prompt_tokens": x.num_prompt_tokens,
            "num_hit_blocks": x.num_hit_blocks, "num_hit_tokens": x.num_hit_tokens,
            "blocks": [{"index": b.index, "num_tokens": len(b.token_ids), "block_hash": b.block_hash,
                        "verdict": b.verdict, "block": b.block, "evicted_by": b.evicted_by,
                        **({"detail": b.detail} if b.detail else {}),
                        **({"freed_by": b.freed_by} if b.freed_by is not None else {})} for b in x.blocks],
        } for x in explanations], indent=2))
    else:
        for explanation in explanations:
            print("\n".join(explanation.lines()), file=sys.stdout)
    return 0
