"""What a run keeps for a reader: a bounded sample of episodes in ``rollouts.jsonl``, and curves.png's panels.

A run records the episodes of its first, last and every N-th step and of each evaluation, with the fields
a reader checks (reward and parts, verifier info, group, advantage, policy version, staleness, turns);
a resumed run neither repeats nor loses a record; every text is cut to a bound; the curves show each
diagnostic the run logged.
"""

from __future__ import annotations

import json
import shutil

import pytest

from llmgym import SequenceEnv, Task
from llmgym.rollout.episodes import Episode
from llmgym.runtime.logging import curve_panels, plot_curves, read_metrics
from llmgym.train import Trainer
from llmgym.train.rollouts import MAX_INFO_ITEMS, MAX_TEXT, episode_records, read_rollouts


def _task(rng):
    return Task(f"odd {int(rng.integers(1000))}:", answer="", id=f"odd-{int(rng.integers(1000))}")


def _odd_share(task, completion):
    data = completion.encode("utf-8", errors="replace")
    return sum(b % 2 for b in data) / max(1, len(data))


def _objects(model_dir: str):
    from llmgym.agents import GRPO
    from llmgym.runtime.models import load_model

    model, tok = load_model(model_dir)
    agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4, lr=0.01, kl_coef=0.0, seed=3)
    return agent, SequenceEnv(_task, _odd_share, tok), SequenceEnv(_task, _odd_share, tok)


def test_a_run_records_sampled_episodes_and_a_resume_neither_repeats_nor_loses_one(saved_tiny_model_dir, tmp_path):
    agent, env, eval_env = _objects(saved_tiny_model_dir)
    options = dict(eval_env=eval_env, eval_every=2, eval_tasks=2, checkpoint_every=2, rollouts_every=2,
                   rollouts_per_step=3, progress=False)
    result = Trainer(agent, env, tmp_path, **options).run(3)
    records = read_rollouts(tmp_path)
    # steps 1 (first), 2 (every 2nd) and 3 (last): 3 of the 4 episodes each, whole groups first; the
    # evaluations at steps 2 and 3: their 2 greedy episodes
    assert [(r["step"], r["split"]) for r in records] == [
        (1, "train")] * 3 + [(2, "train")] * 3 + [(2, "eval")] * 2 + [(3, "train")] * 3 + [(3, "eval")] * 2
    train = [r for r in records if r["split"] == "train"]
    assert [r["group"] for r in train[:3]] == [0, 0, 1]
    for r in train:
        assert r["policy_version"] == r["step"] - 1 and r["staleness"] == 0  # the synchronous loop: on-policy
        assert isinstance(r["advantage"], float) and r["prompt"].startswith("odd ") and r["task_id"].startswith("odd-")
        assert r["reward"] == pytest.approx(_odd_share(None, r["completion"]))
        assert r["completion_tokens"] <= 4 and r["turns"] == 1 and "task" not in r["info"]
    # GRPO's advantages of a group of two: equal and opposite, or both zero when the rewards tie
    first = train[:2]
    assert first[0]["advantage"] == pytest.approx(-first[1]["advantage"])
    assert (first[0]["advantage"] == 0) == (first[0]["reward"] == first[1]["reward"])
    # the rows gain what the curves need, and the curves draw it
    row = result.rows[-1]
    assert 0 <= row["zero_var_groups"] <= 1 and row["completion_len_max"] >= row["completion_len"]
    assert row["update_s"] > 0
    assert {"reward", "entropy", "length", "clip", "zero_var", "speed", "time"} <= set(curve_panels(result.rows))

    # a run killed after step 3 whose last checkpoint is step 2, as it wrote a line of each log: its resume
    # drops the cut lines and writes step 3 again, once
    written = (tmp_path / "rollouts.jsonl").read_text()
    shutil.rmtree(tmp_path / "checkpoints" / "last")
    shutil.copytree(tmp_path / "checkpoints" / "step-000002", tmp_path / "checkpoints" / "last")
    for log in ("rollouts.jsonl", "metrics.jsonl"):
        with open(tmp_path / log, "a", encoding="utf-8") as f:
            f.write('{"step": 4, "rew')
    agent, env, eval_env = _objects(saved_tiny_model_dir)
    Trainer.resume(tmp_path, agent, env, **options).run(3)
    assert (tmp_path / "rollouts.jsonl").read_text() == written
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2, 3]


def test_a_pipelined_run_records_the_version_that_sampled_each_episode_and_its_staleness(saved_tiny_model_dir,
                                                                                        tmp_path):
    agent, env, _ = _objects(saved_tiny_model_dir)
    Trainer(agent, env, tmp_path, checkpoint_every=None, max_staleness=1, rollouts_every=1, rollouts_per_step=2,
            progress=False).run(3)
    records = read_rollouts(tmp_path)
    # K = 1: step 1 learns from the base model's samples; steps 2 and 3 from those of one update before
    assert [(r["step"], r["policy_version"], r["staleness"]) for r in records] == [
        (1, 0, 0), (1, 0, 0), (2, 0, 1), (2, 0, 1), (3, 1, 1), (3, 1, 1)]


def test_no_rollouts_file_when_asked_and_bad_settings_are_refused(saved_tiny_model_dir, tmp_path):
    agent, env, _ = _objects(saved_tiny_model_dir)
    Trainer(agent, env, tmp_path, checkpoint_every=None, rollouts_every=0, progress=False).run(1)
    assert not (tmp_path / "rollouts.jsonl").exists()
    with pytest.raises(ValueError, match="rollouts_per_step >= 1"):
        Trainer(agent, env, tmp_path / "x", rollouts_per_step=0)


class _CharTokenizer:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def _ids(text: str) -> list[int]:
    return [ord(c) for c in text]


def test_a_record_is_bounded_and_a_multi_turn_episode_keeps_its_turns_and_tool_calls():
    prompt, first, reply, second = _ids("Q:"), _ids("call()"), _ids("<tool>42</tool>"), _ids("x" * (MAX_TEXT + 500))
    ids = prompt + first + reply + second
    mask = [0] * len(prompt) + [1] * len(first) + [0] * len(reply) + [1] * len(second)
    info = {"task": "dropped", "completion": "dropped", "tool_calls_total": 1,
            "score": {"correct": {"reward": 1.0, "weight": 0.7}, "format": {"reward": 0.0, "weight": 0.3},
                      "many": list(range(MAX_INFO_ITEMS + 10)), "flag": True}}
    episode = Episode(Task("Q:", answer="42", id="t-1"), 3, ids, mask, [0.0] * len(ids), [0.0] * (len(ids) - 1) + [0.7],
                      len(prompt), ["stop", "length"], [len(first), len(second)], info=info,
                      policy_versions=[-1] * len(prompt) + [4] * len(first) + [-1] * len(reply) + [5] * len(second))
    (record,) = episode_records([episode], _CharTokenizer(), step=7, current_version=6)
    assert record["reward_parts"] == {"correct": 1.0, "format": 0.0}
    assert record["policy_version"] == 4 and record["staleness"] == 2  # the oldest weights in the episode
    assert record["turns"] == 2 and record["tool_calls"] == 1 and record["finish_reason"] == "length"
    assert [t["role"] for t in record["transcript"]] == ["policy", "env", "policy"]
    assert record["transcript"][1]["text"] == "<tool>42</tool>"
    assert record["completion"].startswith("call()xxx")  # the policy's words only, not the tool's
    assert len(record["completion"]) < MAX_TEXT + 50 and record["completion"].endswith("more characters]")
    assert len(record["info"]["score"]["many"]) == MAX_INFO_ITEMS + 1  # cut, and says so
    assert "task" not in record["info"] and "completion" not in record["info"]
    assert len(json.dumps(record)) < 3 * MAX_TEXT


def test_curves_draw_a_panel_for_each_logged_diagnostic(tmp_path):
    rows = [{"step": s, "reward_mean": 0.1 * s, "reward_std": 0.1, "kl": 0.01 * s, "entropy": 2.0,
             "completion_len": 5.0, "completion_len_max": 9.0, "clip_frac": 0.1, "zero_var_groups": 0.5,
             "is_weight_mean": 1.0, "is_weight_min": 0.8, "is_weight_max": 1.3, "staleness_mean": 0.5,
             "staleness_max": 1.0, "tokens_per_s": 100.0, "generate_s": 0.2, "verify_s": 0.05, "update_s": 0.3,
             "eval_reward": 0.2 if s == 2 else None} for s in (1, 2, 3)]
    assert curve_panels(rows) == ["reward", "kl", "entropy", "length", "clip", "zero_var", "importance",
                                  "staleness", "speed", "time"]
    assert curve_panels([{"step": 1, "reward_mean": 0.0, "kl": None}]) == ["reward"]  # nothing else logged
    path = plot_curves(rows, tmp_path / "curves.png", title="t")
    from PIL import Image

    with Image.open(path) as image:  # a grid: three panels a row
        assert image.width > 1200 and image.height > 900
