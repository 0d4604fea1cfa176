#!/usr/bin/env bash
# Several machines, one torchrun job, c10d rendezvous. Run the same command on every node.
# Usage: bash launch/multinode.sh SCRIPT [SCRIPT ARGS...]
# Environment (all required except where a default is given):
#   NNODES           number of nodes
#   NPROC_PER_NODE   processes per node (default 1)
#   RDZV_ENDPOINT    host:port of the rendezvous, reachable from every node (e.g. trainer0:29400)
#   RDZV_ID          job id shared by the nodes
#   RDZV_BACKEND     default c10d
#   CHECKPOINT_URL   read by launch/train.py when --checkpoint is not given
# Example (docker-compose.yml): bash launch/multinode.sh launch/train.py
# Workers run SCRIPT through `python -m dist_resume.launched`: kill -9 of this launcher ends them
# (torchrun starts them in sessions of their own, where they would train on).
# torchrun is run with $PYTHON, else the quick start's .venv/bin/python, else python3 (python.sh).
set -euo pipefail
source "$(dirname "$0")/python.sh"
: "${NNODES:?set NNODES}" "${RDZV_ENDPOINT:?set RDZV_ENDPOINT}" "${RDZV_ID:?set RDZV_ID}"
if [[ $# -lt 1 ]]; then echo "usage: $0 SCRIPT [ARGS...]" >&2; exit 2; fi
exec "$PYTHON" -m torch.distributed.run --nnodes="$NNODES" --nproc-per-node="${NPROC_PER_NODE:-1}" \
    --rdzv-backend="${RDZV_BACKEND:-c10d}" --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="$RDZV_ID" -m dist_resume.launched "$@"
