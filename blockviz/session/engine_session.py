"""EngineSession: the one thing in blockviz/ that owns an engine and its event stream.

Every way of driving an engine goes through it: the live views' EngineDriver (engine_driver.py: on
the TUI's thread in engine_thread.py or the child process of engine_process.py, and in the
notebook's jupyter/playback.py), `record`, `explain`, `generate`, `compare` and `publish --live`.
It builds the engine from an EngineSpec (or takes a built one), subscribes once to `engine.events`
and buffers what the engine emits until the caller takes it (`take_events`: each request's prompt
token texts filled in, a view's concern the engine leaves out), adds the spec's prompts and plays
its arrivals as steps are taken (scenario.py), takes the live commands under vLLM's names
(`add_request`, `fork`, `preempt`), and sets the engine's K/V digest policy. `step()` here is the
only call of `engine.step()` in blockviz/: vLLM's `LLM._run_engine` loop and nano-vllm's
`LLM.generate` loop, one step at a time.

No textual, no ipywidgets; torch only through the engine.
"""

from __future__ import annotations

from typing import Any, Callable

import msgspec

from blockviz.model.safe_text import safe_header, safe_struct
from blockviz.session.scenario import admit_arrivals
from blockviz.session.spec import EngineSpec, one_line
from engine.designs import DEFAULT, get_design
from engine.events import Event, RequestAdded


class CommandRefused(ValueError):
    """A live command the engine refused (a sequence not running, no room in the CPU pool, a bad
    prompt), as one line: "fork sequence 7: sequence 7 is not running"."""


def trace_header(engine: Any) -> dict[str, Any]:
    """The run's engine settings and the block-count formula's figures, for a trace header and the
    views' titles: the engine's config (engine/config.py), its BlockBudget (kv_sizing.py's
    determine_num_blocks, after vLLM v1's determine_available_memory) and the model's geometry."""
    config, budget, model = engine.config, engine.budget, engine.loaded.config
    mode = config.preemption_mode
    return {
        "model": config.model, "block_size": config.block_size,
        "num_gpu_blocks": budget.num_gpu_blocks, "num_cpu_blocks": budget.num_cpu_blocks,
        "enable_prefix_caching": config.enable_prefix_caching,
        "preemption_mode": mode.value if mode is not None else None, "device": str(engine.device),
        "dtype": str(engine.loaded.dtype).removeprefix("torch."), "block_bytes": budget.block_bytes,
        "budget_source": budget.source, "total_bytes": budget.total_bytes, "peak_bytes": budget.peak_bytes,
        "gpu_memory_utilization": budget.utilization, "max_model_len": engine.max_model_len,
        "model_type": model.model_type, "num_layers": model.num_layers, "num_heads": model.num_heads,
        "num_kv_heads": model.num_kv_heads, "head_dim": model.head_dim,
        **_profiled_fields(budget), **_kv_manager_fields(config), **_kv_cache_group_fields(engine),
        **_scheduling_fields(engine),
    }


def _scheduling_fields(engine: Any) -> dict[str, Any]:
    """Which order a design that has vLLM's asynchronous scheduling ran in ("async_scheduling":
    true or false, LLMEngine.async_scheduling); nothing for the others, which run synchronously."""
    return {"async_scheduling": engine.async_scheduling} if engine.config.design.async_scheduling else {}


def _kv_cache_group_fields(engine: Any) -> dict[str, Any]:
    """A hybrid or sliding-window model's KV-cache groups (kind, window, layers:
    design.kv_cache_groups_header), from engine/v1's groups or vLLM's own manager's
    (kv_cache_event_metadata, kv_manager "vllm"); nothing for one full-attention group, whose
    header has no "kv_cache_groups"."""
    from blockviz.model.design import FULL_ATTENTION, SLIDING_WINDOW, kv_cache_groups_header

    manager = getattr(engine, "kv_manager", None)
    if getattr(manager, "kv_cache_groups", None):  # engine/v1
        groups = [(FULL_ATTENTION if window is None else SLIDING_WINDOW, window, group.layer_names)
                  for group in manager.kv_cache_groups
                  for window in [getattr(group.kv_cache_spec, "sliding_window", None)]]
    elif getattr(manager, "kv_cache_event_metadata", None):  # vLLM's own KVCacheManager
        groups = [(kind, window, group.layer_names) for (kind, window), group in
                  zip(manager.kv_cache_event_metadata, manager.kv_cache_config.kv_cache_groups)]
    else:
        return {}
    header = kv_cache_groups_header(groups)
    return {"kv_cache_groups": header} if header else {}


def _profiled_fields(budget: Any) -> dict[str, Any]:
    """A pool sized from the device's memory: the free bytes at startup and the bytes the profile
    run took outside torch (kv_sizing.profile_device); nothing for any other source."""
    if budget.source != "profiled":
        return {}
    return {"free_bytes": budget.free_bytes, "non_torch_bytes": budget.non_torch_bytes}


def _kv_manager_fields(config: Any) -> dict[str, Any]:
    """Which KV cache manager ran: nothing for the default design, v0 (a header without "kv_manager"
    names it), else the design's name and its prefix-caching hash."""
    design = get_design(getattr(config, "kv_manager", None))
    if design is DEFAULT:
        return {}
    if design.vllm_options:  # vLLM's own: its release and the options it ran with
        from engine.vllm_core import vllm_version

        options = dict(config.vllm_options or {})
        return {"kv_manager": design.name, "prefix_caching_hash_algo": options.get("prefix_caching_hash_algo",
                                                                              config.prefix_caching_hash_algo),
                "vllm_version": vllm_version(), "vllm_options": options}
    if design.radix_tree:  # SGLang's own: its release and the options it ran with
        from engine.sglang_core import sglang_version

        return {"kv_manager": design.name, "sglang_version": sglang_version(),
                "sglang_options": {"page_size": config.block_size, **(config.sglang_options or {})}}
    return {"kv_manager": config.kv_manager, "prefix_caching_hash_algo": config.prefix_caching_hash_algo}


class EngineSession:
    """An engine, its buffered event stream, the spec's requests and the live commands.

    Not thread-safe: one thread at a time calls into it (the bridge's worker, or the notebook with
    its lock held).
    """

    def __init__(self, spec: EngineSpec | None = None, *, engine: Any = None,
                 make_engine: Callable[[], Any] | None = None, keep_finished: int | None = None) -> None:
        """Build the engine from `spec` (loads the model: seconds), or with `make_engine()`, or
        take `engine` as built (tests; several engines over one loaded model). `keep_finished`
        bounds `finished` to the newest outputs (a long live session; None keeps every one)."""
        self.spec = spec if spec is not None else EngineSpec()
        if engine is None:
            engine = (make_engine or self.spec.make_engine)()
        self.engine = engine
        self.header = safe_header(trace_header(engine))  # strings made safe to draw (safe_text.py)
        self.num_steps = 0  # engine steps this session took
        self.finished: dict[str, Any] = {}  # request id -> its final RequestOutput
        self.keep_finished = keep_finished
        self._pending = list(self.spec.arrivals)  # arrivals not queued yet
        self._digests_per_step = True
        self._buffer: list[Event] = []
        self._unsubscribe = engine.events.subscribe(self._buffer.append)

    # ------------------------------------------------------------------ the run's requests

    def check_requests(self, prompts=None, sampling_params: Any = None) -> None:
        """Check `prompts` (default: the spec's prompts and arrivals) without queueing any
        (LLMEngine.check_request), sampled as the spec says or with `sampling_params`: a
        ValueError names what the engine would refuse."""
        spec = self.spec
        if prompts is None:
            checks = [(p, spec.sampling_params()) for p in spec.prompts]
            checks += [(a.prompt, spec.sampling_params(a.n)) for a in spec.arrivals]
        else:
            checks = [(p, sampling_params or spec.sampling_params()) for p in prompts]
        for prompt, params in checks:
            self.engine.check_request(prompt, params)

    def start(self) -> list[str]:
        """Check every request of the spec, then queue its prompts and the arrivals due before the
        first step. Returns the request ids queued, in order. A ValueError (one line) when the
        engine would refuse one: nothing is queued then."""
        self.check_requests()
        params = self.spec.sampling_params()
        request_ids = [self.engine.add_request(prompt, params) for prompt in self.spec.prompts]
        return request_ids + self._admit_arrivals()

    def _admit_arrivals(self) -> list[str]:
        return admit_arrivals(self.engine, self._pending, self.num_steps, self.spec.sampling_params)

    def has_unfinished_requests(self) -> bool:
        """Whether a request is unfinished or an arrival still to come (LLMEngine's, vLLM's)."""
        return bool(self._pending) or self.engine.has_unfinished_requests()

    # ------------------------------------------------------------------ stepping

    def step(self) -> list[Any]:
        """One engine step (LLMEngine.step) if a request is unfinished, then the arrivals it made
        due. Returns the step's RequestOutputs (finished ones are kept in `finished`)."""
        outputs: list[Any] = []
        if self.engine.has_unfinished_requests():
            outputs = self.engine.step() or []
            self.num_steps += 1
            for output in outputs:
                if output.finished:
                    self.finished[output.request_id] = output
            if self.keep_finished is not None:
                for request_id in list(self.finished)[:max(0, len(self.finished) - self.keep_finished)]:
                    del self.finished[request_id]
        self._admit_arrivals()
        return outputs

    def run_to_completion(self, max_steps: int = 100_000, *, on_events: Callable[[list[Event]], None] | None = None,
                          between_steps: Callable[["EngineSession", int], None] | None = None,
                          progress: Callable[[int], None] | None = None) -> int:
        """Step until no request is unfinished or `max_steps` steps were taken; returns the steps
        taken. `on_events(batch)` gets the events after each step (and those already buffered
        first); `between_steps(session, steps_done)` may act on the engine (add a request, fork,
        preempt) before each step; `progress(steps_done)` follows each step."""
        taken = 0
        self._deliver(on_events)
        while self.has_unfinished_requests() and taken < max_steps:
            if between_steps is not None:
                between_steps(self, self.num_steps)
            self.step()
            taken += 1
            self._deliver(on_events)
            if progress is not None:
                progress(self.num_steps)
        return taken

    def _deliver(self, on_events: Callable[[list[Event]], None] | None) -> None:
        if on_events is not None:
            batch = self.take_events()
            if batch:
                on_events(batch)

    # ------------------------------------------------------------------ events

    @property
    def num_buffered(self) -> int:
        """Events emitted and not taken yet."""
        return len(self._buffer)

    def take_events(self) -> list[Event]:
        """The events emitted since the last call, in order. With the digests held back
        (digest_per_step(False)) the batch ends with the K/V digests of the blocks written since
        the last batch, so a batch never leaves a block's digest out of date. Every string in
        them (a prompt, a tokenizer's pieces) is made safe to draw (blockviz/model/safe_text.py)."""
        if not self._digests_per_step:
            self.engine.emit_kv_digests()
        batch = self._buffer[:]
        self._buffer.clear()
        return [safe_struct(self._with_prompt_texts(e) if isinstance(e, RequestAdded) and not e.prompt_tokens_text
                            else e) for e in batch]

    def _with_prompt_texts(self, event: RequestAdded) -> RequestAdded:
        """The request's event with each prompt token's text, which the engine leaves to the views
        (the trace format keeps them: the log, the tables and the text panel show them)."""
        return msgspec.structs.replace(event, prompt_tokens_text=token_texts(self.engine.tokenizer,
                                                                             event.prompt_token_ids))

    def digest_per_step(self, per_step: bool) -> None:
        """The K/V digest policy (LLMEngine.set_kv_digests_per_step): every step digests the blocks
        it wrote (True: single steps, recordings), or once per batch taken (False: a view
        free-running at full speed hashes a block being filled once per frame, not every step)."""
        if per_step != self._digests_per_step:
            self._digests_per_step = per_step
            self.engine.set_kv_digests_per_step(per_step)

    # ------------------------------------------------------------------ live commands

    def add_request(self, prompt: Any, n: int | None = None, sampling_params: Any = None) -> str:
        """Queue a request now (LLMEngine.add_request, vLLM's add_request), sampled as the spec
        says with `n` samples, or with `sampling_params`. Returns its request id; CommandRefused
        (one line) when the engine refuses it."""
        if sampling_params is None:
            params = self.spec.sampling_params(n)
        else:
            params = sampling_params if n is None else _with_n(sampling_params, n)
        return self._command("add a request", lambda: self.engine.add_request(prompt, params))

    def fork(self, seq_id: int) -> int:
        """Fork a running sequence now (LLMEngine.fork, vLLM v0 BlockSpaceManager.fork): the child
        shares every block. Returns the child's seq id."""
        return self._command(f"fork sequence {seq_id}", lambda: self.engine.fork(seq_id))

    def preempt(self, request_id: str) -> list[tuple[int, int]]:
        """Preempt a running request now by swapping it out to the CPU pool (LLMEngine.preempt,
        vLLM v0 Scheduler._preempt by swap). Returns the (gpu block, cpu block) pairs moved."""
        return self._command(f"swap out request {request_id}", lambda: self.engine.preempt(str(request_id)))

    def _command(self, name: str, run: Callable[[], Any]) -> Any:
        try:
            return run()
        except Exception as exc:  # noqa: BLE001 - every refusal reads the same: what, then why
            raise CommandRefused(f"{name}: {one_line(exc)}") from exc

    def close(self) -> None:
        """Stop listening to the engine's events (the engine stays as it is)."""
        self._unsubscribe()


def _with_n(params: Any, n: int) -> Any:
    import dataclasses

    return dataclasses.replace(params, n=n)


def token_texts(tokenizer: Any, token_ids) -> tuple[str, ...]:
    """Each token's text alone; a token holding part of a multi-byte character (its text alone
    would be U+FFFD) as its bytes, '\\xe2\\x80' (byte-level BPE: the token's string read back through
    GPT-2's byte-to-character table), else as the tokenizer's token string."""
    texts = tokenizer.batch_decode([[token_id] for token_id in token_ids])
    return tuple(_as_bytes(tokenizer, token_id) if "\ufffd" in text else text
                 for token_id, text in zip(token_ids, texts))


def _as_bytes(tokenizer: Any, token_id: int) -> str:
    token = tokenizer.convert_ids_to_tokens(int(token_id))
    decoder = _byte_decoder()
    if not token or any(ch not in decoder for ch in token):
        return token or f"<{token_id}>"
    return bytes(decoder[ch] for ch in token).decode("utf-8", errors="backslashreplace")


def _byte_decoder() -> dict[str, int]:
    """Byte-level BPE's printable character for each byte, inverted (GPT-2 bytes_to_unicode): the
    printable Latin-1 bytes stand for themselves, the others for 256, 257, ... in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            chars[chr(byte)] = byte
        else:
            chars[chr(256 + extra)] = byte
            extra += 1
    return chars
