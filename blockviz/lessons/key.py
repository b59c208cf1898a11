"""The answer key to the lessons' exercises, kept apart from lessons/ so the notebooks can be handed
out as stored (blank answers).

Each entry is the source of an answer cell, as a teacher would fill it in. To write filled copies
of the notebooks (a teacher's solved set), without touching lessons/:

    python3 -m blockviz.lessons.key lessons/ solved/

It refuses (one line, exit 2, nothing written) a destination that is lessons/ or inside it, a
notebook that is not JSON or has an exercise the key lacks, a destination file that is a symbolic
link, and an existing file unless `--force`; each copy is written whole (a temporary file renamed).
`fill(notebook)` does the same to one notebook read as JSON (the lessons test uses it).

Variants (blockviz.lessons.variants): for a lab, each student gets the lessons that have variants
with their own figures, seeded from their id:

    python3 -m blockviz.lessons.key --variants roster.csv OUT_DIR   # OUT_DIR/ID/10_vllm_v1.ipynb ...
    python3 -m blockviz.lessons.key --variant ID                   # that student's answer key

The roster is a CSV with an `id` (or `student`) column, or ids in its first column. A variant's
notebook carries metadata.blockviz {"lesson", "student", "variant"} and calls
`variants.use(SEED)` in its first code cell; its text states the variant's figures.
"""

from __future__ import annotations

import csv
import json
import os
import re
import sys
import secrets
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
    "11.mqa_bytes": "my_mqa_bytes = 8_192  # 32 layers x 2 x 1 K/V head x 64 x 2 bytes",
    "11.mla_block": "my_mla_block = 1_124_352  # 16 x 61 layers x (512 + 64) x 2 bytes, one latent, no V",
    "11.fp8_tokens": "my_fp8_tokens = 16_384  # 2**30 // (32 x 2 x 8 x 128 x 1 byte)",
    "11.window_blocks": "my_window_blocks = 9  # cdiv(128 - 1, 16) + 1: the window straddles a block boundary",
    "11.floor_hits": "my_floor_hits = 0  # 15 tokens never fill a 16-token block: nothing is cached",
    "11.big_block_hits": "my_big_block_hits = 0  # the first 64-token block holds the questions too: different tokens",
    "11.window_hit": "my_window_hit = 8  # the window group lost the block a 12-token hit ends on",
    "12.concurrency": "my_concurrency = 2.5  # 40 blocks / cdiv(256, 16) = 16 blocks a request: vLLM logs 2.50x",
    "12.pool_bytes": "my_pool_bytes = 5_242_880  # all 40 blocks of 131,072 B, allocated at start",
    "12.estimated_len": "my_estimated_len = 128  # 1 MiB // 131,072 B = 8 whole blocks of 16 tokens",
    "12.victim": "my_victim = \"C\"  # first come, first served: the last of the running list goes first",
    "12.admitted_step": "my_admitted_step = 6  # A samples its last token in step 4; step 5 is planned before that token is processed",
    "12.usage_after": "my_usage_after = 0.0  # cached blocks no request holds are on the free queue",
    "12.turn2_hits": "my_turn2_hits = 48  # 49 tokens computed: 3 full blocks; the fourth is partly filled",
    "12.different": "my_different = 0  # the cache returns the numbers it computed; here the kernels agree too",
    "12.hybrid_hits": "my_hybrid_hits = 12  # num_tokens - 1 = 15 tokens, in whole blocks of 4, in every group",
    "12.kv_option": "my_kv_option = \"kv_offloading_size\"  # cpu_offload_gb moves weights",
    "13.vllm_hits": "my_vllm_hits = 32  # 2 full blocks of the 40-token system prompt; the third mixes in A's message",
    "13.sglang_hits": "my_sglang_hits = 40  # the whole system prompt: pages of one token",
    "13.partial_cost": "my_partial_cost = 9  # SGLang 57 (50 + 8 - 1 computed) - vLLM 48 (3 full blocks)",
    "13.sglang_free": "my_sglang_free = 8  # 112 slots - 104 the tree holds",
    "13.sglang_evicted": "my_sglang_evicted = 38  # whole leaves, oldest first, until at least 40 - 8 = 32",
    "13.vllm_evicted": "my_vllm_evicted = 2  # C takes 3 blocks: the one never hashed, then 2 cached ones",
    "13.page16_hits": "my_page16_hits = 32  # the key is cut to whole pages of 16",
}


def _metadata(cell: dict[str, Any]) -> dict[str, Any]:
    metadata = cell.get("metadata")
    return metadata if isinstance(metadata, dict) else {}


def _exercise_of(cell: dict[str, Any]) -> str | None:
    ours = _metadata(cell).get("blockviz")
    return ours.get("exercise") if isinstance(ours, dict) else None


def _is_answer(cell: dict[str, Any]) -> bool:
    tags = _metadata(cell).get("tags")
    return isinstance(tags, list) and "answer" in tags


def fill(notebook: dict[str, Any]) -> dict[str, Any]:
    """The notebook (nbformat JSON) with every answer cell's source replaced by the key's."""
    for cell in notebook["cells"]:
        if _is_answer(cell):
            cell["source"] = KEY[_exercise_of(cell)]
    return notebook


class KeyWriteError(ValueError):
    """A solved copy that cannot be written as asked; str() is one line."""


def _filled(path: Path) -> str:
    """The text of `path`'s notebook filled with the key, or KeyWriteError naming what is wrong."""
    try:
        notebook = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise KeyWriteError(f"{path} is not a readable notebook ({str(exc).splitlines()[0]})") from None
    if not isinstance(notebook, dict) or not isinstance(notebook.get("cells"), list) or not all(
            isinstance(cell, dict) for cell in notebook["cells"]):
        raise KeyWriteError(f"{path} is not a notebook (no list of cells)")
    for number, cell in enumerate(notebook["cells"], 1):
        exercise = _exercise_of(cell)
        if _is_answer(cell) and (not isinstance(exercise, str) or exercise not in KEY):
            raise KeyWriteError(f"{path} cell {number}: exercise {exercise!r} has no answer in the key")
    return json.dumps(fill(notebook), indent=1, ensure_ascii=False) + "\n"


def _check_out(source: Path, out: Path) -> None:
    """KeyWriteError when `out` is the lessons' own directory or inside it, or not a directory."""
    try:
        src, dst = source.resolve(), out.resolve()
    except (OSError, RuntimeError) as exc:  # a loop of links
        raise KeyWriteError(f"cannot resolve {out}: {exc}") from None
    if dst == src or src in dst.parents:
        raise KeyWriteError(f"{out} is inside {source}: the solved copies would replace the students' "
                            "notebooks; give a directory outside it")
    if out.exists() and not out.is_dir():
        raise KeyWriteError(f"{out} is not a directory")


def _check_target(target: Path, force: bool) -> None:
    """KeyWriteError when writing `target` would go through a link, replace a directory, or replace a
    file without `force`."""
    if target.is_symlink():
        raise KeyWriteError(f"{target} is a symbolic link: the key never writes through one; remove it")
    if target.is_dir():
        raise KeyWriteError(f"{target} is a directory")
    if target.exists() and not force:
        raise KeyWriteError(f"{target} already exists: give another directory, or --force to replace it")


def _write_atomically(target: Path, text: str) -> None:
    """Write `text` to a new temporary file beside `target`, sync it, then rename it over `target`:
    a reader sees the old file or the whole new one, never half of one. The file is created with
    mode 0o666 less the user's umask, as `open(target, "w")` would create it (tempfile.mkstemp's
    0o600 would hide a teacher's solved copies from the people they share a folder with)."""
    temporary = target.parent / f".{target.name}.{os.getpid()}.{secrets.token_hex(4)}.part"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as stream:
            stream.write(text)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def write_solved(source: Path, out: Path, *, force: bool = False) -> list[Path]:
    """Write each lesson notebook of `source` filled with the key to `out` (created if needed) and
    return the paths written. Everything is checked before anything is written: `out` outside
    `source`, every notebook readable JSON whose every answer cell has a key entry, no target a
    link or a directory, and no existing target unless `force`; each file is written atomically.
    Raises KeyWriteError (one line) for the first thing wrong."""
    paths = sorted(source.glob("[0-9][0-9]_*.ipynb"))
    if not source.is_dir() or not paths:
        raise KeyWriteError(f"no lesson notebooks in {source}")
    _check_out(source, out)
    solved = [(out / path.name, _filled(path)) for path in paths]
    for target, _ in solved:
        _check_target(target, force)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KeyWriteError(f"cannot make {out}: {exc.strerror or exc}") from None
    for target, text in solved:
        try:
            _write_atomically(target, text)
        except OSError as exc:
            raise KeyWriteError(f"cannot write {target}: {exc.strerror or exc}") from None
    return [target for target, _ in solved]


LESSONS_DIR = Path(__file__).resolve().parents[2] / "lessons"
_STUDENT_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@-]{0,63}")


def read_roster(path: Path) -> list[str]:
    """The student ids of a roster CSV: its `id` or `student` column when its first row names one,
    else its first column. KeyWriteError (one line) for an unreadable file, an id that cannot be a
    file name (letters, digits, . _ @ -), a repeated id, or no id at all."""
    try:
        rows = [row for row in csv.reader(path.read_text(encoding="utf-8-sig").splitlines()) if any(c.strip() for c in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise KeyWriteError(f"cannot read the roster {path}: {exc}") from None
    column = 0
    if rows:
        header = [cell.strip().lower() for cell in rows[0]]
        named = [header.index(name) for name in ("id", "student") if name in header]
        if named:
            column, rows = named[0], rows[1:]
    ids = [row[column].strip() if column < len(row) else "" for row in rows]
    for number, student in enumerate(ids, 1):
        if not _STUDENT_ID.fullmatch(student):
            raise KeyWriteError(f"{path} row {number}: {student!r} is not a student id (letters, digits, . _ @ -)")
    repeated = sorted({s for s in ids if ids.count(s) > 1})
    if repeated:
        raise KeyWriteError(f"{path}: the id {repeated[0]!r} appears more than once")
    if not ids:
        raise KeyWriteError(f"{path}: no student ids")
    return ids


def lesson_of(path: Path) -> str:
    """The lesson number of a lesson notebook's file name ("10" for 10_vllm_v1.ipynb)."""
    return path.name[:2]


def _import_lesson(lesson: str):
    import importlib

    return importlib.import_module(f"blockviz.lessons.lesson{lesson}")


def variant_notebook(notebook: dict[str, Any], lesson: str, student: str) -> dict[str, Any]:
    """The lesson's notebook as `student`'s variant: notebook metadata.blockviz names the lesson,
    the student and the seed, the first code cell makes that seed the variant (`variants.use`),
    and the text states the variant's figures (the lesson module's VARIANT_TEXT)."""
    from blockviz.lessons import variants

    module = _import_lesson(lesson)
    seed = variants.seed_of(student, lesson)
    notebook = json.loads(json.dumps(notebook))
    notebook.setdefault("metadata", {})["blockviz"] = {"lesson": lesson, "student": student, "variant": seed}
    anchor = f"from blockviz.lessons import lesson{lesson} as lesson\n"
    first = next(cell for cell in notebook["cells"] if cell.get("cell_type") == "code")
    source = "".join(first["source"])
    if anchor not in source:
        raise KeyWriteError(f"lesson {lesson}'s first code cell does not import its lesson module")
    source = source.replace(anchor, anchor + f"from blockviz.lessons import variants\n"
                                             f"variants.use({seed})  # your own variant of this lesson: keep this line\n", 1)
    first["source"] = source.splitlines(keepends=True)
    previous = variants.active()
    variants.use(seed)
    try:
        fields = variants.fields(lesson)
    finally:
        variants.use(previous)
    for cell in notebook["cells"]:
        text = "".join(cell.get("source", []))
        for stored, template in getattr(module, "VARIANT_TEXT", ()):
            text = text.replace(stored, template.format_map(fields))
        cell["source"] = text.splitlines(keepends=True)
    return notebook


def variant_answers(lesson: str, student: str | int) -> dict[str, str]:
    """The answer key of `student`'s variant of `lesson` (or of the seed given as an int): each
    exercise's answer cell, computed on that variant's engine runs."""
    from blockviz.lessons import EXERCISES, variants

    _import_lesson(lesson)
    seed = student if isinstance(student, int) else variants.seed_of(student, lesson)
    previous = variants.active()
    variants.use(seed)
    try:
        return {ex.id: f"{ex.variable} = {ex.truth()!r}  # variant {seed}"
                for ex in EXERCISES.values() if ex.lesson == lesson}
    finally:
        variants.use(previous)


def write_variants(roster: Path, out: Path, *, source: Path = LESSONS_DIR, force: bool = False) -> list[Path]:
    """Write OUT/ID/NOTEBOOK for each student of `roster` and each lesson of `source` that has
    variants; checked whole before anything is written, as write_solved is."""
    from blockviz.lessons import load_all, variants

    load_all()
    students = read_roster(roster)
    paths = [p for p in sorted(source.glob("[0-9][0-9]_*.ipynb")) if variants.has_variants(lesson_of(p))]
    if not paths:
        raise KeyWriteError(f"no lesson with variants in {source}")
    _check_out(source, out)
    notebooks = []
    for path in paths:
        try:
            notebooks.append((path, json.loads(path.read_text(encoding="utf-8"))))
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise KeyWriteError(f"{path} is not a readable notebook ({str(exc).splitlines()[0]})") from None
    planned = [(out / student / path.name,
                json.dumps(variant_notebook(notebook, lesson_of(path), student), indent=1, ensure_ascii=False) + "\n")
               for student in students for path, notebook in notebooks]
    for target, _ in planned:
        _check_target(target, force)
    for target, text in planned:
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(target, text)
        except OSError as exc:
            raise KeyWriteError(f"cannot write {target}: {exc.strerror or exc}") from None
    return [target for target, _ in planned]


USAGE = ("usage: python3 -m blockviz.lessons.key [--force] LESSONS_DIR OUT_DIR | "
         "--variants ROSTER.csv OUT_DIR [--force] | --variant ID")


def main(argv: list[str]) -> int:
    """`python3 -m blockviz.lessons.key [--force] LESSONS_DIR OUT_DIR` (or --variants ROSTER OUT_DIR,
    or --variant ID): 0 with the paths written (or the variant's key) on stdout, or 2 with one line
    on stderr and nothing written."""
    force = "--force" in argv
    args = [arg for arg in argv if arg != "--force"]
    mode = args[0] if args and args[0] in ("--variants", "--variant") else None
    if mode is not None:
        args = args[1:]
    wanted = 1 if mode == "--variant" else 2
    if len(args) != wanted or any(arg.startswith("-") for arg in args):
        print(USAGE, file=sys.stderr)
        return 2
    try:
        if mode == "--variant":
            from blockviz.lessons import load_all, variants

            load_all()
            if not _STUDENT_ID.fullmatch(args[0]):
                raise KeyWriteError(f"{args[0]!r} is not a student id (letters, digits, . _ @ -)")
            for lesson in sorted({ex.lesson for ex in load_all().values() if variants.has_variants(ex.lesson)}):
                print(f"# lesson {lesson}, {args[0]}'s variant {variants.seed_of(args[0], lesson)}")
                for exercise_id, answer in variant_answers(lesson, args[0]).items():
                    print(f"{exercise_id}: {answer}")
            return 0
        if mode == "--variants":
            written = write_variants(Path(args[0]), Path(args[1]), force=force)
        else:
            written = write_solved(Path(args[0]), Path(args[1]), force=force)
    except KeyWriteError as exc:
        print(f"blockviz.lessons.key: error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
