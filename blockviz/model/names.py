"""One name for a request wherever it is drawn: the cards, the block tables, the inspector, the
why panel, the preemption ledger and the event log all say "request 3", and add the sequence only
where the request has several (vLLM's SamplingParams.n > 1, or v0's forks): "request 3 (seq 4)",
"request 3 (seqs 4, 5)". A sequence whose request is not known is "seq 4".

`request_name` words one request; `RequestNames` names sequences by the requests a reducer state
holds at the cursor (ReducerState.requests: RequestAdded's seq_ids, then Sequence forks), so every
panel drawn at one cursor names a sequence the same way. No textual import.
"""

from __future__ import annotations

from typing import Iterable


def _seq_list(seq_ids: list[int]) -> str:
    return ("seq " if len(seq_ids) == 1 else "seqs ") + ", ".join(str(s) for s in seq_ids)


def request_name(request_id: str, seq_ids: Iterable[int] = (), num_seqs: int = 1) -> str:
    """"request 3"; with the sequences meant when the request has `num_seqs` > 1:
    "request 3 (seq 4)", "request 3 (seqs 4, 5)"."""
    seq_ids = list(seq_ids)
    if num_seqs > 1 and seq_ids:
        return f"request {request_id} ({_seq_list(seq_ids)})"
    return f"request {request_id}"


class RequestNames:
    """Names sequences by their requests as a reducer state holds them at its cursor
    (blockviz.model.reducer.ReducerState: `seqs` each with its request_id, `requests` each
    request's sequences). Called with sequence ids, it groups them by request in the order given:
    "request 3 (seqs 4, 5), request 6". With no state every sequence is "seq N"."""

    def __init__(self, state=None) -> None:
        self.seqs = state.seqs if state is not None else {}
        self.requests = state.requests if state is not None else {}

    def num_seqs(self, request_id: str) -> int:
        return len(self.requests.get(request_id, ()))

    def __call__(self, seq_ids: Iterable[int]) -> str:
        groups: dict[str | None, list[int]] = {}
        for seq_id in seq_ids:
            seq = self.seqs.get(seq_id)
            groups.setdefault(seq.request_id if seq is not None else None, []).append(seq_id)
        none = groups.pop(None, None)
        parts = [request_name(request, seqs, self.num_seqs(request)) for request, seqs in groups.items()]
        return ", ".join(parts + ([_seq_list(none)] if none else []))

    def request(self, request_id: str, seq_ids: Iterable[int] = ()) -> str:
        """A request named by its id, with `seq_ids` where it has several sequences."""
        seq_ids = list(seq_ids)
        return request_name(request_id, seq_ids, self.num_seqs(request_id) or len(seq_ids))
