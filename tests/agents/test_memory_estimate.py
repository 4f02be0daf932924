"""The GPU-memory estimator without a GPU (``benchmarks/memory_estimate.py``): its storage tracker, and a
tiny cell of each side run end to end on fake tensors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import memory_estimate as me  # noqa: E402

MIB = 2**20


def test_tracker_peak_and_what_holds_it():
    """Peak = live bytes at the worst moment; freed storages leave; saved-for-backward is activation."""
    w = torch.nn.Parameter(torch.zeros(MIB // 4))  # 1 MiB of fp32 weights
    opt = torch.optim.SGD([w], lr=0.1)
    tracker = me.LiveStorages([w], opt)
    with tracker:
        a = torch.ones(MIB // 4)  # 1 MiB temporary
        b = a * 2  # 1 MiB: the peak, weights + a + b
        view = b[: MIB // 8]  # a view: no new storage
        del a, b, view
        c = (w * 3).exp()  # back to 3 MiB (w*3 lives until exp returns); exp saves its output for backward
    assert tracker.peak == 3 * MIB
    snap = tracker.snapshot()
    assert snap["weights"] == 1.0 and snap["temporaries"] == 2.0 and snap["activations"] == 0.0
    assert tracker.by["activations"] == MIB and tracker.total == 2 * MIB  # w*3 freed, c saved
    del c


def test_tiny_cell_of_each_side_runs_and_its_composition_adds_up():
    both = me.spawn("both", "tiny", 16, "plain", rows=8, group=4, prompt=8, timeout=240)
    assert set(both) == {"llmgym", "trl"}, both
    for side, r in both.items():
        parts = sum(r[k] for k in me.COMPONENTS)
        assert abs(parts - r["tracked_peak"]) < 0.5, (side, r)  # the classes partition the peak
        weights_mib = r["trained_params_m"] * 1e6 * 4 / MIB  # fp32, every weight trained
        assert abs(r["weights"] - weights_mib) < 0.1, (side, r)
        assert abs(r["optimizer"] - 2 * weights_mib) < 0.1, (side, r)  # AdamW: m and v, allocated before the step
        assert r["activations"] > 0, (side, r)
        assert r["estimate_mib"] == round(r["tracked_peak"] + me.GPU_TERMS["cuda_context_allocated_mib"], 1)
    assert both["llmgym"]["weights"] == both["trl"]["weights"]  # the same model on both sides
    assert both["trl"]["trl_cuda_head"] is True
    # the engine's in-place sums: TRL's one (the tied embedding: head + lookup); llmgym's shared-prompt
    # forward runs the decoder twice, so every weight of it gets two gradient flows
    assert both["trl"]["gradient_sums_in_place"] == 1
    assert both["llmgym"]["gradient_sums_in_place"] > 1
    # the goal, on the small cell too (its batch takes the shared-prompt forward): llmgym's peak <= TRL's
    assert both["llmgym"]["estimate_mib"] <= both["trl"]["estimate_mib"], both


def test_bad_grid_arguments_are_named():
    with pytest.raises(SystemExit, match="unknown shape 'qwen9'"):
        me.main(["--shapes", "qwen9"])
    with pytest.raises(SystemExit, match="unknown mode 'fast'"):
        me.main(["--modes", "fast"])
    with pytest.raises(SystemExit, match="--calibrate needs --llmgym-root"):
        me.main(["--calibrate"])


def test_a_tied_weights_two_gradients_are_summed_in_place():
    """On fake tensors the engine sums a parameter's two gradient flows out of place; the device sums
    them into the first (its only owner): the tracker counts one gradient, not two plus the sum."""
    me._values_read_as_one()
    with me._fake_mode():
        w = torch.nn.Parameter(torch.zeros(512, 512))  # 1 MiB
        x = torch.zeros(4, 512)
        opt = torch.optim.SGD([w], lr=0.1)
        tracker = me.LiveStorages([w], opt)
        with tracker:
            ((x @ w).sum() + (x @ w.t()).sum()).backward()  # two uses of w
    assert tracker.adopted == 1
    assert tracker.by["weights"] == MIB and w.grad is not None
    # w and its one gradient (+ a few KiB of small tensors); out of place it would peak at 4 MiB
    assert tracker.total < 2.1 * MIB and tracker.peak < 3.5 * MIB  # w + both flows; not + their sum too


def test_the_recorded_grid_meets_the_goal_in_every_cell():
    """The committed grid (``results/memory_estimate.json``): both sides ran in every cell, and llmgym's
    estimated peak is at or below TRL's in each — a grid that misses the goal is not committed as met."""
    import json

    report = json.loads((ROOT / "benchmarks" / "results" / "memory_estimate.json").read_text())
    cells = {(c["shape"], c["tokens"], c["mode"]): c for c in report["cells"]}
    assert set(cells) == {(s, t, m) for s in ("qwen2-0.5b", "qwen2-7b") for t in (128, 512, 2048) for m in me.MODES}
    over = {k: (c["llmgym"]["estimate_mib"], c["trl"]["estimate_mib"]) for k, c in cells.items()
            if c["llmgym"]["estimate_mib"] > c["trl"]["estimate_mib"]}
    assert not over, over
