"""Token ids as text for `blockviz attach --tokenizer NAME_OR_PATH`.

vLLM's BlockStored events carry token ids only; with the served model's tokenizer they read as
text. Loading never imports torch: a tokenizer.json goes through the `tokenizers` library
(the bundled model's name, a file, a checkpoint directory, or a hub name already in the local
cache); anything else through transformers' AutoTokenizer, imported only then.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

from blockviz.model.palette import show_tokens
from blockviz.model.safe_text import safe_token


class TokenText:
    """Renders token ids: each id's text piece when a tokenizer was given, else the ids."""

    def __init__(self, decode_one: Callable[[int], str] | None = None, name: str | None = None) -> None:
        self.name = name
        self._piece = lru_cache(maxsize=65_536)(decode_one) if decode_one is not None else None

    @property
    def has_tokenizer(self) -> bool:
        return self._piece is not None

    def text(self, token_ids: Sequence[int]) -> str:
        """The tokens' text with spaces and newlines made visible, or the ids joined by spaces. A
        tokenizer's pieces are data: each is made safe to draw first (safe_text.safe_token)."""
        if self._piece is None:
            return " ".join(str(t) for t in token_ids)
        return "".join(show_tokens([safe_token(self._piece(t)) for t in token_ids]))


def load_tokenizer(name_or_path: str) -> TokenText:
    """A TokenText for a tokenizer; a ValueError (one line) when it cannot be loaded."""
    if name_or_path.startswith(("/", "./", "../", "~")) and not Path(name_or_path).expanduser().exists():
        raise ValueError(f"--tokenizer {name_or_path}: no such file or directory")
    path = _tokenizer_json(name_or_path)
    try:
        if path is not None:
            from tokenizers import Tokenizer

            tokenizer = Tokenizer.from_file(str(path))
            return TokenText(lambda t: tokenizer.decode([t], skip_special_tokens=False), name_or_path)
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(name_or_path)
        return TokenText(lambda t: auto.decode([t]), name_or_path)
    except Exception as exc:  # noqa: BLE001 - any failure to load is the same user mistake
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ValueError(f"--tokenizer {name_or_path}: cannot load a tokenizer ({first})") from None


def _tokenizer_json(name_or_path: str) -> Path | None:
    """The tokenizer.json to read with `tokenizers`, when there is one without asking the hub."""
    from engine.model_source import BUNDLED_MODELS_DIR, checkpoint_file

    bundled = BUNDLED_MODELS_DIR / name_or_path / "tokenizer.json"
    if "/" not in name_or_path and bundled.is_file():
        return bundled
    path = Path(name_or_path).expanduser()
    if path.is_file():
        return path
    return checkpoint_file(path if path.is_dir() else name_or_path, "tokenizer.json")
