"""The bridge between a live engine and the UI: the engine runs in a worker thread, the UI gets
batches of events, and the worker waits when the UI falls behind.

`EngineSpec` is what to run (the CLI's engine options). `EngineBridge.run()` is the worker thread's
body: load the model, add the requests, then step the engine only when the UI asks for steps (or
free-runs at "max" speed) and only while fewer than `max_in_flight` events wait unacknowledged in
the UI — that is the backpressure. Between steps it runs the user's commands (add a request, fork a
sequence, swap a request out), since the engine is not thread-safe and only this thread touches it.

No textual import: the app hands in callbacks that post messages (see blockviz/app.py).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields
from typing import Any, Callable

from blockviz.cli import DEFAULT_PROMPTS
from blockviz.errors import UsageError
from blockviz.scenario import Arrival, admit_arrivals
from engine.config import EngineConfig
from engine.events import Event


def one_line(exc: BaseException) -> str:
    """An exception as one line of text (its first line, else its type)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


@dataclass(slots=True)
class EngineSpec:
    """What to run: an EngineConfig (engine/config.py: model, block size, pools, prefix caching,
    preemption mode, device, seed...) and the requests: `prompts` at once, `arrivals` as the engine
    steps (blockviz/scenario.py), each sampled with `n`, `max_tokens` and `temperature`."""

    config: EngineConfig = field(default_factory=EngineConfig)
    prompts: tuple[str, ...] = DEFAULT_PROMPTS
    n: int = 1
    max_tokens: int = 32
    temperature: float = 0.0
    arrivals: tuple[Arrival, ...] = ()

    @classmethod
    def of(cls, **options: Any) -> "EngineSpec":
        """A spec from keyword options: EngineConfig's by their names, the rest the spec's own."""
        names = EngineConfig.option_names()
        config = EngineConfig(**{k: v for k, v in options.items() if k in names})
        return cls(config, **{k: v for k, v in options.items() if k not in names})

    @classmethod
    def from_args(cls, args: Any, default_arrivals: tuple[Arrival, ...] = ()) -> "EngineSpec":
        """The spec of the parsed CLI options; with no --prompt, `default_arrivals` when given (the
        scenario `blockviz run` plays), else the default prompts."""
        from blockviz.cli import ENGINE_CONFIG_OPTIONS

        if args.prompts:
            prompts, arrivals = tuple(args.prompts), ()
        else:
            prompts, arrivals = ((), default_arrivals) if default_arrivals else (DEFAULT_PROMPTS, ())
        config = EngineConfig(**{name: getattr(args, name) for name in ENGINE_CONFIG_OPTIONS})
        return cls(config, prompts=prompts, arrivals=arrivals, n=args.n, max_tokens=args.max_tokens,
                   temperature=args.temperature)

    @property
    def model(self) -> str:
        return self.config.model

    def check(self) -> None:
        """Raise UsageError (one line) for what can be known wrong before the engine starts:
        an empty prompt, a CUDA device this machine does not have."""
        for prompt in (*self.prompts, *(a.prompt for a in self.arrivals)):
            if not prompt:
                raise UsageError("--prompt is empty: give at least one character")
        device = self.config.device
        if device is not None and device.startswith("cuda"):
            import torch

            index = int(device.partition(":")[2] or 0)
            if not torch.cuda.is_available():
                raise UsageError(f"--device {device}: this machine has no CUDA device (torch "
                                 f"{torch.__version__}); omit --device to run on the CPU")
            if index >= torch.cuda.device_count():
                raise UsageError(f"--device {device}: there are {torch.cuda.device_count()} CUDA devices")

    def check_prompt_lengths(self, source) -> None:
        """Raise UsageError when a prompt is as long as the model's context, before the engine
        starts: the checkpoint's tokenizer.json and config.json alone (the tokenizers library,
        no torch). `source` is what engine.model_source.check_model returned. Skipped when those
        files are not on this machine; the engine checks again when the request is added."""
        import json

        config_path, tokenizer_path = _checkpoint_file(source, "config.json"), _checkpoint_file(source, "tokenizer.json")
        if config_path is None or tokenizer_path is None:
            return
        try:
            from tokenizers import Tokenizer

            context = json.loads(config_path.read_text()).get("n_positions")
            tokenizer = Tokenizer.from_file(str(tokenizer_path))
        except Exception:  # noqa: BLE001 - a file this cannot read: the engine checks again
            return
        if not isinstance(context, int):
            return
        for prompt in (*self.prompts, *(a.prompt for a in self.arrivals)):
            length = len(tokenizer.encode(prompt, add_special_tokens=False).ids)
            if length >= context:
                raise UsageError(f"a prompt has {length} tokens but the model's context is {context}: "
                                 f"shorten it to at most {context - 1}")

    def admit_arrivals(self, engine, pending: list[Arrival], steps_done: int) -> list[str]:
        """Queue the arrivals due after `steps_done` steps (blockviz.scenario.admit_arrivals)."""
        return admit_arrivals(engine, pending, steps_done, self.sampling_params)

    def sampling_params(self, n: int | None = None):
        from engine.sequence import SamplingParams

        return SamplingParams(n=self.n if n is None else n, temperature=self.temperature,
                              max_tokens=self.max_tokens, seed=self.config.seed)

    def make_engine(self):
        """Build the engine (loads the model: seconds). Imports torch."""
        from engine import LLMEngine

        return LLMEngine(self.config)

    def run_header(self) -> dict[str, Any]:
        """The run's settings for a trace header."""
        mode = self.config.preemption_mode
        header = {"prompts": list(self.prompts), "n": self.n, "max_tokens": self.max_tokens,
                  "seed": self.config.seed, "temperature": self.temperature,
                  "preemption_mode": mode.value if mode is not None else None}
        if self.arrivals:
            header["arrivals"] = [{"step": a.step, "prompt": a.prompt, "n": a.n} for a in self.arrivals]
        return header

    def as_dict(self) -> dict[str, Any]:
        """The spec's fields by name (the config stays an EngineConfig): `type(spec)(**spec.as_dict())`."""
        return {f.name: getattr(self, f.name) for f in fields(self)}


def _checkpoint_file(source, filename: str):
    """`filename` of a checkpoint directory (a Path) or of a hub name in the local cache, or None."""
    from pathlib import Path

    if isinstance(source, Path):
        path = source / filename
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(source), filename)
    except Exception:  # noqa: BLE001 - not a cached repo
        return None
    return Path(found) if isinstance(found, str) else None


def check_model(name: str):
    """Raise engine.model_source.ModelNotFoundError (one line) now, before any UI opens, when
    `name` cannot be loaded: engine.model_source.check_model resolves a bundled name or a local
    directory on disk and a hub name in the local cache (or with one quick probe of the hub).
    Imports neither torch nor transformers: the UI process never loads them."""
    from engine.model_source import check_model as check

    return check(name)


def quiet_model_loading() -> None:
    """No progress bars or hub chatter from Hugging Face libraries on the user's terminal (the CLI
    prints its own one-line progress; a TUI owns the terminal)."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging
    except ImportError:
        return
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def leave_a_core_for_the_ui(device: str | None) -> None:
    """On the CPU, give torch one intra-op thread fewer than cores, so the UI thread keeps a core.

    For an engine sharing the UI's process (EngineBridge(share_cores=True), as the tests run it);
    `blockviz run` starts the engine in a process of its own (blockviz/engine_process.py), which
    keeps every torch thread. When the in-thread engine was what `blockviz run` used, on 2 cores it
    ran at 508 tokens/s with the TUI attached and 2 torch threads, 654 tokens/s with 1: the UI
    thread and torch's spinning OpenMP workers kept pre-empting each other (benchmarks/tui.py).
    """
    if device not in (None, "cpu"):
        return
    import torch

    if device is None and torch.cuda.is_available():
        return
    threads = torch.get_num_threads()
    if threads > 1:
        torch.set_num_threads(threads - 1)


@dataclass(slots=True)
class Listener:
    """Where the worker reports; every callback is called from the worker thread."""

    loading: Callable[[str], None]
    ready: Callable[[dict], None]
    failed: Callable[[str], None]
    events: Callable[[list[Event]], None]
    notice: Callable[[str], None] = lambda text: None
    died: Callable[[str], None] = lambda error: None  # the engine stopped after it was ready
    idle: Callable[[], None] = lambda: None
    served: Callable[[int], None] = lambda steps_served: None  # after steps asked for finish or drop


@dataclass(slots=True)
class _Command:
    name: str
    run: Callable[[Any], Any]


class EngineBridge:
    """Runs an engine on a worker thread, posting batches of events with backpressure.

    UI-thread methods: request_steps, set_free_run, acknowledge, add_request, fork, preempt, abort,
    stop. Worker-thread method: run.
    """

    def __init__(self, spec: EngineSpec | None = None, *, make_engine: Callable[[], Any] | None = None,
                 max_in_flight: int = 4096, flush_interval: float = 0.1, share_cores: bool = True) -> None:
        self.spec = spec or EngineSpec()
        self._make_engine = make_engine or self.spec.make_engine
        self.max_in_flight = max_in_flight
        self.flush_interval = flush_interval  # free-running: at most one batch per interval
        self.share_cores = share_cores  # the UI runs in this process: leave it a core
        self._cond = threading.Condition()
        self._steps_wanted = 0
        self._stepping = False
        self._free_run = False
        self._in_flight = 0
        self._idle = False
        self._stopped = False
        self._commands: list[_Command] = []
        self.num_steps = 0
        self.steps_served = 0  # steps asked for by request_steps that finished or were dropped
        self.header: dict[str, Any] | None = None
        self.engine: Any = None

    # ------------------------------------------------------------------ UI side

    def request_steps(self, count: int = 1) -> None:
        with self._cond:
            self._steps_wanted += count
            self._cond.notify_all()

    @property
    def outstanding(self) -> int:
        """Steps asked for and not finished yet."""
        with self._cond:
            return self._steps_wanted + (1 if self._stepping else 0)

    @property
    def in_flight(self) -> int:
        with self._cond:
            return self._in_flight

    def set_free_run(self, free_run: bool) -> None:
        """Step as fast as the backpressure allows ("max" playback speed)."""
        with self._cond:
            self._free_run = free_run
            self._cond.notify_all()

    def acknowledge(self, count: int) -> None:
        """The UI took `count` events into its timeline."""
        with self._cond:
            self._in_flight = max(0, self._in_flight - count)
            self._cond.notify_all()

    def add_request(self, prompt: str, n: int | None = None) -> None:
        params = self.spec.sampling_params(n)
        self._submit(_Command("add request", lambda engine: engine.add_request(prompt, params)))

    def fork(self, seq_id: int) -> None:
        self._submit(_Command(f"fork sequence {seq_id}", lambda engine: engine.fork_sequence(seq_id)))

    def preempt(self, request_id: str) -> None:
        self._submit(_Command(f"swap out request {request_id}",
                              lambda engine: engine.preempt_request(request_id)))

    def abort(self, request_id: str) -> None:
        self._submit(_Command(f"abort request {request_id}", lambda engine: engine.abort_request(request_id)))

    def stop(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()

    def _submit(self, command: _Command) -> None:
        with self._cond:
            self._commands.append(command)
            self._cond.notify_all()

    # ------------------------------------------------------------------ worker side

    def _may_step(self) -> bool:
        return ((self._steps_wanted > 0 or self._free_run) and not self._idle
                and self._in_flight < self.max_in_flight)

    def run(self, listener: Listener) -> None:
        """The worker's body: load, add the initial requests, then serve steps and commands."""
        spec = self.spec
        profiling = ", then profiling its memory to size the KV cache" if spec.config.num_gpu_blocks is None else ""
        listener.loading(f"loading the model {spec.model!r}{profiling}…")
        try:
            quiet_model_loading()
            if self.share_cores:
                leave_a_core_for_the_ui(spec.config.device)
            engine = self._make_engine()
            header = dict(engine.trace_header())
        except Exception as exc:  # noqa: BLE001 - a load failure ends the app with one line
            listener.failed(one_line(exc))
            return
        self.header = header
        self.engine = engine  # for tests and benchmarks; only this thread calls into it
        buffer: list[Event] = []
        unsubscribe = engine.events.subscribe(buffer.append)
        listener.ready(header)

        last_flush = time.monotonic()
        # An engine that can hold back its K/V digests (LLMEngine) digests the blocks written by a
        # free run's steps once per batch sent instead of every step: a block being filled is
        # hashed once a batch, not once a token. Single steps keep a digest per step.
        digest_later = getattr(engine, "emit_kv_digests", None)

        def flush(force: bool = True) -> None:
            nonlocal last_flush
            now = time.monotonic()
            if not force and now - last_flush < self.flush_interval:
                return  # free-running: gather more steps into one message
            if digest_later is not None:
                digest_later()
            if not buffer:
                return
            last_flush = now
            batch = buffer.copy()
            buffer.clear()
            with self._cond:
                self._in_flight += len(batch)
            listener.events(batch)

        served = 0
        pending = list(spec.arrivals)
        try:
            for prompt in spec.prompts:
                engine.add_request(prompt, spec.sampling_params())
            spec.admit_arrivals(engine, pending, 0)
        except ValueError as exc:  # a prompt the engine refuses: the run cannot be what was asked
            unsubscribe()
            listener.failed(one_line(exc))
            return
        try:
            flush()
            while True:
                with self._cond:
                    while not (self._stopped or self._commands or self._may_step() or buffer):
                        self._cond.wait(0.5)
                    if self._stopped:
                        break
                    commands, self._commands = self._commands, []
                    step = self._may_step()
                    wanted = step and self._steps_wanted > 0
                    if digest_later is not None:
                        engine.kv_digests_per_step = wanted or not self._free_run
                    if step:
                        self._stepping = True
                        if wanted:
                            self._steps_wanted -= 1
                for command in commands:
                    try:
                        command.run(engine)
                    except Exception as exc:  # noqa: BLE001 - a refused command is a notice, not a crash
                        listener.notice(f"{command.name}: {one_line(exc)}")
                    else:
                        with self._cond:
                            self._idle = False
                if step:
                    try:
                        if engine.has_unfinished_requests():
                            engine.step()
                            self.num_steps += 1
                        spec.admit_arrivals(engine, pending, self.num_steps)
                    finally:
                        with self._cond:
                            self._stepping = False
                            self.steps_served += wanted
                            free_running = self._free_run and not self._steps_wanted and not self._commands
                unfinished = engine.has_unfinished_requests()
                flush(force=not (step and free_running and unfinished))
                if (step or commands) and not unfinished:
                    with self._cond:
                        self._idle = True
                        self.steps_served += self._steps_wanted
                        self._steps_wanted = 0
                    listener.idle()
                if self.steps_served != served:
                    served = self.steps_served
                    listener.served(served)
        except Exception as exc:  # noqa: BLE001 - the engine broke: report, keep the UI alive
            flush()
            listener.died(f"engine stopped: {one_line(exc)}")
        finally:
            unsubscribe()
