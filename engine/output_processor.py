"""What a sampled token means for its sequence: the text it adds and whether the sequence stops.

`Detokenizer` follows vLLM v0 `vllm/transformers_utils/detokenizer.py` (decode_sequence_inplace),
more simply: the whole output is decoded again for each token rather than a window of offsets.
`StopChecker` follows vLLM v0 `vllm/engine/output_processor/stop_checker.py`.
`OutputProcessor` is what every design's `update_from_output` hands the step's sampled tokens to
(vLLM v0 `vllm/engine/output_processor/single_step.py` `SingleStepOutputProcessor`): forks, appends,
stop checks, detokenizes and emits the token and finish events; the design frees the blocks.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Callable, Iterator

from engine.events import EventBus, SequenceFinished, TokenGenerated
from engine.sequence import SamplingParams, Sequence, SequenceGroup, SequenceStatus

if TYPE_CHECKING:
    from engine.scheduler_output import SchedulerOutput


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


class OutputProcessor:
    """The step's sampled tokens applied to their sequences, for every design alike (vLLM v0
    SingleStepOutputProcessor.process_outputs; nano-vllm Scheduler.postprocess). A scheduler's
    `update_from_output(plan, sampled_token_ids)` calls `process_outputs` with how it frees a
    finished sequence's blocks and, for a design that forks, how it forks a sequence's blocks."""

    def __init__(self, stop_checker: StopChecker, detokenizer: Detokenizer | None = None,
                 events: EventBus | None = None, seq_counter: Iterator[int] | None = None) -> None:
        """`detokenizer` None: tokens add no text. `seq_counter`: where a fork's seq id comes from
        (the engine's, shared with its requests)."""
        self.stop_checker = stop_checker
        self.detokenizer = detokenizer
        self.events = events if events is not None else EventBus()
        self.seq_counter = seq_counter if seq_counter is not None else itertools.count()

    def process_outputs(self, plan: SchedulerOutput, sampled_token_ids: list[list[int]],
                        free: Callable[[Sequence], None],
                        fork_seq: Callable[[Sequence, Sequence], None] | None = None) -> list[SequenceGroup]:
        """Per scheduled row, its sampled tokens ([] for a row that samples nothing): the first is
        the sequence's; each further one is the first token of a branch forked from it now (vLLM v0:
        a prompt's row samples n tokens and the output processor forks n - 1 children). Each token
        is appended and its sequence stop-checked; a stopped sequence's blocks are freed (`free`)
        before its SequenceFinished. Returns the requests that finished, in row order."""
        finished: list[SequenceGroup] = []
        append_token = self.append_token
        for s, token_ids in zip(plan.scheduled, sampled_token_ids):
            if not token_ids:
                continue
            group, seq = s.group, s.seq
            if len(token_ids) == 1:
                append_token(group, seq, token_ids[0], free)
                if not seq.status.is_finished:  # the request goes on while this sequence does
                    continue
            else:
                if fork_seq is None:
                    raise ValueError("this design runs n > 1 as n requests: it has no fork")
                children = [self.fork(group, seq, fork_seq) for _ in token_ids[1:]]
                append_token(group, seq, token_ids[0], free)
                for child, token_id in zip(children, token_ids[1:]):
                    append_token(group, child, token_id, free)
            if group.is_finished() and group not in finished:
                finished.append(group)
        return finished

    def fork(self, group: SequenceGroup, parent: Sequence, fork_seq: Callable[[Sequence, Sequence], None]) -> Sequence:
        """A child of `parent` sharing all its blocks (vLLM v0 Sequence.fork + Scheduler.fork_seq), the
        request's next branch; it samples with the generator its branch drew its first token with
        (`group.generators`), if any."""
        child = parent.fork(next(self.seq_counter))
        group.add(child)
        fork_seq(parent, child)
        child.branch = len(group.seqs) - 1
        child.generator = group.generators.pop(child.branch, None)
        return child

    def append_token(self, group: SequenceGroup, seq: Sequence, token_id: int,
                     free: Callable[[Sequence], None]) -> None:
        """Append a sampled token, detokenize it, and finish the sequence if it should stop."""
        seq.append_token_id(token_id)
        stop = self.stop_checker.stop_reason(seq, group.sampling_params)
        piece = (self.detokenizer.decode_sequence_inplace(seq, final=stop is not None)
                 if self.detokenizer is not None else "")
        events = self.events
        if events.active:
            events.publish(TokenGenerated(next(events.seq_nos), seq_id=seq.seq_id, token_id=token_id, text=piece,
                                          position=seq.get_len() - 1))
        if stop is not None:
            seq.status, detail = stop
            free(seq)
            self.finish(group, seq, detail)

    def finish(self, group: SequenceGroup, seq: Sequence, detail: str) -> None:
        """SequenceFinished for a sequence whose status is already a finished one."""
        if seq.finish_detail:
            raise RuntimeError(f"sequence {seq.seq_id} finished twice ({seq.finish_detail!r}, then {detail!r})")
        seq.finish_detail = detail
        if self.events.active:
            self.events.emit(SequenceFinished, seq_id=seq.seq_id, request_id=group.request_id,
                             reason=seq.status.finish_reason or "", detail=detail)
