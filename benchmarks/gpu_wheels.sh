#!/usr/bin/env bash
# Wheels the lent GPU machine lacks (it installs nothing; Python 3.12, torch 2.11, transformers 5.17):
# gymnasium for llmgym, TRL and datasets for the side-by-sides. Downloads them into .whl/ (git-ignored),
# which benchmarks/gpu_run.sh installs into /tmp/llmgym-site there; carry ".whl" with the run.
#   bash benchmarks/gpu_wheels.sh            (~3 MB)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
mkdir -p .whl
"$PY" -m pip download -q -d .whl --no-deps --only-binary=:all: --python-version 3.12 --implementation py \
  --abi none --platform any \
  "gymnasium==1.4.0" "farama-notifications==0.0.4" "trl==1.16.0" "datasets==5.2.0" "dill==0.4.1" \
  "multiprocess==0.70.19"
ls -la .whl
