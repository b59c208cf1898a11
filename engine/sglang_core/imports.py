"""SGLang 0.5.23's classes, imported once with the one stand-in its import chain needs here.

`sglang.srt.mem_cache.radix_cache` reaches, through `sglang.srt.configs`, modules that import
`torchvision.transforms` at module level (internvl_utils, nano_nemotron_vl). No torchvision wheel
fits the torch installed here (each release pins its torch), and no code path blockviz runs calls
it. So while (and only while) SGLang's modules import, a meta-path finder answers for `torchvision`
with empty modules; afterwards the finder is removed and the `torchvision` entries leave
sys.modules, so `importlib.util.find_spec("torchvision")` is None again for everything else.
transformers is imported before the finder goes in: it decides once, at its own import, whether
torchvision exists, and must decide "no". Everything else SGLang imports is the real package
(triton, apache-tvm-ffi, sentencepiece, xgrammar). docs/sglang.md lists the stand-in.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
import types
from contextlib import contextmanager
from typing import Iterator

STAND_INS = ("torchvision",)  # top-level packages answered by empty modules during SGLang's import

_lock = threading.Lock()
_classes: types.SimpleNamespace | None = None


class _StandIn(types.ModuleType):
    """An empty module whose unknown attributes are empty namespaces (`T.Compose`, `F.InterpolationMode`
    read at import time); nothing in it can run."""

    def __getattr__(self, item: str):
        if item.startswith("__"):
            raise AttributeError(item)
        return types.SimpleNamespace()


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Answers an import of a STAND_INS package (or its submodules) with a `_StandIn`."""

    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STAND_INS:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandIn(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module) -> None:
        pass


@contextmanager
def _stand_ins() -> Iterator[None]:
    """The finder on sys.meta_path for the block; then gone, with the modules it made."""
    import transformers.image_utils  # noqa: F401  (decides "no torchvision" before the finder exists)
    import transformers.modeling_utils  # noqa: F401

    finder = _StandInFinder()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
        for name in [name for name in sys.modules if name.split(".")[0] in STAND_INS]:
            if isinstance(sys.modules[name], _StandIn):
                del sys.modules[name]


def sglang_classes() -> types.SimpleNamespace:
    """SGLang's classes and functions the adapter drives, imported on first call."""
    global _classes
    with _lock:
        if _classes is None:
            import warnings

            from engine.vllm_core import quiet_vllm_logs  # SGLang imports vLLM's layers, which log at import

            with _stand_ins(), warnings.catch_warnings(), quiet_vllm_logs():
                warnings.simplefilter("ignore")
                from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
                from sglang.srt.managers.schedule_policy import AddReqResult, PrefillAdder, SchedulePolicy
                from sglang.srt.managers.scheduler_components.new_token_ratio_tracker import NewTokenRatioTracker
                from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
                from sglang.srt.mem_cache.cache_init_params import CacheInitParams
                from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
                from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
                from sglang.srt.mem_cache.radix_cache import RadixCache
                from sglang.srt.runtime_context import SpawnRanks, create_context, use_context
                from sglang.srt.sampling.sampling_params import SamplingParams
                from sglang.srt.server_args import ServerArgs
                from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
            _classes = types.SimpleNamespace(**{name: value for name, value in locals().items()
                                                if not name.startswith("_") and name not in ("warnings", "quiet_vllm_logs")})
        return _classes
