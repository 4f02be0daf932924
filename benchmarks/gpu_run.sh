#!/usr/bin/env bash
# The lent GPU machine installs nothing: lay the package out as it installs (agents/ and envs/ inside
# llmgym/), add carried wheels (gymnasium, trl, datasets, ...) if any, then run gpu_check.py there.
#   bash benchmarks/gpu_run.sh [gpu_check.py arguments]     (wheels: .whl/*.whl from benchmarks/gpu_wheels.sh)
#   bash benchmarks/gpu_run.sh --preset vs-trl             (the decoding modes' CUDA tests and verdicts, the
#                                                           sampler, memory timelines, decoding steps; <= 6 min
#                                                           on one H100, JSON in $OUT)
# Afterwards, in the checkout: python benchmarks/gpu_verdicts.py --promote <the returned gpu_check.json>
set -euo pipefail
cd "$(dirname "$0")/.."
# the commit the run measures (a copy without .git has none: --promote then finds it by the code's digest)
LLMGYM_COMMIT="${LLMGYM_COMMIT:-$(git rev-parse HEAD 2>/dev/null || true)}"; export LLMGYM_COMMIT
P="${LLMGYM_GPU_DIR:-/tmp/llmgym-gpu}"; rm -rf "$P"; mkdir -p "$P"
cp -r benchmarks tests examples pyproject.toml "$P"/
cp -r llmgym "$P"/llmgym; cp -r agents "$P"/llmgym/agents; cp -r envs "$P"/llmgym/envs
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/llmgym-site .whl/*.whl
fi
export PYTHONPATH="$P:/tmp/llmgym-site" PYTHONUNBUFFERED=1
cd "$P" && exec "${PYTHON:-python3}" benchmarks/gpu_check.py "$@"
