#!/usr/bin/env bash
# Downloads tokamax 0.0.17 and the part of its import closure the device image lacks
# (../shared/GPU-PEERS.md) into .gpu-wheels/, for Python 3.12 on manylinux, so that the
# GPU suite and the benchmarks can install it on the device machine, which has no
# network (`tools/gpu_lanes.sh` installs them there into /tmp/site):
#
#   tools/gpu_wheels.sh          # here, once per checkout (about 42 MB)
#   run: tools/gpu_suite.sh TK   # there, with carry: [".gpu-wheels"]
#
# .gpu-wheels/ is not tracked: list it in .git/info/exclude.
set -eu
cd "$(dirname "$0")/.."
packages=(
  tokamax==0.0.17 absl-py einshape immutabledict pydantic pydantic-core annotated-types
  typing-inspection qwix flax msgpack optax rich markdown-it-py mdurl treescope
  tensorboardx xprof gviz-api werkzeug markupsafe cheroot jaraco.functools
  more-itertools etils opt-einsum pyyaml pygments tqdm six fsspec protobuf
  wadler-lindig zipp typing-extensions jaxtyping humanize fire termcolor
)
# xprof's wheel is tagged manylinux_2_27: name every platform tag the image takes.
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform any \
  -d .gpu-wheels "${packages[@]}"
echo "$(ls .gpu-wheels/*.whl | wc -l) wheels in .gpu-wheels/ ($(du -sh .gpu-wheels | cut -f1))"
