"""The sampler-vs-learner mismatch of a run, where its user looks: ``metrics.jsonl``, the trackers, the
curves (a panel of its own, per version lag) and the report page's summary."""

from __future__ import annotations

import json
import sys
import types

import gymnasium
import pytest

import llmgym  # noqa: F401  (registers the envs)
from llmgym.runtime.logging import curve_panels, mismatch_lags, plot_curves, read_metrics
from llmgym.train import Trainer
from llmgym.train.report import report_data


class _Engine:
    """The tiny model's HF engine, reporting every sampled token's log-prob 0.3 nats low: a known δ = 0.3."""

    def __init__(self, engine):
        self._engine = engine

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def generate(self, *args, **kwargs):
        groups = self._engine.generate(*args, **kwargs)
        for group in groups:
            for completion in group:
                completion.logprobs = [lp - 0.3 for lp in completion.logprobs]
        return groups


@pytest.fixture
def tracker(monkeypatch):
    """A stand-in ``wandb`` module that keeps what it is given."""
    logged: list[dict] = []
    fake = types.SimpleNamespace(init=lambda **kw: types.SimpleNamespace(id="fake-run"),
                                 log=lambda numbers, step: logged.append(dict(numbers)), finish=lambda: None,
                                 Table=lambda columns, data: None)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    return logged


def test_a_run_shows_its_mismatch_in_metrics_trackers_curves_and_report(tiny_model, tokenizer, tmp_path, tracker):
    from llmgym.agents import GRPO
    from llmgym.agents.mismatch import MismatchWarning

    agent = GRPO(tiny_model, tokenizer, tasks_per_step=2, group_size=2, max_new_tokens=4, lr=0.0, kl_coef=0.0,
                  mismatch_prob_error_warn=None)
    agent.engine = _Engine(agent.engine)
    env = gymnasium.make("llmgym/Copy-v0", tokenizer=tokenizer)
    with pytest.warns(MismatchWarning, match="step 1: mismatch_kl"):
        Trainer(agent, env, tmp_path, checkpoint_every=None, rollouts_every=0, progress=False,
                trackers=["wandb"]).run(2)
    rows = read_metrics(tmp_path / "metrics.jsonl")
    expected = 2.718281828 ** 0.3 - 1.3  # k3 at δ = 0.3 (lr 0: the learner keeps the sampling weights)
    assert [round(r["mismatch_kl"], 4) for r in rows] == [round(expected, 4)] * 2
    assert all(abs(r["mismatch_prob_error"] - 2.718281828 ** 0.3) < 1e-4 for r in rows)
    assert [round(n["mismatch_kl"], 4) for n in tracker if "mismatch_kl" in n] == [round(expected, 4)] * 2
    assert "mismatch" in curve_panels(rows)
    data = report_data(tmp_path)
    assert data["summary"]["sampler–learner KL, k3 (last measured)"] == pytest.approx(expected, abs=1e-4)
    largest, _, step = data["summary"]["sampler–learner KL, k3 (largest)"].partition(" at step ")
    assert float(largest) == pytest.approx(expected, abs=1e-4) and step in ("1", "2")
    assert data["summary"]["token probability error (last measured)"] == pytest.approx(2.718281828 ** 0.3, abs=1e-4)


def test_curves_draw_the_mismatch_by_lag_and_the_page_ignores_what_is_not_a_number(tmp_path):
    rows = [{"step": s, "reward_mean": 0.1, "mismatch_kl": 1e-3 * s, "mismatch_prob_error": 1.0 + 0.01 * s,
             "mismatch_kl/lag0": 1e-3, "mismatch_kl/lag2": 5e-3 * s, "mismatch_kl/lag9x": 1.0} for s in (1, 2, 3)]
    assert curve_panels(rows) == ["reward", "mismatch"] and mismatch_lags(rows) == [0, 2]
    assert plot_curves(rows, tmp_path / "curves.png").stat().st_size > 0
    assert curve_panels([{"step": 1, "reward_mean": 0.0, "mismatch_kl": None}]) == ["reward"]  # not measured
    run = tmp_path / "run"
    run.mkdir()
    lines = [{"step": 1, "reward_mean": 0.1, "mismatch_kl": "0.5"}, {"step": 2, "reward_mean": 0.1, "mismatch_kl": True},
             {"step": 3, "reward_mean": 0.1, "mismatch_kl": 0.002, "mismatch_prob_error": 1.04}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    summary = report_data(run)["summary"]
    assert summary["sampler–learner KL, k3 (last measured)"] == 0.002
    assert summary["sampler–learner KL, k3 (largest)"] == "0.002 at step 3"
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.1}) + "\n")
    assert not any("KL" in k for k in report_data(run)["summary"])  # never measured: not on the page
