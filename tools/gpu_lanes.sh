#!/usr/bin/env bash
# Runs several GPU jobs at once, one lane per GPU, each lane's jobs one after another,
# every lane stopped at a shared deadline; each lane's output goes to $OUT/<lane>.log.
# For the device machine, where a call's time is short and GPUs are several:
#
#   DEADLINE_S=560 tools/gpu_lanes.sh 'name1::cmd; cmd' 'name2::cmd' ...
#
# Lane i gets GPU i (CUDA_VISIBLE_DEVICES), wrapping around when lanes outnumber GPUs;
# GPUS="2 3" keeps the lanes on those GPUs (the others left free for timed work).
# Commands run under bash in the repository root; $TK (tokamax wheels unpacked) and
# $NOTK (no tokamax) are PYTHONPATH values for commands to choose between.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/lanes}
mkdir -p "$OUT"
deadline=$(( $(date +%s) + ${DEADLINE_S:-560} ))
# Bytecode is compiled at install, as pip does for a user: imported from source, tokamax
# costs seconds of compiling on its first import, which would land in first-call figures.
if [ -d .gpu-wheels ] && [ ! -d /tmp/site/tokamax ]; then
  python3 -m pip install -q --no-index --no-deps --no-cache-dir \
    --target /tmp/site .gpu-wheels/*.whl >/dev/null 2>&1 || echo "tokamax wheels: install failed"
fi
export TK=.:/tmp/site NOTK=. JAX_PLATFORMS=cuda PYTHONUNBUFFERED=1
read -r -a gpu_ids <<<"${GPUS:-$(seq -s ' ' 0 $(( $(nvidia-smi -L | wc -l) - 1 )))}"
gpus=${#gpu_ids[@]}
i=0
for lane in "$@"; do
  name=${lane%%::*}
  cmds=${lane#*::}
  gpu=${gpu_ids[$(( i % gpus ))]}
  (
    export CUDA_VISIBLE_DEVICES=$gpu
    left=$(( deadline - $(date +%s) ))
    echo "== lane $name on GPU $gpu: $cmds"
    start=$(date +%s)
    timeout --signal=INT --kill-after=10 "$left" bash -c "$cmds"
    echo "== lane $name exit $? after $(( $(date +%s) - start )) s"
  ) >"$OUT/$name.log" 2>&1 &
  i=$(( i + 1 ))
done
wait
tail -n 4 "$OUT"/*.log
