#!/usr/bin/env bash
# One-shot GPU check (see benchmarks/gpu_check.py); run from anywhere, extra arguments are passed on.
cd "$(dirname "$0")/.." && exec "${PYTHON:-python}" benchmarks/gpu_check.py "$@"
