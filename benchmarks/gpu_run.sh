#!/usr/bin/env bash
# The lent GPU machine installs nothing: lay the package out as it installs (agents/ and envs/ inside
# llmgym/), add carried wheels (gymnasium, trl, datasets, ...) if any, then run gpu_check.py there.
#   bash benchmarks/gpu_run.sh [gpu_check.py arguments]     (wheels: .whl/*.whl from benchmarks/gpu_wheels.sh)
#   bash benchmarks/gpu_run.sh --preset vs-trl             (issue 23: memory timelines, 512-token side by side,
#                                                           decoding steps; ~5.5 min on one H100, JSON in $OUT)
set -euo pipefail
cd "$(dirname "$0")/.."
P=/tmp/llmgym-gpu; rm -rf "$P"; mkdir -p "$P"
cp -r benchmarks tests examples pyproject.toml "$P"/
cp -r llmgym "$P"/llmgym; cp -r agents "$P"/llmgym/agents; cp -r envs "$P"/llmgym/envs
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llmgym-site .whl/*.whl
fi
export PYTHONPATH="$P:/tmp/llmgym-site" PYTHONUNBUFFERED=1
cd "$P" && exec "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
