#!/usr/bin/env bash
# One machine, N processes.
# Usage: bash launch/singlenode.sh [--nproc-per-node N] SCRIPT [SCRIPT ARGS...]
#   bash launch/singlenode.sh --nproc-per-node 2 launch/train.py --checkpoint ./runs/ckpt
# Default N: $NPROC_PER_NODE, else 2. Kill it any time; the same command resumes.
# Workers run SCRIPT through `python -m dist_resume.launched`: kill -9 of this launcher ends them
# (torchrun starts them in sessions of their own, where they would train on).
# torchrun is run with $PYTHON, else the quick start's .venv/bin/python, else python3 (python.sh).
set -euo pipefail
source "$(dirname "$0")/python.sh"
nproc="${NPROC_PER_NODE:-2}"
if [[ "${1:-}" == "--nproc-per-node" ]]; then nproc="$2"; shift 2; fi
if [[ $# -lt 1 ]]; then echo "usage: $0 [--nproc-per-node N] SCRIPT [ARGS...]" >&2; exit 2; fi
exec "$PYTHON" -m torch.distributed.run --standalone --nnodes=1 --nproc-per-node="$nproc" -m dist_resume.launched "$@"
