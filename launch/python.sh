# Sourced by the launch scripts: the interpreter that runs torchrun. $PYTHON if set, else the
# quick start's virtual environment beside launch/ (.venv/bin/python) if it exists, else python3.
if [[ -z "${PYTHON:-}" ]]; then
    PYTHON=python3
    if [[ -x "$(dirname "$0")/../.venv/bin/python" ]]; then PYTHON="$(dirname "$0")/../.venv/bin/python"; fi
fi
