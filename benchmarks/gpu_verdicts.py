"""The GPU check's verdict on each ``HFEngine`` decoding mode, and its promotion into the committed record.

``benchmarks/gpu_check.py`` calls :func:`run_identity` (the commit and a digest of the code it runs)
and :func:`decode_verdicts` (pass / fail per mode, from the CUDA tests and the engine sections) and
stores both in its JSON. After a GPU run, in a git checkout::

    python benchmarks/gpu_verdicts.py --promote path/to/gpu_check.json

checks that the code the run measured is a commit of this repository (the digest of its ``.py``
files; the lent GPU machine gets a copy of the tree without ``.git``, so the commit is found by
digest when the run could not name it), copies the JSON to
``benchmarks/results/gpu_check_<gpu>_<commit>.json`` and writes its verdicts into
``llmgym/engines/gpu_record.json`` (:func:`llmgym.engines.gpu_record.merge_verdicts`). Commit both:
the GPU defaults follow the record (docs/scale.md, "The GPU check").

A mode passes when every check below passed (a check that did not run fails it):

* every mode: its variant of ``tests/engines/test_engine_contract.py`` on CUDA (``hf-cuda`` = eager,
  ``hf-cuda-static``, ``hf-cuda-compiled``) ran with no failure, and the keyed sampler's CUDA test
  (``tests/engines/test_sampling.py``: same draws as on CPU) passed;
* ``static`` and ``compiled``: the ``engine_steps`` section decoded the Qwen2-0.5B shape in that mode;
* ``compiled``: also ``tests/engines/test_static_decode.py::test_compiled_step_gives_the_eager_tokens`` on CUDA.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

__all__ = ["CONTRACT_KINDS", "source_digest", "commit_digest", "run_identity", "pytest_outcomes",
           "decode_verdicts", "promote"]

CONTRACT_KINDS = {"compiled": "hf-cuda-compiled", "static": "hf-cuda-static", "eager": "hf-cuda"}
"""The contract suite's engine variant that judges each mode (longest names first: they share a prefix)."""

SAMPLER_CUDA_TEST = "test_sampling.py::test_the_same_keys_draw_the_same_tokens_on_cuda_and_cpu"
COMPILED_TEST = "test_static_decode.py::test_compiled_step_gives_the_eager_tokens"


def _package_files(root: Path) -> dict[str, Path]:
    """``{installed path: file}`` of the package's ``.py`` files, from a checkout (``agents/`` and
    ``envs/`` at the top) or from gpu_run.sh's installed layout (``llmgym/agents``)."""
    tops = {"llmgym": "llmgym"}
    if (root / "agents" / "__init__.py").is_file():
        tops.update(agents="llmgym/agents", envs="llmgym/envs")
    files = {}
    for top, installed in tops.items():
        for path in sorted((root / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                files[installed + "/" + path.relative_to(root / top).as_posix()] = path
    return files


def _digest(named_contents) -> str:
    h = hashlib.sha256()
    for name, content in sorted(named_contents):
        h.update(name.encode() + b"\0" + hashlib.sha256(content).hexdigest().encode() + b"\n")
    return h.hexdigest()


def source_digest(root: Path = ROOT) -> str:
    """sha256 over the package's ``.py`` files (installed paths and contents) under ``root``."""
    return _digest((name, path.read_bytes()) for name, path in _package_files(root).items())


def _git(*args: str, repo: Path = ROOT, text: bool = True):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=text, check=True).stdout


def commit_digest(commit: str, repo: Path = ROOT) -> str:
    """:func:`source_digest` of the tree of ``commit`` (read from git, not the working tree)."""
    mapping = {"llmgym/": "llmgym/", "agents/": "llmgym/agents/", "envs/": "llmgym/envs/"}
    listing = _git("ls-tree", "-r", "--name-only", commit, "--", "llmgym", "agents", "envs", repo=repo).split("\n")
    named = []
    for path in listing:
        if not path.endswith(".py"):
            continue
        top = next(t for t in mapping if path.startswith(t))
        named.append((mapping[top] + path[len(top):], _git("show", f"{commit}:{path}", repo=repo, text=False)))
    return _digest(named)


def run_identity(root: Path = ROOT) -> dict:
    """``{"commit", "source_digest", "dirty"}`` of the code this process runs (commit ``None`` where
    there is no git and ``LLMGYM_COMMIT`` is unset: --promote then finds it by digest)."""
    commit, dirty = os.environ.get("LLMGYM_COMMIT") or None, None
    try:
        commit = commit or _git("rev-parse", "HEAD", repo=root).strip()
        dirty = bool(_git("status", "--porcelain", "--", "llmgym", "agents", "envs", repo=root).strip())
    except (OSError, subprocess.CalledProcessError):
        pass
    return {"commit": commit, "source_digest": source_digest(root), "dirty": dirty}


# keyed by file name: tests live in folders by subsystem (tests/engines/...), their names are unique
_OUTCOME = re.compile(r"^(?:tests/(?:\w+/)*)?(\S+\.py::\S+) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)\b", re.M)


def pytest_outcomes(verbose_output: str) -> dict[str, str]:
    """``{"file.py::test[id]": "passed" | "failed" | "skipped"}`` from ``pytest -v`` output (line by
    line as tests finish, so a run stopped by its time-out still reports what it ran).

    Example:
        >>> pytest_outcomes("tests/engines/test_engine_contract.py::test_x[hf-cuda] PASSED   [ 50%]\\n"
        ...                 "tests/engines/test_sampling.py::test_y ERROR")
        {'test_engine_contract.py::test_x[hf-cuda]': 'passed', 'test_sampling.py::test_y': 'failed'}
    """
    word = {"PASSED": "passed", "XPASS": "passed", "SKIPPED": "skipped", "XFAIL": "skipped"}
    return {name: word.get(status, "failed") for name, status in _OUTCOME.findall(verbose_output)}


def _kind_of(test_id: str) -> str | None:
    params = test_id.partition("[")[2]
    for mode, kind in CONTRACT_KINDS.items():  # hf-cuda-compiled before hf-cuda
        if re.search(rf"(^|-){re.escape(kind)}(-|\]|$)", params):
            return mode
    return None


def decode_verdicts(outcomes: dict[str, str] | None, engine_steps: dict | None,
                    tests_finished: bool = True) -> dict[str, dict]:
    """Pass / fail per decoding mode with the checks behind it (see the module docstring).

    ``outcomes``: :func:`pytest_outcomes` of the CUDA tests (``None``: they did not run, every mode
    fails); ``engine_steps``: that section's result (``ok`` and ``ms_per_step`` rows);
    ``tests_finished``: false when the test run was stopped by its time-out (then a mode's tests may
    not all have run, and no mode passes).

    Example:
        >>> v = decode_verdicts({"test_engine_contract.py::test_a[hf-cuda]": "passed", SAMPLER_CUDA_TEST: "passed"}, None)
        >>> v["eager"]["passed"], v["static"]["passed"]
        (True, False)
        >>> decode_verdicts({"test_engine_contract.py::test_a[hf-cuda]": "passed", SAMPLER_CUDA_TEST: "passed"}, None,
        ...                 tests_finished=False)["eager"]["passed"]
        False
    """
    outcomes = outcomes or {}
    steps_rows = (engine_steps or {}).get("ms_per_step", {}) if (engine_steps or {}).get("ok") else {}
    sampler_ok = outcomes.get(SAMPLER_CUDA_TEST) == "passed"
    verdicts = {}
    for mode, kind in CONTRACT_KINDS.items():
        mine = [o for t, o in outcomes.items() if t.startswith("test_engine_contract.py::") and _kind_of(t) == mode]
        checks = {"the CUDA tests ran to the end": tests_finished,
                  f"contract tests ({kind})": "passed" in mine and "failed" not in mine,
                  "sampler on CUDA = on CPU": sampler_ok}
        if mode != "eager":
            checks[f"engine_steps decoded the Qwen2-0.5B shape ({mode})"] = f"HFEngine decode={mode}" in steps_rows
        if mode == "compiled":
            checks["compiled step = eager tokens"] = outcomes.get(COMPILED_TEST) == "passed"
        verdicts[mode] = {"passed": all(checks.values()), "checks": checks,
                          "contract_tests": {"passed": mine.count("passed"), "failed": mine.count("failed"),
                                             "skipped": mine.count("skipped")}}
    return verdicts


def _find_commit(digest: str, repo: Path, depth: int = 100) -> str | None:
    for commit in _git("rev-list", f"--max-count={depth}", "HEAD", repo=repo).split():
        if commit_digest(commit, repo) == digest:
            return commit
    return None


def promote(result_path: Path, repo: Path = ROOT, record_path: Path | None = None) -> dict:
    """Check a GPU check's JSON against this repository's history and write its verdicts into the
    record (see the module docstring); returns the new record."""
    sys.path.insert(0, str(repo))
    from llmgym.engines.gpu_record import GPU_RECORD, GPURecordError, load_gpu_record, merge_verdicts

    data = json.loads(Path(result_path).read_text())
    if data.get("mode") != "gpu":
        raise GPURecordError(f"{result_path}: not a GPU run (mode {data.get('mode')!r}); a CPU smoke run promotes nothing")
    verdicts, digest = data.get("decode_modes"), data.get("source_digest")
    if not isinstance(verdicts, dict) or not verdicts or not isinstance(digest, str):
        raise GPURecordError(f"{result_path}: no decode_modes / source_digest (run benchmarks/gpu_check.py "
                             "with its contract tests; --skip-tests judges nothing)")
    commit = data.get("commit")
    try:
        named_digest = commit_digest(commit, repo) if commit else None
    except subprocess.CalledProcessError:  # a commit this repository does not have: find it by digest
        commit = named_digest = None
    if commit and named_digest != digest:
        raise GPURecordError(f"{result_path}: the code it ran differs from commit {commit[:12]} (a dirty tree?): "
                             "commit first, then run the GPU check again")
    commit = commit or _find_commit(digest, repo)
    if commit is None:
        raise GPURecordError(f"{result_path}: the code it ran matches none of the last 100 commits (a dirty tree?): "
                             "commit first, then run the GPU check again")
    env = data.get("sections", {}).get("environment", {})
    gpu = str(env.get("gpu") or "gpu")
    slug = re.sub(r"[^a-z0-9]+", "_", gpu.lower()).strip("_")
    dest = repo / "benchmarks" / "results" / f"gpu_check_{slug}_{commit[:7]}.json"
    data["commit"] = commit
    dest.write_text(json.dumps(data, indent=1, default=str))
    run = {"commit": commit, "gpu": gpu, "torch": str(env.get("torch") or "unknown"),
           "date_utc": str(data.get("started_utc") or "")}
    record_path = record_path or GPU_RECORD
    record = merge_verdicts(load_gpu_record(record_path), verdicts, run, dest.relative_to(repo).as_posix())
    record_path.write_text(json.dumps(record, indent=1) + "\n")
    for mode, v in record["decode_modes"].items():
        print(f"{mode:9s} passed={v['passed']!s:5s} {v['commit'][:12]} {v['gpu']}: {v['evidence'][:100]}")
    print(f"wrote {dest.relative_to(repo)} and {record_path}; commit both")
    return record


def main(argv=None) -> int:
    sys.path.insert(0, str(ROOT))
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--promote", type=Path, required=True, metavar="GPU_CHECK_JSON")
    args = parser.parse_args(argv)
    if shutil.which("git") is None:
        print("--promote needs git (it checks the run's code against a commit)")
        return 2
    from llmgym.engines.gpu_record import GPURecordError

    try:
        promote(args.promote)
    except (GPURecordError, OSError, json.JSONDecodeError) as err:
        print(f"not promoted: {err}")
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
