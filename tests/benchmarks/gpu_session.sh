#!/usr/bin/env bash
# Every GPU check of the project, in calls of at most ~9 minutes on one H200:
#   bash tests/benchmarks/gpu_session.sh kernels   # kernel tests + benchmark (~9 min)
#   bash tests/benchmarks/gpu_session.sh engine    # the embedded engine's GPU tests + bench
#   bash tests/benchmarks/gpu_session.sh sglang    # SGLang hook check (needs .whl/ with the wheels), microtest
#   bash tests/benchmarks/gpu_session.sh vllm      # vLLM hooks vs vLLM's torch code (needs .whl/vllm:
#                                                  #   python tests/vllm/gpu_vllm_check.py --make-slices .whl/vllm)
# The GPU box has torch and triton but no pydantic and no network: the package is imported from
# the checkout (kernels/, patches/, profiles/ linked under dsv4bisect/), nothing is installed.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
for d in kernels patches profiles; do ln -sfn "../$d" "dsv4bisect/$d"; done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__, torch.cuda.get_device_name())"
case "${1:-}" in
  kernels)
    timeout 570 python3 tests/benchmarks/kernels_bench.py --out "$OUT" --tests-s 170 --budget-s 380 2>&1 | tail -n 90
    ;;
  engine)
    timeout 60 python3 -m pytest tests/reference/test_engine.py -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/engine_gpu_tests.log" | tail -n 3
    timeout 90 python3 tests/benchmarks/reference_bench.py --device cuda --repeat 3 2>&1 | tee "$OUT/reference_bench_cuda.txt"
    ;;
  sglang)
    timeout 300 python3 tests/sglang/gpu_hooks_check.py --wheels .whl --out "$OUT" 2>&1 | tail -n 40
    MICROTEST_GPU_OUT=$OUT timeout 150 python3 -m pytest tests/microtest/test_gpu_microtest.py -m gpu -q -rs -p no:cacheprovider 2>&1 | tee "$OUT/microtest_gpu.log" | tail -n 5
    ;;
  vllm)
    timeout 300 python3 tests/vllm/gpu_vllm_check.py --slices .whl/vllm --device cuda --out "$OUT" 2>&1 | tail -n 75
    ;;
  *) echo "usage: $0 kernels|engine|sglang|vllm" >&2; exit 2 ;;
esac
