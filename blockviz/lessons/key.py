"""The answer key to the lessons' exercises, kept apart from lessons/ so the notebooks can be handed
out as stored (blank answers).

Each entry is the source of an answer cell, as a teacher would fill it in. To write filled copies
of the notebooks (a teacher's solved set), without touching lessons/:

    python3 -m blockviz.lessons.key lessons/ solved/

`fill(notebook)` does the same to one notebook read as JSON (the lessons test uses it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

KEY: dict[str, str] = {
    "01.bytes": "my_bytes = 65_536  # 4 x 4 x 2 x 8 x 128 x 2",
    "01.blocks": "my_blocks = 1820  # 2**30 // 589_824, rounded down",
    "01.gqa_bytes": "my_gqa_bytes = 2_097_152  # 16 x 32 x 2 x 8 x 128 x 2",
    "02.blocks": "my_blocks = 8  # ceil(30 / 4): a partly filled last block is a whole block",
    "02.status": "my_status = AllocStatus.LATER  # 1 free block, and the watermark is 1 block",
    "03.step": "my_step = 7  # decode step k gives token 10 + k a slot; token 17 opens block 5",
    "04.ref_count": "my_ref_count = 3  # both branches and the new child",
    "05.hash": ("h = xxhash.xxh64()\n"
                "h.update(block1.block_hash.to_bytes(8, \"little\"))  # the parent's hash first\n"
                "h.update(array(\"q\", block2.token_ids).tobytes())\n"
                "my_hash = h.intdigest()"),
    "05.hits": "my_hits = 2  # 3 full blocks match, but the prompt's last block is computed",
    "06.blocks": "my_blocks = 5  # every block of the victim's table, the partly filled last one too",
    "07.block": "my_block = winter_table[2]  # the older chain, its deepest block",
    "08.fraction": "my_fraction = 0.75  # (256 - 64) / 256",
    "09.verdict": "my_verdict = \"different parent\"  # turn 2's blocks follow turn 1's hashes in the cache",
    "09.lost": "my_lost = 18  # every token that had K/V: all but the one sampled last",
    "09.empty": "my_empty = 4  # sum of 4 * ceil(t / 4) - t over the three sequences",
    "09.most_blocks": "my_most_blocks = 4  # the smallest blocks: the most of them for the same tokens",
    "09.ref_count": "my_ref_count = 2  # the parent and the child share every block after the fork",
    "10.child_hits": "my_child_hits = 2  # the two full blocks; the partly filled third one is not cached",
    "10.evicted": "my_evicted = hamlet_table[2]  # the chain's tail: freed last first, popped from the head",
    "10.served": "my_served = 20  # 5 blocks of the victim's chain were still cached",
    "10.aligned_hits": "my_aligned_hits = 2  # at most num_tokens - 1 = 11 tokens, in whole blocks",
    "10.chunk_steps": "my_chunk_steps = 3  # 8 + 8 + 4 tokens",
}


def _exercise_of(cell: dict[str, Any]) -> str | None:
    return cell.get("metadata", {}).get("blockviz", {}).get("exercise")


def fill(notebook: dict[str, Any]) -> dict[str, Any]:
    """The notebook (nbformat JSON) with every answer cell's source replaced by the key's."""
    for cell in notebook["cells"]:
        if "answer" in cell.get("metadata", {}).get("tags", []):
            cell["source"] = KEY[_exercise_of(cell)]
    return notebook


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python3 -m blockviz.lessons.key LESSONS_DIR OUT_DIR", file=sys.stderr)
        return 2
    source, out = Path(argv[0]), Path(argv[1])
    paths = sorted(source.glob("[0-9][0-9]_*.ipynb"))
    if not paths:
        print(f"no lesson notebooks in {source}", file=sys.stderr)
        return 2
    out.mkdir(parents=True, exist_ok=True)
    for path in paths:
        notebook = fill(json.loads(path.read_text()))
        (out / path.name).write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
        print(out / path.name)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
