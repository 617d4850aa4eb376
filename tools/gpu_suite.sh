#!/usr/bin/env bash
# The GPU suite in four lanes (one GPU each, `gpu_lanes.sh`), with tokamax (TK, the
# default), without it (NOTK), or both at once (TK NOTK: eight lanes, two a GPU on a
# 4-GPU host, memory allocated on demand so that two processes share a GPU):
#
#   tools/gpu_suite.sh TK NOTK     # on the device machine, carry: [".gpu-wheels"]
#                                  # (made here by `tools/gpu_wheels.sh`)
#
# Lanes: the ops and the attention variants; the heuristics, the Triton deprecation,
# kerneltune's Triton kernels, the shipped tables' configs and the expert-parallel
# example; the conformance suite's values; its gradients,
# vmap and shard_map. Each lane's log is $OUT/<lane>.log; the summary lines follow.
# These tests check values, not speed, so sharing a GPU changes no outcome.
# On a host of one GPU, where eight lanes do not end inside one call, ONLY picks lanes by
# name (ops, heuristics, values, transforms), for example:
#
#   ONLY="ops heuristics" tools/gpu_suite.sh TK
set -u
cd "$(dirname "$0")/.."
[ $# -eq 0 ] && set -- TK
lanes=()
for which in "$@"; do
  case "$which" in TK | NOTK) ;; *) echo "usage: $0 [TK] [NOTK]" >&2; exit 2 ;; esac
  run="PYTHONPATH=\$$which python3 -m pytest -q -p no:cacheprovider -rfEs --durations=8"
  all=(
    "ops_$which::$run -m gpu tests/kernels/test_gpu_ops.py tests/kernels/test_gpu_attention_variants.py"
    "heuristics_$which::$run -m gpu tests/kernels/test_gpu_heuristics.py tests/kernels/test_gpu_triton_deprecation.py tests/kernels/test_gpu_triton_kernels.py tests/kernels/test_gpu_shipped_configs.py tests/docs/test_example_moe_ep.py"
    "values_$which::$run tests/kernels/test_conformance.py -k 'values_match or declares'"
    "transforms_$which::$run tests/kernels/test_conformance.py -k 'gradients or vmap or shard_map'"
  )
  for lane in "${all[@]}"; do
    name=${lane%%_*}
    case " ${ONLY:-ops heuristics values transforms} " in *" $name "*) lanes+=("$lane") ;; esac
  done
done
[ ${#lanes[@]} -eq 0 ] && { echo "ONLY='${ONLY:-}' names no lane" >&2; exit 2; }
gpu_count=$(nvidia-smi -L | wc -l)
[ -n "${GPUS:-}" ] && gpu_count=$(wc -w <<<"$GPUS")
if [ ${#lanes[@]} -gt "$gpu_count" ]; then
  export XLA_PYTHON_CLIENT_PREALLOCATE=false
fi
OUT=${OUT:-/tmp/lanes} DEADLINE_S=${DEADLINE_S:-555} tools/gpu_lanes.sh "${lanes[@]}"
for which in "$@"; do
  for f in "${OUT:-/tmp/lanes}"/*_"$which".log; do
    [ -e "$f" ] || continue
    echo "=== $f"
    grep -E "passed|failed|FAILED|ERROR|exit" "$f" | tail -12
  done
done
