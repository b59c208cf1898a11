"""A disk cache of what reading a GGUF file produces: the config, the dequantized state dict (as
safetensors), the tokenizer facts and the tokenizer (saved with `save_pretrained`), so a second
load of the same file reads them back instead of dequantizing every tensor and parsing the
file's vocabulary again.

References: transformers' `PreTrainedTokenizerBase.save_pretrained` / `from_pretrained` (the
tokenizer round trip), safetensors' `save_file` / `load_file`, and the Hugging Face hub cache
(`huggingface_hub.file_download`: a download lands in a temporary file and is renamed into place).

Where: $BLOCKVIZ_CACHE_DIR, else $XDG_CACHE_HOME/blockviz, else ~/.cache/blockviz; under it
`gguf/<key>/`, the key a hash of the GGUF file's resolved path and the dtype. The entry's
meta.json records the file's size and mtime: an entry whose file changed since (stale), or that
cannot be read (a partial copy, a corrupt file), is ignored and written again. An entry is built
in a temporary directory beside it and renamed into place, so a reader sees a whole entry or none.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.models.llama import LlamaConfig

logger = logging.getLogger(__name__)

CACHE_ENV = "BLOCKVIZ_CACHE_DIR"
FORMAT = 1  # bumped when an entry's layout changes: older entries then read as stale
_WEIGHTS = "model.safetensors"
_META = "meta.json"
_TOKENIZER = "tokenizer"


@dataclass(slots=True)
class CachedGGUF:
    """What a GGUF load needs: `load_gguf`'s three results and the tokenizer."""

    config: LlamaConfig
    state_dict: dict[str, torch.Tensor]
    facts: dict  # bos_token_id, eos_token_id, chat_template
    tokenizer: Any


def cache_root() -> Path:
    """The blockviz cache directory: $BLOCKVIZ_CACHE_DIR, $XDG_CACHE_HOME/blockviz or ~/.cache/blockviz."""
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "blockviz"


def file_stamp(path: Path) -> dict:
    """What makes an entry current: the GGUF file's size and modification time."""
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def entry_dir(path: Path, dtype: torch.dtype, root: Path | None = None) -> Path:
    """The entry of a GGUF file loaded in `dtype`: one directory per (resolved path, dtype)."""
    key = hashlib.sha256(f"{Path(path).resolve()}\0{dtype}".encode()).hexdigest()[:32]
    return (root if root is not None else cache_root()) / "gguf" / key


def read_entry(path: Path, dtype: torch.dtype, load_tokenizer, root: Path | None = None) -> CachedGGUF | None:
    """The cached load of `path` in `dtype`, or None when there is none, it is stale (the file's
    size or mtime changed, or another FORMAT) or it cannot be read. `load_tokenizer(directory)`
    loads the saved tokenizer (AutoTokenizer.from_pretrained)."""
    entry = entry_dir(path, dtype, root)
    if not entry.is_dir():
        return None
    try:
        meta = json.loads((entry / _META).read_text(encoding="utf-8"))
        if meta.get("format") != FORMAT or meta.get("file") != str(Path(path).resolve()) \
                or meta.get("stamp") != file_stamp(Path(path)) or meta.get("dtype") != str(dtype):
            logger.info("the cached load of %s is stale: reading the file again", path)
            return None
        from safetensors.torch import load_file

        settings = meta["config"]
        if settings.get("layer_types") is not None:
            settings["layer_types"] = tuple(settings["layer_types"])
        config = LlamaConfig(**settings)
        state_dict = load_file(str(entry / _WEIGHTS))
        if any(tensor.dtype != dtype for tensor in state_dict.values()):
            raise ValueError(f"tensors not in {dtype}")
        tokenizer = load_tokenizer(str(entry / _TOKENIZER))
    except Exception as exc:  # any damage to an entry means reading the GGUF file again
        logger.warning("the cached load of %s cannot be read (%s): reading the file again", path,
                       str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return None
    return CachedGGUF(config, state_dict, meta["facts"], tokenizer)


def write_entry(path: Path, dtype: torch.dtype, loaded: CachedGGUF, root: Path | None = None) -> bool:
    """Save `loaded` as the entry of `path` in `dtype`: built in a temporary directory, then renamed
    over the old entry. Returns False (and logs why) when the cache cannot be written: a load
    never fails for its cache."""
    from safetensors.torch import save_file

    entry = entry_dir(path, dtype, root)
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        building = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    except OSError as exc:
        logger.warning("cannot write the GGUF cache under %s: %s", entry.parent, exc)
        return False
    try:
        save_file({name: tensor.contiguous() for name, tensor in loaded.state_dict.items()},
                  str(building / _WEIGHTS))
        loaded.tokenizer.save_pretrained(str(building / _TOKENIZER))
        meta = {"format": FORMAT, "file": str(Path(path).resolve()), "stamp": file_stamp(Path(path)),
                "dtype": str(dtype), "config": dataclasses.asdict(loaded.config), "facts": loaded.facts}
        (building / _META).write_text(json.dumps(meta), encoding="utf-8")  # last: its presence marks a whole entry
        if entry.exists():  # stale or damaged: moved aside, then removed
            old = Path(tempfile.mkdtemp(prefix=f".{entry.name}-old-", dir=entry.parent))
            entry.rename(old / "entry")
            shutil.rmtree(old, ignore_errors=True)
        building.rename(entry)
        return True
    except Exception as exc:  # another process renamed its entry first, a full disk, a read-only cache
        logger.warning("cannot write the GGUF cache entry %s: %s", entry, exc)
        return False
    finally:
        shutil.rmtree(building, ignore_errors=True)
