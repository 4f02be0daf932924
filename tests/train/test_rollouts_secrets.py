"""A secret the model echoed is not written into ``rollouts.jsonl``: the values of the process's secret-named
environment variables and the secrets the run registered (a fleet's) come out as ``[redacted]``, in the
completion, the prompt and the verifier's info, even where the text is cut right after it."""

from __future__ import annotations

from llmgym import Task
from llmgym.rollout.episodes import Episode
from llmgym.runtime import secrets as secrets_module
from llmgym.runtime.secrets import REDACTED, register_secret
from llmgym.train.rollouts import MAX_TEXT, RolloutLog, episode_records, read_rollouts


class CharTokenizer:
    """One character per id."""

    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(i) for i in ids)


def _episode(prompt: str, completion: str, info: dict) -> Episode:
    ids = [ord(c) for c in completion]
    n = len(ids)
    return Episode(Task(prompt, answer="4", id="t-1"), 0, ids, [1] * n, [0.0] * n, [0.0] * (n - 1) + [1.0], 0,
                   ["stop"], [n], info=info)


def test_secrets_the_model_echoed_are_redacted_in_rollouts_jsonl(monkeypatch, tmp_path):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-5b7e01c2")
    monkeypatch.setenv("LLMGYM_SERVE_SECRET", "fleet-a9d3c4e5f6")
    monkeypatch.setenv("MY_TOKEN", "tok-0f1e2d3c")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false-but-long")  # not a secret's name: kept
    monkeypatch.setenv("OTHER_API_KEY", "EMPTY")  # too short to be a secret: kept
    monkeypatch.setattr(secrets_module, "_registered", set())
    register_secret("from-a-secret-file-77")  # a fleet secret read from a file, never in the environment
    completion = ("env says OPENAI_API_KEY=sk-live-5b7e01c2 LLMGYM_SERVE_SECRET=fleet-a9d3c4e5f6 MY_TOKEN=tok-0f1e2d3c "
                  "file=from-a-secret-file-77 TOKENIZERS_PARALLELISM=false-but-long key=EMPTY")
    info = {"reply": [{"content": "sk-live-5b7e01c2"}], "from-a-secret-file-77": 1}
    with RolloutLog(tmp_path, every=1, per_step=4) as log:
        log.write(episode_records([_episode("say fleet-a9d3c4e5f6", completion, info)], CharTokenizer(), step=1))
    text = (tmp_path / "rollouts.jsonl").read_text()
    for value in ("sk-live-5b7e01c2", "fleet-a9d3c4e5f6", "tok-0f1e2d3c", "from-a-secret-file-77"):
        assert value not in text
    (record,) = read_rollouts(tmp_path)
    assert record["completion"] == (f"env says OPENAI_API_KEY={REDACTED} LLMGYM_SERVE_SECRET={REDACTED} "
                                    f"MY_TOKEN={REDACTED} file={REDACTED} TOKENIZERS_PARALLELISM=false-but-long key=EMPTY")
    assert record["prompt"] == f"say {REDACTED}"
    assert record["info"]["reply"] == [{"content": REDACTED}] and REDACTED in record["info"]


def test_a_secret_cut_by_the_length_limit_leaves_no_prefix(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-5b7e01c2")
    completion = "x" * (MAX_TEXT - 6) + "sk-live-5b7e01c2" + "y" * 10
    (record,) = episode_records([_episode("p", completion, {})], CharTokenizer(), step=1)
    assert "sk-live" not in record["completion"] and "sk-li" not in record["completion"]


def test_secrets_the_model_echoed_are_redacted_in_bench_samples(monkeypatch):
    """Found by the second attacker's pass: ``rollouts.jsonl`` redacted an echoed secret, but ``llmgym bench --out``'s
    per-sample records (``FILE.samples.jsonl``: the completion, the transcript and the verifier's info) wrote it
    as the model said it. Rule: every record of model text a command writes goes through the same redaction."""
    from llmgym.cli.bench import sample_records

    monkeypatch.setenv("OPENAI_API_KEY", "sk-live-5b7e01c2")
    monkeypatch.setattr(secrets_module, "_registered", set())
    register_secret("from-a-secret-file-77")
    episode = _episode("p", "key sk-live-5b7e01c2 and from-a-secret-file-77", {"reply": "sk-live-5b7e01c2"})
    (record,) = sample_records([episode], [episode.task], 1, 1.0, CharTokenizer(), multi_turn=True)
    text = repr(record)
    assert "sk-live-5b7e01c2" not in text and "from-a-secret-file-77" not in text
    assert record["completion"] == f"key {REDACTED} and {REDACTED}" and record["info"]["reply"] == REDACTED
