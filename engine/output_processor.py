"""What a sampled token means for its sequence: the text it adds and whether the sequence stops.

`Detokenizer` follows vLLM v0 `vllm/transformers_utils/detokenizer.py` (decode_sequence_inplace),
more simply: the whole output is decoded again for each token rather than a window of offsets.
`StopChecker` follows vLLM v0 `vllm/engine/output_processor/stop_checker.py`.
"""

from __future__ import annotations

from typing import Any, Callable

from engine.sequence import SamplingParams, Sequence, SequenceStatus


def _decoder(tokenizer: Any) -> Callable[..., str]:
    """The tokenizer's decode without its public wrapper: `decode` first walks every id through
    `to_py_obj` (a generator and an `all()` per call); `_decode` is the same decoding and clean-up
    that `decode` then calls."""
    inner = getattr(tokenizer, "_decode", None)
    return inner if callable(inner) else tokenizer.decode


class Detokenizer:
    """Keeps `Sequence.output_text` up to date as tokens are appended."""

    def __init__(self, tokenizer: Any) -> None:
        self._decode = _decoder(tokenizer)

    def decode_sequence_inplace(self, seq: Sequence, final: bool) -> str:
        """Update `seq.output_text` for its newest token and return the text that token added:
        "" while a multi-byte character is split across tokens, unless the sequence is `final`."""
        text = self._decode(seq.output_token_ids, skip_special_tokens=True)
        if text.endswith("\ufffd") and not final:
            return ""  # wait for the rest of the character
        piece = text[len(seq.output_text):] if text.startswith(seq.output_text) else text
        seq.output_text = text
        return piece


class StopChecker:
    """Whether a sequence stops after its newest token (vLLM v0 StopChecker.maybe_stop_sequence)."""

    def __init__(self, eos_token_id: int | None, max_model_len: int) -> None:
        self.eos_token_id = eos_token_id
        self.max_model_len = max_model_len

    def stop_reason(self, seq: Sequence, params: SamplingParams) -> tuple[SequenceStatus, str] | None:
        """(finished status, detail) on EOS (unless ignore_eos), a stop token, max_tokens or a full
        model context; None while the sequence goes on."""
        token_id = seq.get_last_token_id()
        if not params.ignore_eos and token_id == self.eos_token_id:
            return SequenceStatus.FINISHED_STOPPED, "end of text"
        if token_id in params.stop_token_ids:
            return SequenceStatus.FINISHED_STOPPED, f"stop token {token_id}"
        if seq.get_output_len() >= params.max_tokens:
            return SequenceStatus.FINISHED_LENGTH_CAPPED, f"max_tokens {params.max_tokens}"
        if seq.get_len() >= self.max_model_len:
            return SequenceStatus.FINISHED_LENGTH_CAPPED, f"model context {self.max_model_len}"
        return None
