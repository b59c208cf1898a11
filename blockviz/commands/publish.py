"""`blockviz publish TRACE|--live [engine options] --endpoint tcp://127.0.0.1:5557 [--replay ...]`:
blockviz's engine as a vLLM-compatible KV-event publisher.

The frames are vLLM's (blockviz/kvevents/publisher.py) in the wire format of the newest vLLM
release blockviz knows, or of the one `--vllm-version` names, so a consumer built on that
release's records (vLLM's `KVEventBatch` decoder, a router's KV-aware index), its example
subscriber, or `blockviz attach` can consume them. A TRACE (a file or
a shipped trace's name) needs no model and no torch; `--live` runs the engine on `blockviz run`'s
scenario (or the --prompt given). What maps to what: blockviz/kvevents/mapping.py.
"""

from __future__ import annotations

from blockviz.commands.options import add_engine_options, non_negative, non_negative_number
from blockviz.errors import UsageError

DEFAULT_ENDPOINT = "tcp://127.0.0.1:5557"


def add_parser(subparsers) -> None:
    from blockviz.commands.run import RUN_DEFAULTS
    from blockviz.model.trace import shipped_traces

    parser = subparsers.add_parser(
        "publish", help="publish a trace or a live engine as vLLM KV-cache events over ZMQ",
        description="Publish blockviz's prefix-cache events as vLLM v1 does (ZMQ PUB, msgpack "
                    "EventBatch, replay ROUTER). Shipped traces: " + (", ".join(shipped_traces()) or "none"))
    parser.add_argument("trace", nargs="?", metavar="TRACE", help="a trace file, or the name of a shipped trace")
    parser.add_argument("--live", action="store_true", help="run the engine instead (the engine options apply)")
    parser.add_argument("--endpoint", default=DEFAULT_ENDPOINT,
                        help=f"where to bind the PUB socket (default {DEFAULT_ENDPOINT}; tcp://*:5557 for every interface)")
    parser.add_argument("--replay", metavar="ENDPOINT", help="where to bind the replay ROUTER, e.g. tcp://127.0.0.1:5558")
    parser.add_argument("--topic", default="kv-events", help="the topic frame (default kv-events)")
    parser.add_argument("--vllm-version", metavar="VERSION", default=_newest(),
                        help=f"write what this vLLM release sends (default {_newest()}, the newest blockviz knows): "
                             "0.26 and later put the topic in replay answers, 0.24 and 0.25 do not, 0.23 and "
                             "earlier also write events as tagged arrays")
    parser.add_argument("--array-shape", action="store_true", help="the same as --vllm-version 0.23")
    parser.add_argument("--rate", type=non_negative_number("--rate"), default=10.0, metavar="BATCHES_PER_S",
                        help="at most this many batches a second, so a person can watch (default 10; 0: no limit)")
    parser.add_argument("--wait-for-subscribers", type=non_negative("--wait-for-subscribers"), default=1, metavar="N",
                        help="publish once N subscribers are connected (default 1; 0: start at once)")
    parser.add_argument("--exit-when-done", action="store_true",
                        help="exit once everything is published (default with --replay: keep answering "
                             "replay requests until Ctrl-C, so late subscribers can catch up)")
    add_engine_options(parser, **RUN_DEFAULTS)


def _newest() -> str:
    from blockviz.kvevents.protocol import NEWEST_RELEASE

    return ".".join(map(str, NEWEST_RELEASE))


def execute(args) -> int:
    from blockviz.kvevents.endpoints import check_endpoint
    from blockviz.kvevents.protocol import wire_format_for
    from blockviz.kvevents.publishing import Progress

    if (args.trace is None) == (not args.live):
        raise UsageError("give a TRACE to publish or --live, not both" if args.live else "give a TRACE to publish, or --live")
    try:
        check_endpoint(args.endpoint, "--endpoint")
        if args.replay is not None:
            check_endpoint(args.replay, "--replay")
        args.wire = wire_format_for("0.23" if args.array_shape else args.vllm_version)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    batches = _live_batches(args) if args.live else _trace_batches(args.trace)
    publisher = _bind(args)
    progress = Progress()
    try:
        return _publish(args, publisher, batches, progress)
    finally:
        publisher.close()


def _trace_batches(name: str):
    from blockviz.kvevents.mapping import step_batches
    from blockviz.model.design import kv_cache_groups_of
    from blockviz.model.trace import TraceError, load_trace

    try:
        trace = load_trace(name)
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    return list(step_batches(trace.events, trace.block_size, trace.header.get("kv_manager"),
                             kv_cache_groups_of(trace.header)))


def _live_batches(args):
    """The live engine's batches (a generator: the engine starts when the first is asked for);
    everything that can be known wrong is checked now, as `blockviz run` checks it."""
    from blockviz.session.scenario import DEFAULT_SCENARIO
    from blockviz.kvevents.publishing import live_batches
    from blockviz.session.spec import EngineSpec, quiet_model_loading

    spec = EngineSpec.from_args(args, default_arrivals=DEFAULT_SCENARIO)
    spec.check_all()
    if not spec.config.enable_prefix_caching:
        raise UsageError("--no-prefix-caching: without a prefix cache there are no KV-cache events to publish")
    quiet_model_loading()
    return live_batches(spec)


def _bind(args):
    import zmq

    from blockviz.kvevents.publisher import KVEventPublisher

    try:
        return KVEventPublisher(args.endpoint, args.replay, topic=args.topic, wire=args.wire)
    except zmq.ZMQError as exc:
        raise UsageError(f"cannot bind {args.endpoint}{' or ' + args.replay if args.replay else ''}: {exc}") from None


def _publish(args, publisher, batches, progress) -> int:
    from blockviz.kvevents.publishing import publish_batches, serve_forever

    where = args.endpoint + (f" (replay {args.replay})" if args.replay else "")
    if args.wait_for_subscribers:
        progress.say(f"waiting for {args.wait_for_subscribers} subscriber(s) on {where}, topic {args.topic!r}")
        publisher.wait_for_subscribers(args.wait_for_subscribers)
    progress.say(f"publishing on {where} in the wire format of {args.wire.releases}")
    try:
        publish_batches(publisher, batches, rate=args.rate, progress=progress)
        if args.exit_when_done or args.replay is None:
            return 0  # without a replay socket there is nothing left to serve
        progress.say(f"done; answering replay requests on {args.replay} until Ctrl-C")
        serve_forever(publisher, progress)
    except KeyboardInterrupt:
        progress.show(publisher, final=True)
    return 0
