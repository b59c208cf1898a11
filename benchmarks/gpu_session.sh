#!/usr/bin/env bash
# One call on a lent GPU machine (the device tool's `run`): the CUDA tests, the engine-level test
# files, then benchmarks/gpu.py. Not run in CI; written before any GPU was lent to this change.
#
# Prepare here first (see ../shared/gpu/README.md: the device machine has Python 3.12, torch 2.11,
# transformers, triton, xxhash, pytest, hypothesis; it lacks msgspec and gguf):
#   echo /.gpu/ >> .git/info/exclude; mkdir -p .gpu/whl
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#       --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .gpu/whl msgspec gguf
# then `run` with carry [".gpu"], timeout_s 600, command: bash benchmarks/gpu_session.sh
# Output lands in $OUT (tests.log, gpu.log); the budget is 15 device minutes for everything.
set -u
OUT=${OUT:-/tmp/gpu_out}
mkdir -p "$OUT"
if ls .gpu/whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .gpu/whl/*.whl
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv | tee "$OUT/card.txt"
timeout 120 python3 -m pytest -q -m cuda tests/test_cuda_graphs.py tests/test_kernels.py tests/test_cache_engine.py 2>&1 | tee "$OUT/tests.log" | tail -25
timeout 120 python3 -m pytest -q tests/test_engine_parity.py tests/test_step_plan.py tests/test_layers.py 2>&1 \
    | tee -a "$OUT/tests.log" | tail -8
timeout 330 python3 benchmarks/gpu.py 2>&1 | tee "$OUT/gpu.log" | grep -v "^figures:" | tail -40
grep "^figures:" "$OUT/gpu.log" || echo "gpu.py printed no figures line"
