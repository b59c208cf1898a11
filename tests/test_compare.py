"""`blockviz compare`: one workload under several settings, side by side."""

from __future__ import annotations

import pytest

from blockviz.cli import main


def test_compare_two_block_sizes_same_text_different_blocks(tiny_gpt2_dir, capsys):
    import json

    assert main(["compare", "--model", str(tiny_gpt2_dir), "--block-size", "2,8", "--num-gpu-blocks", "64",
                 "--prompt", "To be, or not to be", "--prompt", "The quick brown", "--max-tokens", "10",
                 "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    small, big = doc["runs"]
    assert (small["block_size"], big["block_size"]) == (2, 8)
    assert small["same_text_as_first"] and big["same_text_as_first"]  # greedy: the text does not depend on blocks
    assert small["peak_blocks"] > big["peak_blocks"]
    assert small["tokens"] == big["tokens"] == 20


def test_compare_refuses_a_bad_list_in_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["compare", "--prefix-caching", "maybe"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefix-caching takes on, off" in err
