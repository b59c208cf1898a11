"""`blockviz run [engine options] [--projector]`: the live TUI on the real engine.

The model is checked before the app opens (a model that cannot be found is one line and exit 2);
loading it happens in the app's engine worker, behind a loading screen.
"""

from __future__ import annotations

import sys

from blockviz.commands.options import add_break_on_option, add_engine_options, add_guided_option, add_keep_events_option
from blockviz.errors import UsageError
from blockviz.session.scenario import DEFAULT_SCENARIO_OPTIONS

RUN_DEFAULTS = {**DEFAULT_SCENARIO_OPTIONS,
                "prompts_help": "a built-in scenario of four requests arriving over time"}


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser(
        "run", help="open the live TUI on the engine",
        description="Run the engine live in a TUI: step it, play it, fork and swap out sequences, "
                    "and travel back through its events.")
    # A pool a learner can take in at a glance (the engine really has this many blocks) and the
    # default scenario's settings; generate sizes the pool from the memory budget, as vLLM does.
    add_engine_options(parser, **RUN_DEFAULTS)
    parser.add_argument("--projector", action="store_true", help="big cells, high contrast, fewer panels")
    add_break_on_option(parser)
    add_guided_option(parser, "default: on for the story, off with --prompt")
    add_keep_events_option(parser)
    parser.add_argument("--ui-priority", choices=("idle", "normal"), default="idle",
                        help="idle (default, Linux): the UI runs only on CPU time nothing else wants, so "
                             "it does not pre-empt the engine; normal: the UI is scheduled like any process")


def check(args, *, device: bool = True):
    """Everything that can be known wrong before the app opens, raised as a one-line UsageError
    (EngineSpec.check_all; device=False leaves out the CUDA check, which imports torch). Returns
    the EngineSpec. `blockviz serve run` calls it too."""
    from blockviz.session.spec import EngineSpec

    if getattr(args, "n_given", False) and not args.prompts:
        raise UsageError(f"--n {args.n} applies to --prompt requests: the story's requests set their own "
                         "(give --prompt TEXT, or leave out --n)")
    spec = EngineSpec.for_story_args(args)  # the story of --kv-manager's design
    spec.check_all(device=device)
    return spec


def execute(args) -> int:
    from blockviz.session.engine_process import ProcessBridge

    spec = check(args)
    from blockviz.tui.app import BlockvizApp

    # The engine process loads the model while the app draws its loading screen; once the engine
    # is ready, an idle UI leaves the cores to it (the engine process keeps the normal policy).
    bridge = ProcessBridge(spec, leave_cores_once_ready=args.ui_priority == "idle")
    bridge.start()
    guided = args.guided if args.guided is not None else not args.prompts  # the story tells itself
    app = BlockvizApp(bridge=bridge, projector=args.projector, source_name=spec.model, break_on=args.break_on,
                      guided=guided, keep_events=args.keep_events)
    app.run()
    if app.engine_died:  # printed now that the terminal is back
        print(f"blockviz: error: {app.error}", file=sys.stderr)
        return 1
    if app.error:
        raise UsageError(app.error)
    return app.return_code or 0
