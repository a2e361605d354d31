#!/bin/bash
# Issue 44's GPU figures in one device run (one H200 or H100 machine, 16 cores, the image's CUDA torch).
#
# Why one script: a session lent a GPU has 15 minutes of device time in all, the machine's start included,
# and the machine can reach no package registry. So, on the development machine first:
#
#     PYTHON=.venv/bin/python bash benchmarks/gpu_round.sh --fetch   # the dependencies the image lacks: .gpu-wheels/
#
# then one device run, carrying them (`*.whl` is ignored by git, so it must be named):
#
#     run(command="bash benchmarks/gpu_round.sh", carry=[".gpu-wheels"], timeout_s=600)
#
# What it measures, each against the old path in the same run (figures in $OUT, and on stdout):
#   1. the GPU kill -9 (2 ranks x 1 GiB of state on the GPU, warm standbys): in place with standbys ready for
#      their device (preload_device, the default), in place without it, and the whole-job restart;
#   2. CPU ranks on the machine's 16 cores (1 node x 4): in place vs whole restart vs torchrun, kill -9 and hang,
#      with job.yaml's defaults.
# Each step has its own time limit, and the first three (the GPU figures) come first.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
WHEELS=.gpu-wheels
if [ "${1:-}" = "--fetch" ]; then
    # the image has torch, jinja2, pyyaml, typer, rich, psutil, prometheus-client; not these (Python 3.12 there)
    "${PYTHON:-python3}" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        -d "$WHEELS" pydantic pyzmq paramiko cryptography
    ls "$WHEELS"
    exit 0
fi
OUT=${OUT:-/tmp/gpu-round}
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu-round.log") 2>&1
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps "$WHEELS"/*.whl || { echo "no wheels: run --fetch here first"; exit 2; }
nvidia-smi -L
python3 -c "import torch, launchers; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())"
git rev-parse --short HEAD 2>/dev/null || true

step() {  # step NAME SECONDS COMMAND...: one figure, bounded, its output kept
    local name=$1 limit=$2
    shift 2
    echo "=== $name ($(date +%T), at most ${limit}s)"
    timeout "$limit" "$@" || echo "=== $name: exit $?"
}

step "gpu in place, preload_device" 150 python3 benchmarks/device_stage.py --phase e2e --in-process \
    --out "$OUT/e2e-in-place.json"
step "gpu whole restart" 150 python3 benchmarks/device_stage.py --phase e2e --out "$OUT/e2e-whole.json"
step "gpu in place, no preload_device" 150 python3 benchmarks/device_stage.py --phase e2e --in-process \
    --no-preload-device --out "$OUT/e2e-in-place-no-device.json"
step "cpu ranks on 16 cores: in place, whole restart, torchrun" 180 python3 benchmarks/fault_recovery.py \
    --in-process --restarts 8 --hangs 2 --hang-timeout 3 --torchrun-restarts 1
echo "=== done $(date +%T)"
