#!/usr/bin/env bash
# Train the embedded checkpoint on a GPU box, one run per GPU, in calls of at most ~9 minutes:
#   bash tests/benchmarks/gpu_train.sh STOP_MINUTES NAME=RECIPE.json [NAME=RECIPE.json ...]
# Each run continues from runs/NAME/state/ (left on the box by the last call, or unpacked from
# carry/NAME-state.tar.part-* when the box is fresh) and stops after STOP_MINUTES with its
# state saved. Back in $OUT: every run's log and summary, and the state of the run that got
# furthest (curriculum stage, then held-out exact) as 15 MB tar parts while some run is still
# training, and the bf16 checkpoint of every run that has finished its budget (one tar each,
# ~13 MB): what comes back from the box is at most 8 files of 16 MiB, 64 MiB in all.
set -uo pipefail
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT" runs
for d in kernels patches profiles; do ln -sfn "../$d" "dsv4bisect/$d"; done
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -c "import torch; print('torch', torch.__version__, torch.cuda.device_count(), 'GPUs')"
stop=$1
shift
gpu=0
names=()
for spec in "$@"; do
  name=${spec%%=*}
  recipe=${spec#*=}
  names+=("$name")
  mkdir -p "runs/$name"
  if [ ! -f "runs/$name/state/meta.json" ] && compgen -G "carry/$name-state.tar.part-*" >/dev/null; then
    cat carry/"$name"-state.tar.part-* | tar xf - -C runs
    echo "$name: state unpacked from carry/"
  fi
  CUDA_VISIBLE_DEVICES=$gpu timeout $(( ${stop%.*} * 60 + 150 )) python3 -m dsv4bisect.reference.training.train \
    --out "runs/$name" --config "$recipe" --resume --stop-after "$stop" --device "${DEVICE:-cuda}" \
    >>"runs/$name/stdout.log" 2>&1 &
  gpu=$((gpu + 1))
done
wait
unfinished=0
for name in "${names[@]}"; do
  echo "== $name"; tail -n 25 "runs/$name/stdout.log"
  tar cf "$OUT/$name-log.tar" -C runs "$name/log.jsonl" "$name/summary.json" "$name/stdout.log" "$name/train_config.json" 2>/dev/null
  if grep -q '"finished": true' "runs/$name/summary.json" 2>/dev/null; then
    tar cf "$OUT/$name-checkpoint.tar" -C runs "$name/checkpoint"
  else
    unfinished=1
  fi
done
if [ "$unfinished" = 0 ]; then ls -la "$OUT"; exit 0; fi
best=$(python3 - "${names[@]}" <<'PY'
import json, sys
def rank(name):
    evals = [json.loads(l) for l in open(f"runs/{name}/log.jsonl") if '"eval_exact"' in l]
    last = evals[-1] if evals else {"stage": -1, "eval_exact": -1}
    return (last["stage"], last["eval_exact"])
print(max(sys.argv[1:], key=rank))
PY
)
echo "state back: $best"
tar cf - -C runs "$best/state" | split -b 15m - "$OUT/$best-state.tar.part-"
ls -la "$OUT"
