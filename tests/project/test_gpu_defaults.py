"""The rule: a GPU-only path that has not passed on a GPU is never a default (issue 28).

The GPU defaults (``resolve_device_defaults``, ``--engine-decode auto``) are read from the committed
record ``llmgym/engines/gpu_record.json``, which ``benchmarks/gpu_check.py --promote`` writes from a
GPU check's verdicts. These CPU tests fail if the default GPU decoder is a mode no GPU run has
passed, if the record is malformed, or if it cites a results file that does not say the same.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from llmgym.agents.learner import resolve_device_defaults
from llmgym.engines.gpu_record import (
    GPU_RECORD,
    GPURecordError,
    default_gpu_decode,
    gpu_verified_decodes,
    load_gpu_record,
    merge_verdicts,
    validate_gpu_record,
)
from llmgym.engines.static_decode import DECODE_MODES

ROOT = Path(__file__).resolve().parents[2]


def test_the_default_gpu_decoder_is_one_a_gpu_run_has_passed():
    record = load_gpu_record()
    gpu = resolve_device_defaults(device="cuda", precision="fp32")["engine_decode"]
    assert record["decode_modes"][gpu]["passed"] is True, f"the GPU default {gpu!r} has not passed a GPU check"
    assert gpu == gpu_verified_decodes(record)[0] == default_gpu_decode()
    # the command line's --engine-decode auto on a GPU resolves the same way
    from llmgym.cli.common import apply_scale_options

    args = argparse.Namespace(dtype="fp32", lora_r=None, lora_alpha=None, gradient_checkpointing=None,
                              micro_batch_size=None, engine_decode="auto", lr_schedule=None, lr_warmup_steps=None)
    assert apply_scale_options(args, {}, 1, "cuda")["engine_decode"] == gpu
    # an explicit mode still wins, and a CPU keeps its own default
    assert resolve_device_defaults("cuda", "fp32", "compiled")["engine_decode"] == "compiled"
    assert resolve_device_defaults("cpu")["engine_decode"] == "static"


def test_every_mode_has_a_verdict_and_cited_results_say_the_same():
    record = load_gpu_record()
    assert set(record["decode_modes"]) == set(DECODE_MODES)
    for mode, verdict in record["decode_modes"].items():
        source = verdict.get("source")
        if source is None:
            continue
        path = ROOT / source
        assert path.is_file(), f"{mode}: the record cites {source}, which is not in the repository"
        results = json.loads(path.read_text())
        assert results["commit"] == verdict["commit"], f"{mode}: {source} ran on another commit"
        assert results["decode_modes"][mode]["passed"] is verdict["passed"], f"{mode}: {source} says otherwise"


def _run(commit="b" * 40):
    return {"commit": commit, "gpu": "NVIDIA H100 80GB", "torch": "2.11.0+cu130", "date_utc": "2026-11-27T09:00:00Z"}


def test_a_passing_gpu_check_promotes_a_mode_and_a_failing_one_demotes_it(tmp_path):
    record = load_gpu_record()
    promoted = merge_verdicts(record, {"compiled": {"passed": True, "checks": {"contract hf-cuda-compiled": True}}},
                              _run(), "benchmarks/results/gpu_check_h100_bbbbbbb.json")
    assert default_gpu_decode(promoted) == "compiled"
    assert promoted["decode_modes"]["static"] == record["decode_modes"]["static"]  # modes not judged stay
    demoted = merge_verdicts(promoted, {"compiled": {"passed": False, "checks": {"engine_steps": False}},
                                        "static": {"passed": False, "checks": {"contract hf-cuda-static": False}}},
                             _run("c" * 40), "benchmarks/results/gpu_check_h100_ccccccc.json")
    assert default_gpu_decode(demoted) == "eager"
    assert "engine_steps" in demoted["decode_modes"]["compiled"]["evidence"]
    nothing = merge_verdicts(demoted, {"eager": {"passed": False}}, _run(), "benchmarks/results/x.json")
    assert gpu_verified_decodes(nothing) == () and default_gpu_decode(nothing) == "eager"
    path = tmp_path / "record.json"
    path.write_text(json.dumps(promoted))
    assert load_gpu_record(path) == promoted


def _valid():
    return json.loads(GPU_RECORD.read_text())


@pytest.mark.parametrize("edit,match", [
    (lambda r: r.update(format=2), "format must be 1"),
    (lambda r: r.pop("decode_modes"), "decode_modes must be an object"),
    (lambda r: r["decode_modes"].update(turbo={}), "unknown mode 'turbo'"),
    (lambda r: r["decode_modes"]["static"].update(passed="yes"), r"static\.passed must be a non-empty bool"),
    (lambda r: r["decode_modes"]["static"].pop("gpu"), r"static\.gpu must be a non-empty str"),
    (lambda r: r["decode_modes"]["static"].update(commit="5cbf4e9"), "full 40-hex commit id"),
    (lambda r: r["decode_modes"]["static"].update(date_utc="yesterday"), "YYYY-MM-DD"),
    (lambda r: r["decode_modes"]["static"].update(evidence=" "), r"static\.evidence must be a non-empty str"),
    (lambda r: r["decode_modes"]["static"].update(source="/etc/passwd"), "benchmarks/results/"),
])
def test_a_malformed_record_is_refused_with_the_field_named(edit, match):
    record = _valid()
    edit(record)
    with pytest.raises(GPURecordError, match=match) as err:
        validate_gpu_record(record)
    assert "\n" not in str(err.value)


def test_an_unreadable_record_says_how_to_restore_it(tmp_path):
    bad = tmp_path / "gpu_record.json"
    bad.write_text("{not json")
    with pytest.raises(GPURecordError, match="restore it from git or write it with benchmarks/gpu_check.py --promote"):
        load_gpu_record(bad)
    with pytest.raises(GPURecordError, match="boolean 'passed'"):
        merge_verdicts(_valid(), {"compiled": {"passed": "yes"}}, _run(), "benchmarks/results/x.json")


def test_the_gpu_check_judges_the_cuda_tests_by_their_output_from_the_engines_folder():
    """``benchmarks/gpu_check.py`` runs the CUDA tests with ``pytest -v`` (their ids start ``tests/engines/``);
    ``gpu_verdicts`` must read those lines, or every mode would fail for want of its contract tests."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_verdicts", ROOT / "benchmarks" / "gpu_verdicts.py")
    verdicts = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(verdicts)
    output = "\n".join([
        "tests/engines/test_engine_contract.py::test_shapes[hf-cuda] PASSED [ 20%]",
        "tests/engines/test_engine_contract.py::test_shapes[hf-cuda-static] PASSED [ 40%]",
        "tests/engines/test_engine_contract.py::test_shapes[hf-cuda-compiled] FAILED [ 60%]",
        f"tests/engines/{verdicts.SAMPLER_CUDA_TEST} PASSED [ 80%]",
        f"tests/engines/{verdicts.COMPILED_TEST} PASSED [100%]",
    ])
    for test in (verdicts.SAMPLER_CUDA_TEST, verdicts.COMPILED_TEST):
        assert (ROOT / "tests" / "engines" / test.split("::")[0]).is_file(), test
    steps = {"ok": True, "ms_per_step": {"HFEngine decode=static": 1.0, "HFEngine decode=compiled": 1.0}}
    judged = verdicts.decode_verdicts(verdicts.pytest_outcomes(output), steps)
    assert {mode: v["passed"] for mode, v in judged.items()} == {"compiled": False, "static": True, "eager": True}
    assert judged["compiled"]["contract_tests"] == {"passed": 0, "failed": 1, "skipped": 0}
