#!/usr/bin/env bash
# One machine, N processes.
# Usage: bash launch/singlenode.sh [--nproc-per-node N] SCRIPT [SCRIPT ARGS...]
#   bash launch/singlenode.sh --nproc-per-node 2 launch/train.py --checkpoint ./runs/ckpt
# Default N: $NPROC_PER_NODE, else 2. Kill it any time; the same command resumes.
# torchrun is run as "${PYTHON:-python3} -m torch.distributed.run": set PYTHON to the interpreter
# that has torch (e.g. PYTHON=.venv/bin/python) unless python3 is already that one.
set -euo pipefail
nproc="${NPROC_PER_NODE:-2}"
if [[ "${1:-}" == "--nproc-per-node" ]]; then nproc="$2"; shift 2; fi
if [[ $# -lt 1 ]]; then echo "usage: $0 [--nproc-per-node N] SCRIPT [ARGS...]" >&2; exit 2; fi
exec "${PYTHON:-python3}" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node="$nproc" "$@"
