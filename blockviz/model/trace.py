"""Trace files: an engine's event stream on disk, one JSON object per line.

Line 1 is a header ({"format": "blockviz-trace", "version": 1, ...} with the model, block size,
pool sizes, prefix caching and the requests that were run); every following line is one event's
`Event.to_json()`. Version 2 is a run with KV-cache groups (a hybrid or sliding-window model under
engine/v1): its header names them ("kv_cache_groups"), its block events carry their `group` and a
window's freed slots are blocks_skipped events (docs/traces.md); a run with one full-attention group
is written as version 1, with no group fields, and every version-1 trace loads. A replay feeds
these events to the same reducer and views as a live run, so a
trace needs no model and no torch (this module imports only `engine.events` and `engine.config`).

Reading is strict and says exactly what is wrong, in one line: a missing file, a file that is not
a trace, a trace from a newer blockviz, or the number of the first corrupted line: a line that does
not parse, or an event that does not make sense where it stands (blockviz/model/trace_check.py).

A trace may come from anyone, so reading it is bounded by the file, never by what the file claims
(the limits below, listed in the README's "Traces"): a line is at most MAX_LINE_BYTES and nests at
most MAX_NESTING deep; the header's block size is at most MAX_BLOCK_SIZE and its pools hold at
most max(MIN_POOL_BLOCKS, file size / FILE_BYTES_PER_BLOCK) blocks (the reducer keeps a record per
block), no more than the header's own memory figures hold; every id, count and hash is a
non-negative 64-bit integer and every token id below the header's vocab_size (else MAX_TOKEN_ID);
every header field is of its type and range (HEADER_FIELDS), so no reader meets a value it cannot
use. A UTF-8 byte order mark before the header is skipped.
"""

from __future__ import annotations

import json
import math
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Callable, Iterable, Iterator

from blockviz.model.design import (
    async_scheduling_of, attribution_title, design_of, kv_cache_groups_of, kv_manager_of, model_name,
)
from blockviz.model.safe_text import safe_header, safe_struct
from blockviz.model.trace_check import TraceChecker
from engine.config import HASH_ALGOS, KV_MANAGERS, PreemptionMode
from engine.events import Event, event_from_dict

TRACES_DIR = Path(__file__).resolve().parents[1] / "traces"  # the shipped traces (package data)
FORMAT_NAME = "blockviz-trace"
FORMAT_VERSION = 2  # the newest this blockviz reads and writes
GROUPS_FORMAT_VERSION = 2  # a trace whose header has "kv_cache_groups"; one without is written as version 1
REQUIRED_HEADER_FIELDS = ("block_size", "num_gpu_blocks", "num_cpu_blocks")
BOM = b"\xef\xbb\xbf"

# Limits on what a trace may ask of the reader (see the module docstring). Limits, not measurements.
MAX_LINE_BYTES = 4 << 20  # a swap of a whole pool, a prompt of 100k tokens fit
MAX_NESTING = 16  # an event nests 3 deep (a swap's mapping), a header a few more
MAX_KV_CACHE_GROUPS = 64  # vLLM groups a model's layers by spec: a hybrid model has a handful
MAX_BLOCK_SIZE = 1 << 12  # tokens per block (vLLM's largest are a few hundred)
MIN_POOL_BLOCKS = 1 << 17  # GPU + CPU blocks any trace may declare, however short
FILE_BYTES_PER_BLOCK = 64  # ... and one more block per this many bytes of a longer file
MAX_DEVICE_BYTES = 1 << 41  # 2 TiB: more than any one accelerator or host pool holds


class TraceError(ValueError):
    """A trace cannot be read; str() is one line naming the file (and line) and the problem."""


class TraceWriteError(TraceError):
    """The trace could not be written (a full disk, a file-size limit): nothing is left behind."""


@dataclass(slots=True)
class Trace:
    """A header and the events that follow it."""

    header: dict[str, Any]
    events: list[Event] = field(default_factory=list)
    path: str | None = None

    @property
    def block_size(self) -> int:
        return int(self.header["block_size"])

    @property
    def num_gpu_blocks(self) -> int:
        return int(self.header["num_gpu_blocks"])

    @property
    def num_cpu_blocks(self) -> int:
        return int(self.header["num_cpu_blocks"])

    @property
    def async_scheduling(self) -> bool:
        """Whether the run scheduled in vLLM's asynchronous order (design.async_scheduling_of)."""
        return async_scheduling_of(self.header)


def engine_title(header: dict[str, Any]) -> str:
    """A short description for the UI from a trace header or an engine session's header: model,
    whose scheduler ran when it was not blockviz's (design.attribution_title: `--kv-manager vllm`),
    block size, pools, where a pool sized from memory got its size (pool_origin), prefix caching
    when on, and what a block holds (kv_geometry)."""
    caching = " · prefix caching" if header.get("enable_prefix_caching") else ""
    geometry, origin = kv_geometry(header), pool_origin(header)
    drivers = attribution_title(header)
    # v1's block 0 is the null block, never handed out: the pool's count (/N) is one less
    null = "SGLang's padding page" if design_of(header).radix_tree else "the null block"
    usable = (f" · {header['num_gpu_blocks'] - 1} GPU blocks usable + {null}"
              if design_of(header).null_block and header['num_gpu_blocks'] > 1 else "")
    return (f"{model_name(header)}{f' · {drivers}' if drivers else ''} · block size {header['block_size']} · "
            f"{header['num_gpu_blocks']} GPU / {header['num_cpu_blocks']} CPU blocks"
            + (f" ({origin})" if origin else "") + usable + caching
            + (f" · a block: {geometry}" if geometry else ""))


def pool_origin(header: dict[str, Any]) -> str:
    """Where the GPU pool's size came from when memory decided it (engine/kv_sizing.py
    determine_num_blocks): "profiled: 0.92 × 139.8 GiB − 1.2 GiB peak − 0.4 GiB non-torch, 139.5
    GiB free" (utilization × total − torch peak − memory outside torch; free at startup) or "a
    1.0 GiB KV budget". "" for a pool whose size was given, or the CPU's default."""
    def gib(key: str) -> str:
        return f"{header[key] / (1 << 30):.1f} GiB"

    source = header.get("budget_source")
    try:
        if source == "budget":
            return f"a {gib('total_bytes')} KV budget"
        if source == "profiled":
            figures = (f"profiled: {header['gpu_memory_utilization']:g} × {gib('total_bytes')} − "
                       f"{gib('peak_bytes')} peak")
            if header.get("non_torch_bytes") is not None:
                figures += f" − {gib('non_torch_bytes')} non-torch"
            return figures + (f", {gib('free_bytes')} free" if header.get("free_bytes") is not None else "")
    except (KeyError, TypeError):
        pass
    return ""


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8}


def kv_geometry(header: dict[str, Any]) -> str:
    """What one block of the K/V cache holds, in bytes, from a run's header: 2 (K and V) x layers x
    K/V heads x head_dim x block_size x the dtype's bytes (vLLM's CacheEngine.get_cache_block_size),
    with the query heads beside the K/V heads when fewer K/V heads serve them (grouped-query
    attention). With several KV-cache groups (the header's "kv_cache_groups") a block holds only
    its group's layers, one page per layer of the largest group (engine/cache_engine.py slots; vLLM
    get_kv_cache_config_from_groups). "" for a header without the model's geometry (older traces)."""
    try:
        layers, kv_heads, head_dim = header["num_layers"], header["num_kv_heads"], header["head_dim"]
        block_size, block_bytes = header["block_size"], header["block_bytes"]
        dtype_bytes = DTYPE_BYTES[header["dtype"]]
        groups = [len(group["layer_names"]) for group in header.get("kv_cache_groups") or ()]
    except (KeyError, TypeError):
        return ""
    heads = header.get("num_heads")
    shared = f" (shared by {heads} query heads)" if heads and heads != kv_heads else ""
    layer_text = f"{layers} layers"
    if len(groups) > 1:
        layer_text = (f"{max(groups)} layer{'s' if max(groups) > 1 else ''} (one KV-cache group's: "
                      f"the {layers} layers form {len(groups)} groups sharing the pool)")
    return (f"2 × {layer_text} × {kv_heads} K/V heads{shared} × {head_dim} dims × {block_size} slots"
            f" × {dtype_bytes} B = {block_bytes:,} B")


def make_header(engine_header: dict[str, Any], **run: Any) -> dict[str, Any]:
    """The header line: format name and version, blockviz version, the engine's settings
    (blockviz.session.engine_session.trace_header: model, block_size, num_gpu_blocks,
    num_cpu_blocks, enable_prefix_caching, ...) and the run's settings (prompts, n, max_tokens,
    seed, ...). Version 1, or GROUPS_FORMAT_VERSION when the engine's header names KV-cache groups."""
    from blockviz import __version__

    header: dict[str, Any] = {"format": FORMAT_NAME, "version": 1, "blockviz_version": __version__}
    header.update(engine_header)
    header.update(run)
    if header.get("kv_cache_groups"):
        header["version"] = GROUPS_FORMAT_VERSION
    missing = [name for name in REQUIRED_HEADER_FIELDS if name not in header]
    if missing:
        raise ValueError(f"trace header lacks {', '.join(missing)}")
    return header


class TraceWriter:
    """Writes a header then events, one per line; usable as an EventBus subscriber.

    >>> with TraceWriter.open(path, header) as writer:
    ...     unsubscribe = engine.events.subscribe(writer)

    `TraceWriter.create(path, header)` writes to a temporary file beside `path` instead, and
    `commit()` publishes it whole (flushed, fsync'ed, renamed) or `discard()` removes it, so a run
    cut short never leaves half a trace, and an existing file is kept unless `overwrite`.
    """

    def __init__(self, stream: IO[str], header: dict[str, Any]) -> None:
        self._stream = stream
        self._publish: tuple[Path, Path, bool] | None = None  # (partial, target, overwrite) for create()
        self.num_events = 0
        stream.write(json.dumps(header, separators=(",", ":")) + "\n")

    @classmethod
    def open(cls, path: str | Path, header: dict[str, Any]) -> "TraceWriter":
        return cls(open(path, "w", encoding="utf-8"), header)

    @classmethod
    def create(cls, path: str | Path, header: dict[str, Any], *, overwrite: bool = False) -> "TraceWriter":
        """A writer whose trace appears at `path` only on commit(); raises TraceError (one line)
        when `path` exists and not `overwrite`, or cannot be written."""
        target = Path(path)
        check_new_trace_path(target, overwrite=overwrite)
        partial = target.with_name(f".{target.name}.{secrets.token_hex(4)}.part")
        try:
            stream = open(partial, "x", encoding="utf-8")
        except OSError as exc:
            raise TraceError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
        try:
            writer = cls(stream, header)
        except BaseException:
            _close_and_remove(stream, partial)
            raise
        writer._publish = (partial, target, overwrite)
        return writer

    def __call__(self, event: Event) -> None:
        self.write(event)

    def write(self, event: Event) -> None:
        self._stream.write(event.to_json() + "\n")
        self.num_events += 1

    def write_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.write(event)

    def close(self) -> None:
        self._stream.close()

    def commit(self) -> None:
        """Flush and fsync the temporary file, then move it to its path in one step (a rename,
        or a hard link that fails if the path appeared meanwhile when not overwriting)."""
        partial, target, overwrite = self._published()
        try:
            self._stream.flush()
            os.fsync(self._stream.fileno())
            self._stream.close()
            if overwrite:
                os.replace(partial, target)
            else:
                _link_new(partial, target)
            _fsync_directory(target.parent)
        except OSError as exc:
            self.discard()
            raise TraceError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
        except BaseException:
            self.discard()
            raise

    def verify(self) -> None:
        """Read the temporary file back as every reader reads a trace (read_trace: each event
        through the trace checker) before commit(); a TraceError (one line, naming the trace's
        path) says the first line its readers would refuse."""
        partial, target, _ = self._published()
        try:
            self._stream.flush()
        except OSError as exc:
            self.discard()
            raise TraceWriteError(f"cannot write {str(target)!r}: {exc.strerror or exc}") from None
        try:
            read_trace(partial)
        except TraceError as exc:
            raise TraceError(str(exc).replace(repr(str(partial)), repr(str(target)))) from None

    def set_aside(self) -> Path:
        """Keep the temporary file as NAME.rejected.jsonl beside the trace's path (replacing an
        older one) instead of publishing it; returns that path."""
        partial, target, _ = self._published()
        rejected = target.with_name(f"{target.name.removesuffix('.jsonl')}.rejected.jsonl")
        try:
            self._stream.close()
            os.replace(partial, rejected)
        except OSError as exc:
            self.discard()
            raise TraceError(f"cannot write {str(rejected)!r}: {exc.strerror or exc}") from None
        return rejected

    def discard(self) -> None:
        """Close and remove the temporary file: nothing is published. The file goes even when the
        close fails (its flush meets a full disk, ENOSPC, or a file-size limit, EFBIG)."""
        partial, _, _ = self._published()
        _close_and_remove(self._stream, partial)

    def _published(self) -> tuple[Path, Path, bool]:
        if self._publish is None:
            raise RuntimeError("commit() and discard() are for a writer made by TraceWriter.create()")
        return self._publish

    def __enter__(self) -> "TraceWriter":
        return self

    def __exit__(self, exc_type, *exc_info: object) -> None:
        if self._publish is None:
            self.close()
        elif exc_type is None:
            self.commit()
        else:
            self.discard()


def _close_and_remove(stream: IO[str], partial: Path) -> None:
    """Close `stream` (what it still buffers is not wanted: a failing flush is ignored) and remove
    the file it wrote."""
    try:
        stream.close()
    except OSError:
        pass
    finally:
        partial.unlink(missing_ok=True)


def check_new_trace_path(path: str | Path, *, overwrite: bool = False, example: str = "trace.jsonl") -> None:
    """Raise TraceError (one line) when a trace cannot be written at `path`: a directory, a
    directory that does not exist, or an existing file and not `overwrite` (`record --force`).
    `example`: the file name a directory's message suggests (a picture's: step.svg)."""
    path = Path(path)
    if path.is_dir():
        raise TraceError(f"{str(path)!r} is a directory; give a file name such as {example}")
    if not path.parent.is_dir():
        raise TraceError(f"{str(path)!r}: directory {str(path.parent)!r} does not exist")
    if not overwrite and (path.exists() or path.is_symlink()):
        raise TraceError(f"{str(path)!r} already exists: give another name, or --force to overwrite it")


def _link_new(partial: Path, target: Path) -> None:
    """Move `partial` to `target` unless `target` exists (checked by the link itself where the
    file system has hard links)."""
    try:
        os.link(partial, target)
    except FileExistsError:
        partial.unlink(missing_ok=True)
        raise TraceError(f"{str(target)!r} already exists: give another name, or --force to overwrite it") from None
    except OSError:  # no hard links here (FAT, some network file systems): check, then rename
        check_new_trace_path(target)
        os.replace(partial, target)
        return
    partial.unlink()


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_trace(path: str | Path, header: dict[str, Any], events: Iterable[Event]) -> None:
    with TraceWriter.open(path, header) as writer:
        writer.write_all(events)


def parse_header(line: str | bytes, name: str, file_bytes: int | None = None) -> dict[str, Any]:
    """Check line 1 and return the header dict, or raise TraceError. `file_bytes`, the size of the
    whole file, bounds the pools the header may declare (None: only the fixed limits apply)."""
    not_a_trace = f"{name} is not a blockviz trace (line 1 must be a {FORMAT_NAME!r} header)"
    try:
        header = json.loads(line)
    except ValueError:
        raise TraceError(not_a_trace) from None
    except RecursionError:
        raise TraceError(f"{name} line 1: values nest more than {MAX_NESTING} deep") from None
    if not isinstance(header, dict) or header.get("format") != FORMAT_NAME:
        raise TraceError(not_a_trace)
    version = header.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceError(f"{name} line 1: format version {version!r} is not a positive integer")
    if version > FORMAT_VERSION:
        from blockviz import __version__

        raise TraceError(
            f"{name} has trace format version {version}, newer than the version {FORMAT_VERSION} "
            f"this blockviz {__version__} reads: upgrade blockviz"
        )
    try:
        _check_nesting(header)
        check_header_fields(header)
        _check_pools(header, file_bytes)
    except ValueError as exc:
        raise TraceError(f"{name} line 1: {exc}") from None
    return header


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value < 1 << 63


def _count(low: int) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: _is_count(value) and value >= low,
            "a positive integer" if low == 1 else "a non-negative integer")


def _one_of(*choices: Any) -> tuple[Callable[[Any], bool], str]:
    return (lambda value: any(type(value) is type(c) and value == c for c in choices),
            "one of " + ", ".join(map(repr, choices)))


def _or_null(rule: tuple[Callable[[Any], bool], str]) -> tuple[Callable[[Any], bool], str]:
    test, what = rule
    return (lambda value: value is None or test(value), f"{what} or null")


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_list_of(value: Any, item: Callable[[Any], bool]) -> bool:
    return isinstance(value, list) and all(item(x) for x in value)


def _is_arrival(value: Any) -> bool:
    """A scenario's arrival as EngineSpec.run_header writes it: {"step", "prompt", "n"}."""
    return (isinstance(value, dict) and set(value) <= {"step", "prompt", "n"} and _NON_NEGATIVE[0](value.get("step"))
            and isinstance(value.get("prompt"), str) and _POSITIVE[0](value.get("n", 1)))


def _is_kv_cache_groups(value: Any) -> bool:
    """design.kv_cache_groups_header's list: one or more {"kind", "sliding_window" (a window's
    only), "layer_names"}, not one full-attention group alone (a header without the field)."""
    return (isinstance(value, list) and 1 <= len(value) <= MAX_KV_CACHE_GROUPS and all(map(_is_kv_cache_group, value))
            and (len(value) > 1 or value[0]["kind"] != "full_attention"))


def _is_kv_cache_group(value: Any) -> bool:
    if not isinstance(value, dict) or not set(value) <= {"kind", "sliding_window", "layer_names"}:
        return False
    window = value.get("sliding_window")
    if value.get("kind") == "full_attention":
        kind_ok = window is None
    else:
        kind_ok = value.get("kind") == "sliding_window" and _POSITIVE[0](window)
    return kind_ok and _is_list_of(value.get("layer_names", []), _TEXT[0])


def _is_later_prompt(value: Any) -> bool:
    """scripts/make_traces.py's [step, prompt]."""
    return isinstance(value, list) and len(value) == 2 and _NON_NEGATIVE[0](value[0]) and isinstance(value[1], str)


_TEXT = (lambda value: isinstance(value, str), "a string")
_POSITIVE, _NON_NEGATIVE = _count(1), _count(0)
# Every field a header can have (trace_header, EngineSpec.run_header, make_header, a scenario's
# extra_header) and the values a reader accepts there: (test, what the test wants). A field not
# listed here is kept and never read. Required fields: REQUIRED_HEADER_FIELDS.
HEADER_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "blockviz_version": _TEXT, "model": _TEXT, "model_type": _TEXT, "device": _TEXT,
    "scenario": _TEXT, "description": _TEXT, "budget_source": _TEXT,
    "block_size": _POSITIVE, "num_gpu_blocks": _POSITIVE, "num_cpu_blocks": _NON_NEGATIVE,
    "enable_prefix_caching": (lambda value: isinstance(value, bool), "true or false"),
    "preemption_mode": _or_null(_one_of(*(mode.value for mode in PreemptionMode))),
    "dtype": _one_of(*DTYPE_BYTES),
    "block_bytes": _POSITIVE, "total_bytes": _or_null(_POSITIVE), "peak_bytes": _or_null(_NON_NEGATIVE),
    "free_bytes": _or_null(_NON_NEGATIVE), "non_torch_bytes": _or_null(_NON_NEGATIVE),
    "gpu_memory_utilization": _or_null((lambda value: _is_number(value) and 0 < value <= 1,
                                        "a number above 0 and at most 1")),
    "max_model_len": _or_null(_POSITIVE), "vocab_size": _POSITIVE,
    "num_layers": _POSITIVE, "num_heads": _POSITIVE, "num_kv_heads": _POSITIVE, "head_dim": _POSITIVE,
    "kv_manager": _one_of(*KV_MANAGERS),
    "async_scheduling": (lambda value: isinstance(value, bool), "true or false"),
    "prefix_caching_hash_algo": _one_of(*HASH_ALGOS),
    "prompts": (lambda value: _is_list_of(value, _TEXT[0]), "a list of strings"),
    "n": _POSITIVE, "max_tokens": _POSITIVE,
    "seed": (lambda value: _is_count(value if value >= 0 else -value) if _is_number(value) else False,
             "a 64-bit integer"),
    "temperature": (lambda value: _is_number(value) and value >= 0, "a finite, non-negative number"),
    "arrivals": (lambda value: _is_list_of(value, _is_arrival),
                 'a list of {"step": integer, "prompt": string, "n": integer}'),
    "later_prompts": (lambda value: _is_list_of(value, _is_later_prompt), "a list of [step, prompt] pairs"),
    "kv_cache_groups": (_is_kv_cache_groups,
                        f'a list of at most {MAX_KV_CACHE_GROUPS} {{"kind": "full_attention" or "sliding_window", '
                        '"sliding_window": integer (a window\'s only), "layer_names": [string, ...]}, not one full_attention group alone'),
}


def check_header_fields(header: dict[str, Any]) -> None:
    """ValueError (one line naming the field) when a required field is missing or any field in
    HEADER_FIELDS holds a value of the wrong type or range, so no reader meets one later."""
    for key in REQUIRED_HEADER_FIELDS:
        if key not in header:
            raise ValueError(f"header field {key!r} is missing")
    for key, value in header.items():
        rule = HEADER_FIELDS.get(key)
        if rule is not None and not rule[0](value):
            shown = repr(value)
            shown = shown if len(shown) <= 40 else shown[:39] + "…"
            raise ValueError(f"header field {key!r} must be {rule[1]}, got {shown}")
    if "kv_cache_groups" in header and header.get("version", GROUPS_FORMAT_VERSION) < GROUPS_FORMAT_VERSION:
        raise ValueError(f"header field 'kv_cache_groups' needs format version {GROUPS_FORMAT_VERSION}, "
                         f"the header says {header['version']}")
    if "kv_cache_groups" in header and not design_of(header).groups:
        raise ValueError("header field 'kv_cache_groups' is for a v1 run (kv_manager \"v1\"): v0 has one group")


def _check_pools(header: dict[str, Any], file_bytes: int | None) -> None:
    """The block size and pools a header may declare: what its own memory figures hold, and what
    the reader can keep a record of for a file this size."""
    block_size, num_gpu, num_cpu = (header[key] for key in REQUIRED_HEADER_FIELDS)
    if block_size > MAX_BLOCK_SIZE:
        raise ValueError(f"block size {block_size} is above the {MAX_BLOCK_SIZE} tokens a trace may have")
    block_bytes, total_bytes = header.get("block_bytes"), header.get("total_bytes")
    if block_bytes is not None:
        if total_bytes is not None and num_gpu * block_bytes > total_bytes:
            raise ValueError(f"{num_gpu} GPU blocks of {block_bytes} bytes do not fit in the "
                             f"{total_bytes} bytes the header gives them (total_bytes)")
        for device, count in (("GPU", num_gpu), ("CPU", num_cpu)):
            if count * block_bytes > MAX_DEVICE_BYTES:
                raise ValueError(f"{count} {device} blocks of {block_bytes} bytes are more memory than any "
                                 f"device holds ({MAX_DEVICE_BYTES >> 40} TiB)")
    allowed = MIN_POOL_BLOCKS if file_bytes is None else max(MIN_POOL_BLOCKS, file_bytes // FILE_BYTES_PER_BLOCK)
    if num_gpu + num_cpu > allowed:
        raise ValueError(f"the pools' {num_gpu} GPU + {num_cpu} CPU blocks are more than a trace of this "
                         f"size may declare ({allowed})")


def _check_nesting(value: Any) -> None:
    """ValueError when lists and objects nest deeper than MAX_NESTING (without recursion)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item
        for child in children:
            if isinstance(child, (list, dict)):
                if depth + 1 > MAX_NESTING:
                    raise ValueError(f"values nest more than {MAX_NESTING} deep")
                stack.append((child, depth + 1))


def _lines(stream: IO[bytes], name: str) -> Iterator[tuple[int, str]]:
    """(line number, text) for each line of a binary stream, each at most MAX_LINE_BYTES (a longer
    one raises TraceError before it is read whole)."""
    number = 1
    while True:
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not (len(raw) == MAX_LINE_BYTES + 1 and raw.endswith(b"\n")):
            raise TraceError(f"{name} line {number} is longer than {MAX_LINE_BYTES >> 20} MiB, "
                             "the most a trace line may hold")
        if number == 1 and raw.startswith(BOM):
            raw = raw[len(BOM):]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TraceError(f"{name} is not a blockviz trace (line {number} is not UTF-8 text)") from None
        yield number, text
        number += 1


def _event(text: str, checker: TraceChecker) -> Event:
    """One event line decoded, type-checked and checked against the state so far (ValueError)."""
    if text.count("[") + text.count("{") > MAX_NESTING:  # only then can it nest too deep
        try:
            data = json.loads(text)
        except RecursionError:
            raise ValueError(f"values nest more than {MAX_NESTING} deep") from None
        _check_nesting(data)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    event = event_from_dict(data)
    unknown = data.keys() - set(event.__struct_fields__) - {"type"}
    if unknown:  # a field the event kind does not have (a `group` on an event of no group) is refused, not dropped
        name = min(unknown)
        raise ValueError(f"{event.type} has no field {name[:40] + '…' if len(name) > 40 else name!r}")
    checker.check(event)
    return event


def read_trace(path: str | Path) -> Trace:
    """Read a whole trace; raise TraceError (one line) for any problem."""
    name = repr(str(path))
    path = Path(path)
    if not path.exists():
        raise TraceError(f"trace file {name} does not exist")
    if path.is_dir():
        raise TraceError(f"{name} is a directory, not a trace file")
    try:
        stream = open(path, "rb")
    except OSError as exc:
        raise TraceError(f"cannot read {name}: {exc.strerror or exc}") from None
    with stream:
        try:
            return _read_stream(stream, name, str(path), os.fstat(stream.fileno()).st_size)
        except OSError as exc:
            raise TraceError(f"cannot read {name}: {exc.strerror or exc}") from None


def _read_stream(stream: IO[bytes], name: str, path: str, file_bytes: int) -> Trace:
    lines = _lines(stream, name)
    first = next(lines, None)
    if first is None or not first[1].strip():
        empty = all(not text.strip() for _, text in lines)
        raise TraceError(f"{name} is not a blockviz trace (it is empty)" if empty
                         else f"{name} is not a blockviz trace (line 1 must be a {FORMAT_NAME!r} header)")
    header = parse_header(first[1], name, file_bytes)
    trace = Trace(safe_header(header), [], path)  # every string made safe to draw (safe_text.py)
    try:
        checker = TraceChecker(header["block_size"], header["num_gpu_blocks"], header["num_cpu_blocks"],
                               vocab_size=header.get("vocab_size"), file_bytes=file_bytes,
                               kv_manager=kv_manager_of(header), kv_cache_groups=kv_cache_groups_of(header))
    except ValueError as exc:
        raise TraceError(f"{name} line 1: {exc}") from None
    for number, line in lines:
        if not line.strip():
            continue
        try:
            event = _event(line, checker)
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            raise TraceError(f"{name} line {number} is corrupted: {reason}") from None
        trace.events.append(safe_struct(event))
    return trace


def shipped_traces() -> list[str]:
    """Names of the traces bundled in blockviz/traces/ (`blockviz replay NAME`, `Visualizer.from_trace(NAME)`)."""
    return sorted(path.stem for path in TRACES_DIR.glob("*.jsonl"))


def resolve_trace_path(name: str | Path) -> Path:
    """A path as given, else a shipped trace of that name (with or without .jsonl)."""
    path = Path(name)
    if path.exists():
        return path
    shipped = TRACES_DIR / (path.name if path.suffix == ".jsonl" else f"{path.name}.jsonl")
    if path.parent == Path(".") and shipped.is_file():
        return shipped
    return path


def load_trace(name: str | Path) -> Trace:
    """read_trace() of a path or a shipped trace's name; a missing one's TraceError lists the shipped names."""
    path = resolve_trace_path(name)
    try:
        return read_trace(path)
    except TraceError as exc:
        if path.exists() or not shipped_traces():
            raise
        raise TraceError(f"{exc} (shipped traces: {', '.join(shipped_traces())})") from None
