"""Time travel's snapshots go by field name: every field of a block and a sequence survives a
freeze and a thaw, whatever order the dataclass declares them in."""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from blockviz.model.reducer import BlockState, ReducerState, SeqState, _Snapshot


def _distinct(cls, **containers):
    """An instance whose every field holds a value of its own (not a default)."""
    values = {}
    for number, f in enumerate(fields(cls)):
        values[f.name] = containers.get(f.name, f"{f.name}-{number}" if f.type == "str" else 1000 + number)
    return cls(**values)


def test_every_field_of_a_block_and_a_sequence_round_trips():
    block = _distinct(BlockState, owners={3, 5}, token_ids=(7, 8), registered=True)
    seq = _distinct(SeqState, token_ids=[1, 2], token_texts=["a", "b"])
    state = ReducerState(4, 2, 1)
    state.pools["gpu"][0] = block
    state.seqs[seq.seq_id] = seq
    thawed = ReducerState.thaw(state.freeze())
    assert thawed.pools["gpu"][0] == block and thawed.seqs[seq.seq_id] == seq
    assert thawed.pools["gpu"][0].owners is not block.owners and thawed.seqs[seq.seq_id].token_ids is not seq.token_ids


def test_a_snapshot_follows_the_declared_order_of_fields():
    @dataclass(slots=True)
    class Reordered:
        owners: set[int] = field(default_factory=set)
        number: int = 0
        device: str = ""

    snapshot = _Snapshot(Reordered, owners=(tuple, set))
    thawed = snapshot.thaw(snapshot.freeze(Reordered({1, 2}, 7, "gpu")))
    assert thawed == Reordered({1, 2}, 7, "gpu") and isinstance(thawed.owners, set)
