"""Shared fixtures: tiny GPT-2 checkpoints built locally, loadable exactly like "gpt2".

`make_tiny_gpt2(path, **config_overrides)` writes a GPT2LMHeadModel (save_pretrained) and a
byte-level BPE tokenizer trained on a few sentences into `path`; no network is involved. The
weights use a large initializer_range so greedy decoding depends on the context instead of
collapsing to one repeated token. Everything is deterministic (fixed torch seed).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER") and "OMP_NUM_THREADS" not in os.environ:
    # an xdist worker's share of the cores for torch's intra-op threads (read when torch is first
    # imported, here and in every process a test starts): with one worker a core, a worker's second
    # thread would spin on a core another worker is using
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    os.environ["OMP_NUM_THREADS"] = str(max(1, cores // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
import torch

if not torch.cuda.is_available():
    # Triton reads TRITON_INTERPRET when it is first imported (its own jit helpers, tl.zeros, are
    # defined then): set before any test module imports it, directly or through vLLM, so every
    # kernel test runs the kernels on CPU tensors whatever order the modules are collected in
    os.environ.setdefault("TRITON_INTERPRET", "1")
from optional_parts import INSTALL_LINES
from jupyter_fixtures import chromium_browser, chromium_session, jupyter_server, lab_page  # noqa: F401 (browser tests' fixtures)

TINY_GPT2_CONFIG = dict(
    n_layer=2,
    n_embd=64,
    n_head=4,
    n_positions=128,
    initializer_range=0.3,
)
TOKENIZER_TEXT = [
    "To be, or not to be, that is the question:",
    "Whether 'tis nobler in the mind to suffer the slings and arrows of outrageous fortune,",
    "The quick brown fox jumps over the lazy dog.",
    "All the world's a stage, and all the men and women merely players.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
]
EOS_TOKEN = "<|endoftext|>"

# Modules whose every test takes seconds or more, left out of the fast tier (-m "not slow"): what
# makes them slow. A slow test elsewhere carries @pytest.mark.slow itself.
SLOW_MODULES = {
    "test_block_manager_stateful.py": "hypothesis state machine, 200 sequences of 40 operations",
    "test_v1_kv_cache_manager_stateful.py": "hypothesis state machine, 300 sequences of 50 operations",
    "test_v1_vs_vllm_core.py": "360 seeded workloads, each through two engines",
    "test_v1_vs_vllm.py": "random operation sequences through our manager and vLLM's",
    "test_v1_groups_vs_vllm.py": "random operation sequences through our groups and vLLM's",
    "test_lessons.py": "executes the lesson notebooks in fresh kernels",
    "test_lessons_vllm.py": "executes the lesson notebooks in fresh kernels",
    "test_tui_snapshots.py": "the whole app per snapshot",
    "test_story_snapshots.py": "the whole app per snapshot",
    "test_engine_process.py": "the engine in a process of its own, the UI in a terminal",
    "test_serve_hostile.py": "a real blockviz serve and its app processes",
    "test_serve_safety.py": "a real blockviz serve and its app processes",
    "test_smollm2.py": "SmolLM2-135M beside transformers",
    "test_llama_parity.py": "Llama-family checkpoints beside transformers",
    "test_kernels.py": "Triton's CPU interpreter",
    "test_benchmarks.py": "runs the benchmarks",
}
BROWSER_FIXTURES = {"chromium_session", "chromium_browser", "lab_page", "jupyter_server"}
# Modules whose tests share a costly module-scoped fixture: each is one xdist group, so one worker
# builds the fixture once instead of every worker that runs one of its tests building it again.
# --dist loadgroup hands out the largest groups first, so a group never becomes the run's tail.
SHARED_SETUP_MODULES = {
    "test_smollm2.py": "SmolLM2-135M loaded by our engine and by transformers, and its generated outputs",
    "test_jupyter_card_screen_browser.py": "one notebook with a Visualizer per story, open in a page",
    "test_webpage_browser.py": "each trace's page exported through the CLI",
}


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the xdist_group marks (--dist loadgroup)
def pytest_collection_modifyitems(config, items):
    """Mark every browser test `browser`, the tests of SLOW_MODULES `slow`, and put the tests of
    each of SHARED_SETUP_MODULES in one xdist group named after the module.

    Browser tests carry no other xdist group: pytest-xdist spreads them over every worker like any
    other test, and each worker that runs one starts one chromium and one JupyterLab (the session
    fixtures of jupyter_fixtures.py): the browser tests run on every worker at once, not one after
    another.

    In a pytest-xdist worker the slow and browser tests come first (each module's tests in their
    order): --dist loadgroup hands tests out in the order collected, so the run ends on fast tests
    and no worker sits idle while the other finishes a long one."""
    for item in items:
        if BROWSER_FIXTURES & set(getattr(item, "fixturenames", ())) or item.path.name.endswith("_browser.py"):
            item.add_marker(pytest.mark.browser)
        if item.path.name in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if item.path.name in SHARED_SETUP_MODULES:
            item.add_marker(pytest.mark.xdist_group(item.path.stem))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None and item.get_closest_marker("browser") is None)


def _missing_part(text: str) -> str | None:
    """The optional module that `text` (a skip reason or an error) says is missing, when it is."""
    for module in INSTALL_LINES:
        if module in text.lower() and importlib.util.find_spec(module) is None:
            return module
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that fails because an optional part is not installed (a ModuleNotFoundError naming it)
    is reported skipped with the line that installs the part; so is one skipped for want of it
    (`pytest.importorskip("vllm")`)."""
    outcome = yield
    report = outcome.get_result()
    if call.excinfo is not None and call.excinfo.errisinstance(ModuleNotFoundError):
        module = _missing_part(str(call.excinfo.value.name or ""))
        if module is not None and report.failed:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {INSTALL_LINES[module]}")
    _name_the_install_line(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """A module skipped for want of an optional part says the line that installs it."""
    outcome = yield
    _name_the_install_line(outcome.get_result())


def _name_the_install_line(report) -> None:
    if report.skipped and isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        path, line, reason = report.longrepr
        module = _missing_part(reason)
        if module is not None and INSTALL_LINES[module] not in reason:
            report.longrepr = (path, line, f"{reason}: {INSTALL_LINES[module]}")


def build_tokenizer(vocab_size: int = 320):
    """A GPT-2-style byte-level BPE tokenizer trained locally, wrapped for AutoTokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(TOKENIZER_TEXT * 4, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, bos_token=EOS_TOKEN, unk_token=EOS_TOKEN)


def make_tiny_gpt2(path: Path, seed: int = 0, **config_overrides) -> Path:
    """Write a tiny random GPT-2 checkpoint + tokenizer into `path` and return it."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    path = Path(path)
    tokenizer = build_tokenizer()
    eos_id = tokenizer.eos_token_id
    config = GPT2Config(
        **{**TINY_GPT2_CONFIG, "vocab_size": len(tokenizer), "bos_token_id": eos_id, "eos_token_id": eos_id,
           **config_overrides}
    )
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_gpt2_factory(tmp_path_factory):
    """Build (and cache per session) tiny checkpoints: `tiny_gpt2_factory(**overrides) -> Path`."""
    built: dict[tuple, Path] = {}

    def factory(**config_overrides) -> Path:
        key = tuple(sorted(config_overrides.items()))
        if key not in built:
            built[key] = make_tiny_gpt2(tmp_path_factory.mktemp("tiny-gpt2"), **config_overrides)
        return built[key]

    return factory


@pytest.fixture(scope="session")
def tiny_gpt2_dir(tiny_gpt2_factory) -> Path:
    """The default tiny GPT-2 checkpoint directory (2 layers, 64 wide, 4 heads, 128 positions)."""
    return tiny_gpt2_factory()


@pytest.fixture(scope="session", autouse=True)
def gguf_cache_dir(tmp_path_factory) -> Path:
    """One GGUF cache (engine/models/gguf_cache.py) for the whole run, every xdist worker and every
    process a test starts: the first SmolLM2 load reads the GGUF file and fills it, later loads read
    it back. A temporary directory, never the user's ~/.cache/blockviz."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "blockviz-cache"
    root.mkdir(exist_ok=True)
    os.environ["BLOCKVIZ_CACHE_DIR"] = str(root)
    return root
