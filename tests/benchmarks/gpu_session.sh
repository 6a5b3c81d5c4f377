#!/usr/bin/env bash
# Every GPU check of the project, in calls of at most ~9 minutes on one H200:
#   bash tests/benchmarks/gpu_session.sh kernels   # kernel tests + benchmark (~9 min)
#   bash tests/benchmarks/gpu_session.sh engine    # the embedded engine's GPU tests + bench
#   bash tests/benchmarks/gpu_session.sh sglang    # SGLang hook check (needs .whl/ with the wheels), microtest
#   bash tests/benchmarks/gpu_session.sh verdicts [verdict_table.py ARGS...]
#       # the verdict table's rows on this GPU at precision deployment (needs .whl/ with
#       # pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, uvicorn
#       # and starlette for Python 3.12; see docs/performance.md), the engine's own variation
#       # (batch_variation.py --device cuda) beside them; every result to $OUT/verdicts.tgz and
#       # the shared good end's baseline to $OUT/baselines.tgz: unpack that into
#       # .cache/dsv4bisect/, carry .cache/dsv4bisect and pass --no-seed to a later call
#   bash tests/benchmarks/gpu_session.sh vllm      # vLLM hooks vs vLLM's torch code (needs .whl/vllm:
#                                                  #   python tests/vllm/gpu_vllm_check.py --make-slices .whl/vllm)
# The GPU box has torch and triton but no pydantic and no network: the package is imported from
# the checkout (kernels/, patches/, profiles/ linked under dsv4bisect/), nothing is installed
# except the carried wheels, into /tmp/site. DSV4BISECT_COMMIT names the commit measured (the
# copy there has no .git).
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
  verdicts)
    shift
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 5
    export PYTHONPATH=$PWD:/tmp/site
    VT=/tmp/verdicts
    # the rows' shared good-end baseline (verdict_table.py measures it once) outlives a call on
    # a machine kept warm: .cache/ is ignored, so the next call's copy keeps it
    export DSV4BISECT_CACHE=${DSV4BISECT_CACHE:-$PWD/.cache/dsv4bisect}
    mkdir -p "$VT"
    if [ "${BATCH_VARIATION:-1}" = 1 ]; then
      timeout "${BATCH_VARIATION_S:-420}" python3 tests/benchmarks/batch_variation.py --device cuda \
        --precisions deployment --transcripts docs/results/2026-12-01-cpu-deployment/drift-transcripts.jsonl \
        --json "$VT/batch-variation-cuda.json" > "$VT/batch-variation-cuda.md" 2>&1 &
    fi
    # the kept JSON, every run's and bisect's verdict, report and logs (not probe rows: large),
    # packed every minute too, so a call the lease cuts short still brings back what finished
    # and the baselines measured here, for the next call to carry in .cache/ (a fresh machine
    # has none)
    pack() { tar czf "$OUT/verdicts.tgz.part" -C "$VT" --exclude='*.jsonl' --exclude='*.png' \
               --exclude='*.sqlite*' . && mv "$OUT/verdicts.tgz.part" "$OUT/verdicts.tgz"
             [ -d "$DSV4BISECT_CACHE/baselines" ] && tar czf "$OUT/baselines.tgz.part" \
               -C "$DSV4BISECT_CACHE" baselines && mv "$OUT/baselines.tgz.part" "$OUT/baselines.tgz"; }
    (while sleep 60; do pack; done) &
    packer=$!
    # JOBS: rows at once. Each row's two engines are CUDA contexts of their own, and one GPU
    # time-slices between contexts: 7 rows (14 engines) on an H200 took 2 s per request at the
    # median and 12 s at p90, and no row finished in 470 s (2026-12-06). Keep it small.
    timeout "${VERDICTS_S:-500}" python3 tests/benchmarks/verdict_table.py --device cuda \
      --precision deployment --jobs "${JOBS:-2}" --out "$VT" "$@" 2>&1 | tail -n 40
    kill "$packer" 2>/dev/null
    wait
    pack
    ls -la "$OUT"
    ;;
  vllm)
    timeout 300 python3 tests/vllm/gpu_vllm_check.py --slices .whl/vllm --device cuda --out "$OUT" 2>&1 | tail -n 75
    ;;
  *) echo "usage: $0 kernels|engine|sglang|verdicts|vllm" >&2; exit 2 ;;
esac
