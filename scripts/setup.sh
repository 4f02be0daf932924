#!/usr/bin/env bash
# Set up .venv for llmgym: torch first (a CPU build unless you already have torch), then the project.
#   bash scripts/setup.sh          # runtime: llmgym + its dependencies
#   bash scripts/setup.sh --test   # + test dependencies and (as root) the code sandbox's system packages
# Env: PYTHON (interpreter, default python3), LLMGYM_TORCH ("torch==2.13.0"), LLMGYM_TORCH_INDEX
# (an index URL for torch, e.g. https://download.pytorch.org/whl/cpu where PyPI would give a CUDA build).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
TORCH_SPEC="${LLMGYM_TORCH:-torch==2.13.0}"
extras=""
[[ "${1:-}" == "--test" ]] && extras="[test]"
torch_version="from importlib.metadata import version; print(version('torch'))"

if [[ ! -x .venv/bin/python ]]; then
  if "$PYTHON" -c "import torch" 2>/dev/null; then
    # respect the torch the user already has: let the venv see it instead of installing another
    echo "setup: reusing the torch of $PYTHON ($("$PYTHON" -c "$torch_version"))"
    "$PYTHON" -m venv --system-site-packages .venv
  else
    "$PYTHON" -m venv .venv
  fi
fi
PY=.venv/bin/python
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "setup: installing $TORCH_SPEC first (so pip does not pick a multi-GB CUDA build for the project)"
  if [[ -n "${LLMGYM_TORCH_INDEX:-}" ]]; then
    "$PY" -m pip install -q "$TORCH_SPEC" --index-url "$LLMGYM_TORCH_INDEX"
  else
    "$PY" -m pip install -q "$TORCH_SPEC"
  fi
fi
# pin whatever torch is now present, so the project's install keeps it (its version read from the
# package metadata: importing torch before numpy is installed warns "Failed to initialize NumPy")
constraints="$(mktemp)"
echo "torch==$("$PY" -c "$torch_version" | cut -d+ -f1)" > "$constraints"
"$PY" -m pip install -q -c "$constraints" -e ".$extras"
rm -f "$constraints"

if [[ -n "$extras" ]]; then
  if [[ "$(id -u)" == "0" ]]; then
    bash .ci/install-sandbox.sh
  elif ! command -v bwrap >/dev/null; then
    echo "setup: bubblewrap is missing; model code and model text for third-party scorers (math-verify, reasoning-gym) run only in the sandbox. Install it as root:" \
         "sudo bash .ci/install-sandbox.sh" >&2
  fi
fi
echo "setup: ready ($("$PY" -c 'import torch, transformers, gymnasium; print("torch", torch.__version__, "| transformers", transformers.__version__, "| gymnasium", gymnasium.__version__)'))"
