#!/usr/bin/env bash
# An elastic job: between MIN_NODES and MAX_NODES nodes; torchrun restarts the workers when one
# fails or a node leaves (at most MAX_RESTARTS times) and when a node joins, and the script
# resumes from its latest committed checkpoint at the new world size. Run the same command on
# every node.
# Usage: bash launch/elastic.sh SCRIPT [SCRIPT ARGS...]
# Environment: MIN_NODES (default 1), MAX_NODES (default MIN_NODES), MAX_RESTARTS (default 3),
#   NPROC_PER_NODE (default 1), RDZV_ENDPOINT (host:port), RDZV_ID, RDZV_BACKEND (default c10d),
#   LOCAL_ADDR (this node's address that the others reach; default: its fully qualified name).
# Under c10d the rendezvous lives in the agent of the node RDZV_ENDPOINT names: that node's death
# ends the job (its committed steps survive). RDZV_BACKEND=etcd-v2 with RDZV_ENDPOINT=an etcd
# server (v2 API on) outlives any node; it needs `pip install -e '.[etcd]'` (docs/launching.md).
# Example, one node, 2 processes, survives a crashed worker:
#   MIN_NODES=1 NPROC_PER_NODE=2 RDZV_ENDPOINT=127.0.0.1:29400 RDZV_ID=demo \
#     bash launch/elastic.sh launch/train.py --checkpoint ./runs/elastic-demo --global-batch 12
# Workers run SCRIPT through `python -m dist_resume.launched`: kill -9 of this launcher ends them
# (torchrun starts them in sessions of their own, where they would train on).
# torchrun is run with $PYTHON, else the quick start's .venv/bin/python, else python3 (python.sh).
set -euo pipefail
source "$(dirname "$0")/python.sh"
: "${RDZV_ENDPOINT:?set RDZV_ENDPOINT}" "${RDZV_ID:?set RDZV_ID}"
if [[ $# -lt 1 ]]; then echo "usage: $0 SCRIPT [ARGS...]" >&2; exit 2; fi
# torch's c10d and etcd-v2 rendezvous share one TCP store for the workers, hosted by rank 0's
# agent and remembered across rounds: a node that joins a later round waits for its address,
# which rank 0 never publishes again, and the job fails (docs/launching.md). Off by default.
export TORCH_DISABLE_SHARE_RDZV_TCP_STORE="${TORCH_DISABLE_SHARE_RDZV_TCP_STORE:-1}"
min="${MIN_NODES:-1}"
local_addr=()
if [[ -n "${LOCAL_ADDR:-}" ]]; then local_addr=(--local-addr="$LOCAL_ADDR"); fi
exec "$PYTHON" -m torch.distributed.run --nnodes="$min:${MAX_NODES:-$min}" --nproc-per-node="${NPROC_PER_NODE:-1}" \
    --max-restarts="${MAX_RESTARTS:-3}" "${local_addr[@]}" \
    --rdzv-backend="${RDZV_BACKEND:-c10d}" --rdzv-endpoint="$RDZV_ENDPOINT" --rdzv-id="$RDZV_ID" -m dist_resume.launched "$@"
