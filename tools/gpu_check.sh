#!/usr/bin/env bash
# One device run (see docs/testing.md): build the C accelerator, run the CUDA tests, the
# compiled-optimizer check (tools/gpu_compiled_optimizer.py), then the whole suite, both
# tiers, logs under $OUT. Usage on the lent GPU machine: bash tools/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
nvidia-smi -L
python3 -c "import sys, torch; print(sys.version.split()[0], torch.__version__, torch.cuda.get_device_name())"
python3 setup.py -q build_ext --inplace >"$OUT/build.log" 2>&1 || tail -20 "$OUT/build.log"
python3 -c "from instrument import _native; print('C accelerator:', _native.speedups is not None)"
timeout "${CUDA_LIMIT:-240}" python3 -m pytest -m cuda -q -rs --timeout 200 tests 2>&1 \
  | tee "$OUT/cuda.log" | tail -40
timeout 120 python3 tools/gpu_compiled_optimizer.py 2>&1 | tee "$OUT/compiled_optimizer.log"
timeout "${SUITE_LIMIT:-240}" python3 -m pytest -q -n 14 --timeout 200 -m "slow or not slow" tests 2>&1 \
  | tee "$OUT/suite.log" | tail -40
