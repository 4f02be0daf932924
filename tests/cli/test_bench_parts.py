"""``llmgym bench`` in parts: a dead server or Ctrl-C keeps the samples done, ``--resume`` finishes the
benchmark as one uninterrupted run would have, and the engine's first call (its warm-up) is timed apart.

The served model here is a loopback stand-in for a crash, not for vLLM: an OpenAI-compatible
``/v1/completions`` whose answer is a function of the request (prompt ids, seed, max_tokens), that
can be told to die after K requests (``tests/engines/test_openai_engine.py`` runs bench against a real
``vllm serve``). Everything else is the real command line and the real ``OpenAIEngine``.
"""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from llmgym.cli import main

pytest.importorskip("openai")

ENV = "llmgym/Copy-v0"


@pytest.fixture(autouse=True)
def small_parts(monkeypatch):
    """Parts of 16 completions (the command's are 128): a few tasks make several parts."""
    monkeypatch.setattr("llmgym.cli.bench.CHUNK_ROWS", 16)


class FakeServer:
    """A loopback OpenAI-compatible server: deterministic completions; ``die_after`` completions, then it stops
    answering (the connection is dropped, the port closed), as a server whose process died."""

    def __init__(self, die_after: int | None = None):
        from llmgym.runtime.models import build_tokenizer

        tok = build_tokenizer()  # the served model's (the tiny model's) ids of the digits
        digits = [tok.encode(str(d), add_special_tokens=False)[0] for d in range(10)]
        self.die_after, self.answered = die_after, 0
        self.lock = threading.Lock()
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def _send(self, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):  # noqa: N802 - the stdlib's naming
                self._send({"object": "list", "data": [{"id": "fake", "object": "model", "owned_by": "vllm"}]})

            def do_POST(self):  # noqa: N802
                request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    dead = outer.die_after is not None and outer.answered >= outer.die_after
                    outer.answered += 0 if dead else 1
                if dead:  # the process is gone: no answer, and the port closes
                    self.close_connection = True
                    threading.Thread(target=outer.close, daemon=True).start()
                    return
                prompt, seed, count = request["prompt"], int(request["seed"]), int(request["max_tokens"])
                ids = [digits[(seed + 7 * j + sum(prompt)) % 10] for j in range(count)]
                self._send({"id": "c", "object": "text_completion", "created": 0, "model": "fake", "choices": [{
                    "index": 0, "text": "", "finish_reason": "length", "token_ids": ids,
                    "logprobs": {"tokens": ["x"] * count, "token_logprobs": [-1.0] * count,
                                 "top_logprobs": None, "text_offset": list(range(count))}}]})

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    servers: list[FakeServer] = []

    def start(die_after: int | None = None) -> FakeServer:
        servers.append(FakeServer(die_after))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def bench_args(url: str, out: Path | None, *extra: str) -> list[str]:
    return ["bench", "--env", ENV, "--engine", "openai", "--base-url", url, "--engine-arg", "max_retries=0",
            "--engine-arg", "max_concurrency=4", "--samples", "4", "--tasks", "10", "--max-new-tokens", "5",
            *(["--out", str(out)] if out is not None else []), *extra]


def summary(path: Path) -> tuple[list, list]:
    report = json.loads(path.read_text())
    lines = path.with_name(path.stem + ".samples.jsonl").read_text().split("\n")  # not splitlines(): U+2028
    records = [json.loads(line) for line in lines if line]
    keep = ("task_id", "task_index", "sample", "reward", "completion")
    return report["per_task"], [{k: r[k] for k in keep} for r in records]


def test_a_server_that_dies_keeps_the_done_samples_and_resume_finishes_as_one_run(server, tmp_path, capsys):
    straight = tmp_path / "straight.json"
    assert main(bench_args(server().url, straight)) == 0
    expected = summary(straight)
    assert len(expected[1]) == 40 and any(r["reward"] > 0 for r in expected[1])  # rewards that can differ

    out = tmp_path / "split.json"
    # 1 warm-up request + 16 (the first part's 4 tasks x 4) + a few of the second part: then the server dies
    assert main(bench_args(server(die_after=20).url, out)) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0, err  # one line, no traceback
    assert "bench stopped after 16 of 40 samples" in err and "--resume" in err and str(out.stem) in err
    kept = [line for line in out.with_name("split.samples.jsonl").read_text().split("\n") if line]
    assert len(kept) == 16 and out.with_name("split.partial.json").is_file() and not out.exists()

    # the same command again is refused (not silently restarted), and --resume checks the settings
    assert main(bench_args(server().url, out)) == 2
    assert "unfinished benchmark (16 samples kept" in capsys.readouterr().err
    assert main(bench_args(server().url, out, "--resume", "--seed", "1")) == 2
    assert "was sampled with seed 0" in capsys.readouterr().err

    assert main(bench_args(server().url, out, "--resume")) == 0  # a new server (another port): fine
    report = json.loads(out.read_text())
    assert report["resumed_samples"] == 16 and report["timed_samples"] == 24
    assert summary(out) == expected and not out.with_name("split.partial.json").exists()


def test_without_out_the_done_samples_go_to_a_named_file_that_resume_takes(server, tmp_path, capsys):
    straight = tmp_path / "straight.json"
    assert main(bench_args(server().url, straight)) == 0
    assert main(bench_args(server(die_after=25).url, None)) == 2
    err = capsys.readouterr().err.strip()
    rescue = err.split("--out ")[1].split()[0]
    assert err.endswith("--resume") and Path(rescue).with_name(Path(rescue).stem + ".samples.jsonl").is_file()
    try:
        assert main(bench_args(server().url, Path(rescue), "--resume")) == 0
        assert summary(Path(rescue)) == summary(straight)
    finally:
        for suffix in (".json", ".samples.jsonl", ".partial.json"):
            Path(rescue).with_name(Path(rescue).stem + suffix).unlink(missing_ok=True)


def test_ctrl_c_keeps_the_done_parts_and_exits_130(tmp_path, monkeypatch, capsys):
    """In process, with transformers: Ctrl-C in the second part (after 8 tasks x 2 samples)."""
    from llmgym.engines import HFEngine

    args = ["bench", "--env", ENV, "--samples", "2", "--tasks", "20", "--max-new-tokens", "4"]
    straight = tmp_path / "straight.json"
    assert main([*args, "--out", str(straight)]) == 0
    calls = []
    generate = HFEngine.generate

    def interrupted(self, *a, **kw):
        calls.append(1)
        if len(calls) == 3:  # warm-up, part 1, then part 2
            raise KeyboardInterrupt
        return generate(self, *a, **kw)

    monkeypatch.setattr(HFEngine, "generate", interrupted)
    out = tmp_path / "split.json"
    assert main([*args, "--out", str(out)]) == 130
    assert "bench stopped after 16 of 40 samples (interrupted (Ctrl-C))" in capsys.readouterr().out
    monkeypatch.undo()
    assert main([*args, "--out", str(out), "--resume"]) == 0
    assert summary(out) == summary(straight)


def test_bench_in_parts_samples_what_one_rollout_would_and_times_the_warm_up_apart(tmp_path):
    """Parts of CHUNK_ROWS rows, keyed as rows of one run: the records equal one collect_episodes call's."""
    import llmgym.cli.bench
    import gymnasium as gym
    import torch

    from llmgym.engines import HFEngine, SamplingParams
    from llmgym.runtime.models import load_model
    from llmgym.rollout import collect_episodes, distinct_tasks

    import time

    from llmgym.engines import HFEngine

    generate, calls = HFEngine.generate, []

    def slow_first_call(self, *a, **kw):  # an engine whose first call carries a start-up, as vLLM's does
        calls.append(1)
        if len(calls) == 1:
            time.sleep(3.0)
        return generate(self, *a, **kw)

    out = tmp_path / "b.json"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(HFEngine, "generate", slow_first_call)
        assert main(["bench", "--env", ENV, "--samples", "3", "--tasks", "20", "--max-new-tokens", "4",
                     "--seed", "5", "--out", str(out)]) == 0
    assert 20 * 3 > 3 * llmgym.cli.bench.CHUNK_ROWS  # four parts
    report = json.loads(out.read_text())
    assert report["warmup_s"] >= 3.0 and report["timed_samples"] == 60  # the first call, apart,
    assert report["generate_s"] < 3.0  # not in the sampling time tokens/s divides by (60 x 4 tokens take ~0.2 s)
    model, tok = load_model("tiny")
    env = gym.make(ENV, tokenizer=tok)
    tasks, _ = distinct_tasks(env, 20, seed=5)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as bench ran the tiny model: the same kernels, the same floats
    try:
        episodes, _ = collect_episodes(env, HFEngine(model, tok), num_tasks=20, tasks=tasks, group_size=3,
                                       sampling=SamplingParams(max_new_tokens=4), seed=5)
    finally:
        torch.set_num_threads(threads)
    records = [json.loads(line) for line in out.with_name("b.samples.jsonl").read_text().split("\n") if line]
    assert [r["completion"] for r in records] == [tok.decode(e.completion_ids, skip_special_tokens=True)
                                                  for e in episodes]


def _six_sums(rng):
    from llmgym import Task

    return Task(f"What is {int(rng.integers(6))} + 1?", answer="?")


def make_six_sums_env(tokenizer=None, **kwargs):
    from llmgym.tools import ToolEnv
    from tool_fixtures import add, exact

    return ToolEnv(_six_sums, exact, tokenizer, tools=[add], **kwargs)


@pytest.fixture
def six_sums():
    import gymnasium

    from llmgym import register_env
    from llmgym.env import registry

    env_id = register_env("SixSums", make_six_sums_env, family="test", multi_turn=True)
    yield env_id
    registry._INFO.pop(env_id, None)
    gymnasium.registry.pop(env_id, None)


def test_a_procedural_env_with_fewer_tasks_than_the_default_benches_all_it_has(six_sums, tmp_path, capsys):
    """A tool env whose generator knows 6 tasks: no --tasks needed; an explicit larger count is still an error."""
    out = tmp_path / "six.json"
    assert main(["bench", "--env", "llmgym/SixSums-v0", "--samples", "1", "--max-new-tokens", "4",
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "has 6 distinct tasks, fewer than the default 64: benchmarking all of them" in printed
    report = json.loads(out.read_text())
    assert report["tasks"] == 6 and report["task_selection"].startswith("all 6 distinct tasks found")
    assert main(["bench", "--env", "llmgym/SixSums-v0", "--samples", "1", "--tasks", "7"]) == 2
    assert "found only 6 distinct tasks" in capsys.readouterr().err
