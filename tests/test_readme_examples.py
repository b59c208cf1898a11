"""The README's command examples do what their comments say, run as written (through the CLI's
main, on the bundled model): the lines are read from README.md, so an example edited there is the
one tested here."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

from blockviz.cli import main

README = Path(__file__).resolve().parent.parent / "README.md"


def example(start: str) -> list[str]:
    """The README's command line that begins with `start`, as arguments after `blockviz` (its
    trailing comment dropped)."""
    lines = [line for line in README.read_text(encoding="utf-8").splitlines() if line.startswith(start)]
    assert len(lines) == 1, f"README has {len(lines)} lines starting {start!r}"
    words = shlex.split(re.split(r"\s+#", lines[0])[0])
    assert words[0] == "blockviz"
    return words[1:]


def test_compare_with_caching_on_hits_and_off_does_not(capsys):
    args = example("blockviz compare --block-size 4,16 --prefix-caching on,off")
    assert main([*args, "--json"]) == 0
    runs = json.loads(capsys.readouterr().out)["runs"]
    assert len(runs) == 4 and {r["block_size"] for r in runs} == {4, 16}
    for run in runs:  # the default prompts share an opening: a hit at every block size, with caching on
        assert (run["prefix_hits"] > 0) == run["prefix_caching"], run
        assert run["same_text_as_first"]


def test_compare_v0_v1_forks_in_v0_and_hits_in_v1(capsys):
    args = example("blockviz compare --kv-manager v0,v1")
    assert main([*args, "--json"]) == 0
    v0, v1 = json.loads(capsys.readouterr().out)["runs"]
    assert v0["kv_manager"] == "v0" and v0["forks"] > 0 and v0["copies_on_write"] > 0
    assert v1["kv_manager"] == "v1" and v1["forks"] == 0 and v1["copies_on_write"] == 0 and v1["prefix_hits"] > 0


def test_record_with_recompute_preempts_and_recomputes(tmp_path, monkeypatch):
    from blockviz.model.trace import read_trace

    args = example("blockviz record --out run.jsonl --preemption-mode recompute")
    monkeypatch.chdir(tmp_path)
    assert main(args) == 0
    trace = read_trace(tmp_path / "run.jsonl")
    preempted = [e for e in trace.events if e.type == "preempted"]
    assert preempted and all(e.mode == "recompute" for e in preempted)
    victim = preempted[0].seq_ids[0]
    after = trace.events[trace.events.index(preempted[0]):]
    assert any(e.type == "step_started" and e.kind == "prefill" and victim in e.seq_ids for e in after)
    assert sum(e.type == "sequence_finished" and e.reason == "length" for e in trace.events) == 2


def test_generate_n2_gives_two_different_completions(capsys):
    args = example('blockviz generate --prompt "ROMEO:" --n 2')
    assert main(args) == 0
    (request,) = json.loads(capsys.readouterr().out)["requests"]
    first, second = request["completions"]
    assert first["token_ids"] != second["token_ids"]
    assert main(args) == 0  # the seed makes it reproducible
    (again,) = json.loads(capsys.readouterr().out)["requests"]
    assert [c["token_ids"] for c in again["completions"]] == [first["token_ids"], second["token_ids"]]


def test_generate_n2_greedy_says_the_completions_are_the_same(capsys):
    assert main(["generate", "--prompt", "ROMEO:", "--n", "2", "--max-tokens", "2", "--temperature", "0",
                 "--json"]) == 0
    captured = capsys.readouterr()
    assert "greedy" in captured.err and "--temperature 1.0" in captured.err
    (request,) = json.loads(captured.out)["requests"]
    assert request["completions"][0]["token_ids"] == request["completions"][1]["token_ids"]


def test_explain_shows_a_hit_and_why_the_first_request_missed(capsys):
    args = example("blockviz explain --block-size 4")
    assert main(args) == 0
    out = capsys.readouterr().out
    first, second = out.split("request 1 ")
    assert "first miss at L0: not cached: the cache is empty" in first
    assert "hit: gpu block" in second and "prefix hit: 1 block, 4 tokens" in second


@pytest.mark.parametrize("start", ["blockviz compare --block-size 4,16 --tui"])
def test_the_tui_examples_parse(start):
    from blockviz.cli import build_parser

    args = build_parser().parse_args(example(start))
    assert args.tui and args.block_size == [4, 16] and args.kv_manager == ["v0"]
