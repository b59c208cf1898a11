"""The lessons (lessons/*.ipynb) and their exercises (blockviz/lessons/): stored stripped with blank
answers, shaped as a lesson, and each one run top to bottom headless on the bundled model
(nbclient, a fresh kernel each) as stored, then with the answer key, each stored wrong answer and
the blank again, every check cell three times in a row.

The kernel is the "python3" kernel of this very interpreter (ipykernel installed beside pytest), so
a machine with some other "python3" kernelspec on its Jupyter path runs the lessons here too.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
from optional_parts import lazy_importorskip, needs_sglang

from blockviz.lessons import LESSONS as LESSON_NUMBERS
from blockviz.lessons import load_all
from blockviz.lessons.checks import CORRECT, UNANSWERED, WRONG, Exercise, Slip, close_to, show
from blockviz.lessons.key import KEY, fill, main as key_main

nbformat = lazy_importorskip("nbformat")  # imported by the first test that reads a notebook
nbclient = lazy_importorskip("nbclient")
pytest.importorskip("ipykernel")

ROOT = Path(__file__).resolve().parent.parent
LESSONS_DIR = ROOT / "lessons"
LESSONS = sorted(LESSONS_DIR.glob("[0-9][0-9]_*.ipynb"))
NEEDS = {"13": needs_sglang}  # lessons that run a design of another project, and the mark that skips them without it
# each lesson as a test parameter, marked with what its kernel needs installed
RUNNABLE = [pytest.param(p, marks=NEEDS[p.name[:2]]) if p.name[:2] in NEEDS else p for p in LESSONS]
EXERCISES = load_all()
CELL_TIMEOUT_S = 180  # a limit for a loaded machine, not a measurement (each lesson aims at <= 60 s)
RUNS = 3  # each check cell, run this many times in a row, gives one verdict
BLANK = re.compile(r"^(\w+) = \.\.\.(\s*#.*)?$")


def read(path: Path):
    return nbformat.read(path, as_version=4)


def tagged(notebook, tag: str) -> list:
    return [cell for cell in notebook.cells if tag in cell.metadata.get("tags", [])]


def exercise_of(cell) -> str:
    return cell.metadata["blockviz"]["exercise"]


def text_of(cell) -> str:
    """What a cell showed: streams, the text/plain of displays and results, errors."""
    parts = []
    for output in cell.outputs:
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("display_data", "execute_result"):
            parts.append(output.data.get("text/plain", ""))
        elif output.output_type == "error":
            parts.append(f"{output.ename}: {output.evalue}")
    return "".join(parts)


@pytest.fixture(scope="module")
def kernel_env(tmp_path_factory):
    """Point the Jupyter path at a "python3" kernelspec running this interpreter, and let the kernel
    import the repository even where it is not installed."""
    base = tmp_path_factory.mktemp("jupyter")
    spec = base / "kernels" / "python3"
    spec.mkdir(parents=True)
    (spec / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3", "language": "python",
    }))
    saved = {name: os.environ.get(name) for name in ("JUPYTER_PATH", "PYTHONPATH", "HF_HUB_OFFLINE")}
    os.environ["JUPYTER_PATH"] = str(base) + (os.pathsep + saved["JUPYTER_PATH"] if saved["JUPYTER_PATH"] else "")
    os.environ["PYTHONPATH"] = str(ROOT) + (os.pathsep + saved["PYTHONPATH"] if saved["PYTHONPATH"] else "")
    os.environ["HF_HUB_OFFLINE"] = "1"
    yield
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def execute(notebook, cwd: Path = LESSONS_DIR) -> float:
    """Run a notebook in a fresh python3 kernel from lessons/ (as a student would) or `cwd`; returns
    seconds."""
    client = nbclient.NotebookClient(notebook, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                     resources={"metadata": {"path": str(cwd)}})
    start = time.perf_counter()
    client.execute()
    return time.perf_counter() - start


# ---------------------------------------------------------------- the stored notebooks


def test_thirteen_lessons_and_their_index():
    assert [p.name[:2] for p in LESSONS] == [f"{i:02d}" for i in range(1, 14)] == list(LESSON_NUMBERS)
    index = (LESSONS_DIR / "README.md").read_text()
    for path in LESSONS:
        assert f"({path.name})" in index, f"lessons/README.md does not list {path.name}"
        assert f"`{path.stem}`" in (ROOT / "README.md").read_text(), f"README.md does not list {path.name}"
    assert "Thirteen short notebooks" in index


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_is_stored_stripped_with_blank_answers(path):
    notebook = read(path)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [], f"{path.name}: a code cell has stored outputs"
            assert cell.execution_count is None, f"{path.name}: a code cell has an execution count"
    assert "widgets" not in notebook.metadata, f"{path.name}: stored widget state"
    assert notebook.metadata["kernelspec"]["name"] == "python3"
    for cell in tagged(notebook, "answer"):
        match = BLANK.match(cell.source)
        assert match, f"{path.name}: an answer cell is not blank: {cell.source!r}"
        assert match.group(1) == EXERCISES[exercise_of(cell)].variable


@pytest.mark.parametrize("path", LESSONS, ids=lambda p: p.stem)
def test_lesson_has_the_parts_of_a_lesson(path):
    """Goal in two sentences, the function it follows, the Visualizer, exercises (an answer cell and
    a one-line check cell each, for every exercise of its module), a three-line summary."""
    notebook = read(path)
    markdown = [cell.source for cell in notebook.cells if cell.cell_type == "markdown"]
    code = "\n".join(cell.source for cell in notebook.cells if cell.cell_type == "code")
    goal = next(m for m in markdown if "**Goal.**" in m).split("**Goal.**")[1].split("\n\n")[0]
    assert len(re.findall(r"[.!?](\s|$)", goal.strip())) == 2, f"{path.name}: the goal is not two sentences"
    assert any("**Follows:**" in m for m in markdown)
    assert "Visualizer" in code
    number = path.name[:2]
    assert f"from blockviz.lessons import lesson{number} as lesson" in code
    answers, checks = tagged(notebook, "answer"), tagged(notebook, "check")
    mine = sorted(i for i in EXERCISES if i.startswith(number + "."))
    assert sorted(map(exercise_of, answers)) == sorted(map(exercise_of, checks)) == mine, path.name
    for cell in checks:
        ex = EXERCISES[exercise_of(cell)]
        assert cell.source == f"lesson.check_{ex.id.split('.')[1]}({ex.variable})"
    for cell in answers:
        assert notebook.cells.index(cell) < notebook.cells.index(
            next(c for c in checks if exercise_of(c) == exercise_of(cell))), "the answer comes before its check"
    summary = next(m for m in markdown if m.startswith("## Summary"))
    assert len([line for line in summary.splitlines() if line.startswith("- ")]) == 3


def test_no_lesson_keeps_internal_tags_or_the_old_slips():
    """Text slips the lessons once had: seed tags, the wrong sections of the vLLM paper, token ids
    shown as punctuation, tokens/s as a figure of merit; v1 is named in each lesson it changed."""
    for path in LESSONS:
        text = "\n".join(cell.source for cell in read(path).cells)
        assert not re.search(r"\bseed \d{3}\b", text), path.name
        assert "2.3 and 6" not in text and "list(range(30))" not in text, path.name
        assert not re.search(r"tokens?/s|tok/s", text), path.name
    for number in ("02", "04", "05", "06", "07"):
        (path,) = [p for p in LESSONS if p.name.startswith(number)]
        assert any(cell.source.startswith("## In vLLM v1") for cell in read(path).cells), path.name
    lesson06 = "\n".join(c.source for c in read(LESSONS_DIR / "06_preemption_swap_recompute.ipynb").cells)
    assert "by default for a lone sequence" in lesson06
    assert "section 3" in read(LESSONS_DIR / "08_why_paging.ipynb").cells[0].source


# ---------------------------------------------------------------- the checks, in this process


def test_every_exercise_has_a_key_entry_and_stored_slips():
    assert sorted(KEY) == sorted(EXERCISES)
    for ex in EXERCISES.values():
        assert KEY[ex.id].splitlines()[-1].startswith(f"{ex.variable} = "), ex.id
        assert ex.slips, f"{ex.id} stores no wrong answer"
        assert "Correct" not in ex.hint and all("Correct" not in s.hint for s in ex.slips)


def toy() -> Exercise:
    calls = []

    def check_toy():
        calls.append(1)
        return 4

    return Exercise("00.toy", "my_toy", check_toy, "count again.", (Slip(5, "one too many."),)), calls


def test_a_verdict_for_a_blank_a_right_a_slip_and_any_other_answer():
    ex, calls = toy()
    assert ex.verdict(...).status == UNANSWERED and "Not answered yet" in ex.verdict(...).text
    assert calls == [], "a blank answer computes nothing"
    assert ex.verdict(4).status == CORRECT and ex.verdict(4.0).correct
    assert ex.verdict(5).status == WRONG and ex.verdict(5).text.endswith("Hint: one too many.")
    assert ex.verdict(3).status == WRONG and ex.verdict(3).text.endswith("Hint: count again.")
    for other in ("4", None, [4], True, object()):  # not a number: the hint asks for one
        verdict = ex.verdict(other)
        assert verdict.status == WRONG and "Hint: give a number" in verdict.text, other
    assert [ex.verdict(5).text for _ in range(RUNS)] == [ex.verdict(5).text] * RUNS
    assert len(calls) == 1, "the truth is computed once, then kept"
    assert "blockviz-verdict-wrong" in ex.verdict(3)._repr_html_()


def test_a_check_shows_plain_text_outside_jupyter_and_never_raises(capsys):
    ex, _ = toy()
    ex(5)
    ex(...)
    ex(4)
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("Not quite (my_toy = 5). Hint: one too many.")
    assert out[1].startswith("Not answered yet") and out[2] == "Correct."
    show(ex.verdict(4))
    assert capsys.readouterr().out == "Correct.\n"


def test_fractions_compare_to_three_decimals():
    assert close_to(3 / 4, 0.75) and close_to(0.7501, 0.75) and not close_to(0.76, 0.75)
    assert not close_to("0.75", 0.75) and not close_to(True, 1.0)


def test_the_key_writes_solved_copies_and_leaves_lessons_alone(tmp_path, capsys):
    before = {p: p.read_bytes() for p in LESSONS}
    assert key_main([str(LESSONS_DIR), str(tmp_path)]) == 0
    assert {p: p.read_bytes() for p in LESSONS} == before
    for path in LESSONS:
        solved = read(tmp_path / path.name)
        for cell in tagged(solved, "answer"):
            assert cell.source == KEY[exercise_of(cell)] and not BLANK.match(cell.source)
    assert key_main([]) == 2 and key_main([str(tmp_path / "nowhere"), str(tmp_path)]) == 2
    assert "usage" in capsys.readouterr().err


# ---------------------------------------------------------------- the notebooks, in a kernel


def check_cells(check_source: str) -> list:
    return [nbformat.v4.new_code_cell(check_source) for _ in range(RUNS)]


def appended(notebook) -> list[tuple[str, str, list]]:
    """For every exercise, after the lesson: (what, expected text, the check cells run RUNS times)
    for the key, each stored slip and a blank, each preceded by a cell setting the answer."""
    runs = []
    for cell in tagged(notebook, "check"):
        ex = EXERCISES[exercise_of(cell)]
        cases = [("key", KEY[ex.id], "Correct")]
        cases += [(f"slip {i}", f"from blockviz.lessons import EXERCISES as _bv\n"
                                f"{ex.variable} = _bv[{ex.id!r}].slips[{i}].resolve()", f"Hint: {ex.fill_in(slip.hint)}")
                  for i, slip in enumerate(ex.slips)]
        cases.append(("blank", f"{ex.variable} = ...", "Not answered yet"))
        for what, answer_source, expected in cases:
            cells = check_cells(cell.source)
            notebook.cells += [nbformat.v4.new_code_cell(answer_source), *cells]
            runs.append((f"{ex.id} {what}", expected, cells))
    return runs


@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: p.stem)
def test_lesson_runs_blank_then_every_check_gives_one_verdict(path, kernel_env):
    """As stored: no error, every check says "not answered yet", nothing says "Correct". Then, in
    the same kernel: the key makes every check print "Correct", each stored slip its own hint, a
    blank "not answered yet" again, each check cell three times in a row with the same verdict."""
    notebook = read(path)
    stored = list(notebook.cells)
    runs = appended(notebook)
    seconds = execute(notebook)
    for cell in stored:
        if cell.cell_type == "code":
            assert "Correct" not in text_of(cell), f"{path.name}: a blank lesson printed Correct"
    for cell in tagged(notebook, "check"):
        assert text_of(cell).startswith("Not answered yet"), f"{path.name}: {text_of(cell)!r}"
    for what, expected, cells in runs:
        texts = [text_of(cell) for cell in cells]
        assert expected in texts[0] and texts == [texts[0]] * RUNS, f"{path.name} {what}: {texts}"
        boxes = [o for cell in cells for o in cell.outputs if o.output_type == "display_data"]
        assert len(boxes) == RUNS and all("blockviz-verdict" in o.data["text/html"] for o in boxes)
    print(f"{path.name}: {seconds:.1f} s")


def test_a_lesson_filled_with_the_key_prints_correct_in_its_own_check_cells(kernel_env):
    """Lesson 03 as a teacher's solved copy (key.fill): its check cell, where it stands, says Correct."""
    notebook = nbformat.from_dict(fill(json.loads(json.dumps(read(LESSONS_DIR / "03_decode_append_slots.ipynb")))))
    execute(notebook)
    (check,) = tagged(notebook, "check")
    assert text_of(check).startswith("Correct"), text_of(check)


def readme_notebook_block() -> str:
    """The README's "In Jupyter" Python block, as a reader would paste it."""
    text = (ROOT / "README.md").read_text()
    section = text[text.index("## In Jupyter"):]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_the_readme_notebook_block_pasted_as_one_cell_shows_the_widget(kernel_env, tmp_path):
    """One cell, run as pasted (in a directory of its own, so its picture is not written into the
    repository): no error, its last expression is the Visualizer, so the cell shows the widget, and
    the picture it saves is there; `compare`, which the text after it calls, is imported by the block."""
    block = readme_notebook_block()
    text = (ROOT / "README.md").read_text()
    after = text[text.index(block) + len(block):].split("\n## ", 1)[0]
    if "compare(" in after:
        assert re.search(r"^from blockviz\.jupyter import .*\bcompare\b", block, re.M)
        assert "blockviz.jupyter.compare(" not in after
    notebook = nbformat.v4.new_notebook(metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                                 "language": "python"}})
    notebook.cells = [nbformat.v4.new_code_cell(block)]
    execute(notebook, cwd=tmp_path)
    saved = re.findall(r'\.save\("([^"]+)"\)', block)
    assert saved and all((tmp_path / name).read_text().startswith("<svg") for name in saved)
    (result,) = [o for o in notebook.cells[0].outputs if o.output_type == "execute_result"]
    assert "application/vnd.jupyter.widget-view+json" in result.data
    assert result.data["text/plain"].startswith("live ")


def test_lessons_show_moments_where_their_text_discusses_a_state():
    """Every lesson that steps an engine and discusses what it did shows moments (a frozen
    picture, `.snapshot()` / `.show(at=...)`), so Run All leaves each picture at its paragraph's state."""
    for path in LESSONS:
        if path.name[:2] in ("01", "08"):  # one picture after the last step / no picture at all
            continue
        last_lines = [cell.source.strip().splitlines()[-1] for cell in read(path).cells
                      if cell.cell_type == "code" and cell.source.strip()]
        assert any(re.match(r"\w+(\[\"v1\"\])?\.(snapshot\(\)|show\(at=)", line) for line in last_lines), path.name
    lesson09 = "\n".join(cell.source for cell in read(LESSONS_DIR / "09_asking_the_engine.ipynb").cells)
    assert "viz.show(at=at)" in lesson09 and "viz.seek(" not in lesson09.split("## 2.")[0].replace("`viz.seek(at)`", "")


# ---------------------------------------------------------------- lesson 11's published figures


def test_lesson11_figures_are_vllms_page_sizes_and_our_engines():
    """Every published model's bytes per block, in bfloat16 and fp8, as vLLM 0.33's own spec classes
    size the pages (built here from the config.json fields, as vLLM's attention layers build them),
    as the lesson's formula gives them, and as our engine sizes a block (CacheEngine, and the
    geometry line the views print, trace.kv_geometry)."""
    torch = pytest.importorskip("torch")
    interface = pytest.importorskip("vllm.v1.kv_cache_interface")
    from blockviz.lessons import lesson11
    from blockviz.model.trace import kv_geometry

    def vllm_page(fields, block_size, dtype, quant):
        common = dict(block_size=block_size, dtype=dtype, kv_quant_mode=interface.get_kv_quant_mode(quant))
        if "kv_lora_rank" in fields:  # vLLM's MLA layer: one latent "head" of kv_lora_rank + qk_rope_head_dim
            spec = interface.MLAAttentionSpec(num_kv_heads=1, head_size=fields["kv_lora_rank"] + fields["qk_rope_head_dim"],
                                              cache_dtype_str=quant, **common)
            return fields["num_hidden_layers"] * spec.page_size_bytes
        if fields["model_type"] == "gpt2":
            layers, heads, head_size = fields["n_layer"], fields["n_head"], fields["n_embd"] // fields["n_head"]
            return layers * interface.FullAttentionSpec(num_kv_heads=heads, head_size=head_size, **common).page_size_bytes
        heads = 1 if fields.get("multi_query") else fields["num_key_value_heads"]
        head_size = fields.get("head_dim") or fields["hidden_size"] // fields["num_attention_heads"]
        kinds = fields.get("layer_types") or ["full_attention"] * fields["num_hidden_layers"]
        return sum((interface.FullAttentionSpec(num_kv_heads=heads, head_size=head_size, **common) if kind == "full_attention"
                    else interface.SlidingWindowSpec(num_kv_heads=heads, head_size=head_size, sliding_window=fields["sliding_window"],
                                                     **common)).page_size_bytes for kind in kinds)

    seen = set()
    for name, published in lesson11.PUBLISHED.items():
        shape = lesson11.kv_shape(published.fields)
        for kv_dtype, dtype, quant in (("bfloat16", torch.bfloat16, "auto"), ("fp8", torch.uint8, "fp8")):
            for block_size in (1, 16):
                theirs = vllm_page(published.fields, block_size, dtype, quant)
                ours = lesson11.bytes_per_block(shape, block_size, lesson11.KV_DTYPE_BYTES[kv_dtype])
                assert ours == theirs == lesson11.vllm_block_bytes(shape, block_size, kv_dtype), (name, kv_dtype)
                assert lesson11.engine_block_bytes(shape, block_size, kv_dtype) in (None, ours), (name, kv_dtype)
                seen.add((published.attention, lesson11.engine_block_bytes(shape, block_size, kv_dtype) is None))
        if shape.kv_factor == 2:
            header = {"num_layers": shape.num_layers, "num_kv_heads": shape.num_kv_heads, "head_dim": shape.head_size,
                      "block_size": 16, "dtype": "bfloat16", "block_bytes": lesson11.bytes_per_block(shape, 16, 2)}
            factors, total = kv_geometry(header).split(" = ")
            product = 1
            for factor in re.findall(r"\d+", factors):
                product *= int(factor)
            assert product == int(total.removesuffix(" B").replace(",", "")) == header["block_bytes"], name
    assert seen == {("MHA", False), ("GQA", False), ("MQA", False), ("MLA", True), ("hybrid", False)}


def test_lesson11_states_the_published_values_it_uses():
    """Each model id is named with its config.json, and every "`field` value" the lesson's text
    gives for a published model is that model's published value."""
    from blockviz.lessons import lesson11

    cells = read(LESSONS_DIR / "11_what_a_token_costs.ipynb").cells
    text = "\n".join(cell.source for cell in cells)
    assert "lesson.PUBLISHED" in text and "config.json" in text and "Hugging Face Hub" in text
    module = (ROOT / "blockviz" / "lessons" / "lesson11.py").read_text()
    checked = 0
    for name, published in lesson11.PUBLISHED.items():
        assert f'Published("{published.model_id}"' in module and "/config.json" in text
        for cell in cells:
            if cell.cell_type != "markdown" or not cell.source.startswith(f"## Exercise") or name not in cell.source:
                continue
            for field, value in re.findall(r"`(\w+)` (\d+|true|false)\b", cell.source):
                if field in published.fields:
                    assert str(published.fields[field]).lower() == value.lower(), (name, field, value)
                    checked += 1
    assert checked >= 12


def test_lesson11_window_blocks_are_vllms_admission_cap():
    """The most blocks a request held in the window group on engine/v1 is the lesson's
    cdiv(window - 1, block_size) + 1, within vLLM's SlidingWindowSpec.max_admission_blocks_per_request
    for one token in flight, for windows smaller and larger than a block, on and off block
    boundaries; for gpt-oss (window 128, blocks of 16) both are the key's 9."""
    torch = pytest.importorskip("torch")
    interface = pytest.importorskip("vllm.v1.kv_cache_interface")
    from blockviz.lessons import lesson11

    for window, block_size in ((128, 16), (5, 4), (8, 4), (3, 4), (1, 4), (20, 8)):
        spec = interface.SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16,
                                           sliding_window=window)
        cap = spec.max_admission_blocks_per_request(max_in_flight_tokens=1, max_model_len=1000)
        assert lesson11.window_blocks_held(window, block_size, 200) == lesson11.window_blocks(window, block_size, 200)
        assert lesson11.window_blocks_held(window, block_size, 200) <= cap, (window, block_size)
    assert lesson11.check_window_blocks.truth() == 9 == interface.SlidingWindowSpec(
        block_size=16, num_kv_heads=1, head_size=8, dtype=torch.float16, sliding_window=128,
    ).max_admission_blocks_per_request(max_in_flight_tokens=1, max_model_len=1000)
