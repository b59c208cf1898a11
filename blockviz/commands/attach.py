"""`blockviz attach tcp://HOST:5557 [--replay tcp://HOST:5558] [--topic kv-events] [--tokenizer NAME]`:
watch a running vLLM's prefix cache through its KV-cache events.

Start vLLM with `--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq",
"endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558", "topic": "kv-events"}'` (or run
`blockviz publish`). No torch: the tokenizer, when given, loads through `tokenizers`.
"""

from __future__ import annotations

from blockviz.commands.options import positive
from blockviz.errors import UsageError


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "attach", help="watch a running vLLM's KV-cache events (or `blockviz publish`'s)",
        description="Subscribe to vLLM v1's KV-cache events over ZMQ and draw what they say: the "
                    "hash-chain forest, stores and removals over time, cache size and churn per "
                    "data-parallel rank, and sequence gaps. Physical blocks, block tables and ref "
                    "counts are not sent by vLLM and are shown as such.")
    parser.add_argument("endpoint", metavar="ENDPOINT", help="the PUB endpoint, e.g. tcp://HOST:5557")
    parser.add_argument("--replay", metavar="ENDPOINT",
                        help="the replay ROUTER, e.g. tcp://HOST:5558: missed batches are asked for there")
    parser.add_argument("--topic", default="kv-events", help="the topic to subscribe to (default kv-events)")
    parser.add_argument("--tokenizer", metavar="NAME_OR_PATH",
                        help="show token text: the served model's name, a checkpoint directory, a "
                             "tokenizer.json, or tiny-shakespeare (default: token ids)")
    parser.add_argument("--data-parallel-size", type=positive("--data-parallel-size"), default=1, metavar="N",
                        help="follow N ranks: rank r publishes on the endpoint's port + r (default 1)")


def execute(args) -> int:
    from blockviz.kvevents.endpoints import check_endpoint

    try:
        check_endpoint(args.endpoint, "ENDPOINT", ranks=args.data_parallel_size)
        if args.replay is not None:
            check_endpoint(args.replay, "--replay", ranks=args.data_parallel_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    _check_connect(args)
    tokens = None
    if args.tokenizer:
        from blockviz.kvevents.tokens import load_tokenizer

        try:
            tokens = load_tokenizer(args.tokenizer)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    from blockviz.tui.attach_app import AttachApp

    app = AttachApp(args.endpoint, args.replay, topic=args.topic, data_parallel_size=args.data_parallel_size,
                    tokens=tokens)
    app.run()
    return app.return_code or 0


def _check_connect(args) -> None:
    """ZMQ refuses some endpoints only when connecting (an unknown interface, a bad host): try
    now, so that is one line too, not an error inside the app."""
    import zmq

    from blockviz.kvevents.subscriber import KVEventClient

    try:
        KVEventClient(args.endpoint, args.replay, topic=args.topic,
                      data_parallel_size=args.data_parallel_size).close()
    except zmq.ZMQError as exc:
        raise UsageError(f"cannot connect to {args.endpoint}: {exc}") from None
