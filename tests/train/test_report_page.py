"""``llmgym report``: one self-contained HTML page of a run or a benchmark, checked in a real headless Chromium.

The page loads with no console error and no request leaving it, shows the curves and the sampled
episodes, and its search and reward filter work; model text on it is text, never markup (a completion
that closes the page's script or carries an event handler runs nothing). The browser is Debian's
chromium driven by Playwright (``scripts/setup.sh --test`` installs both).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from llmgym import SequenceEnv, Task
from llmgym.cli import main
from llmgym.train import Trainer
from llmgym.train.rollouts import read_rollouts

CHROMIUM = "/usr/bin/chromium"
HOSTILE = ('</script><script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
           '<!-- \u2028 {{x}} needle-7731')


def _task(rng):
    return Task(f"odd {int(rng.integers(1000))}:", answer="", id=f"odd-{int(rng.integers(1000))}")


def _odd_share(task, completion):
    data = completion.encode("utf-8", errors="replace")
    return sum(b % 2 for b in data) / max(1, len(data))


@pytest.fixture(scope="module")
def outputs(saved_tiny_model_dir, tmp_path_factory) -> dict[str, Path]:
    """A 3-step run (with evaluations and one hostile completion among its records) and a bench output."""
    from llmgym.agents import GRPO
    from llmgym.runtime.models import load_model

    model, tok = load_model(saved_tiny_model_dir)
    agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4, lr=0.01, kl_coef=0.0, seed=3)
    run = tmp_path_factory.mktemp("run")
    Trainer(agent, SequenceEnv(_task, _odd_share, tok), run, eval_env=SequenceEnv(_task, _odd_share, tok), eval_every=2,
            eval_tasks=2, checkpoint_every=None, rollouts_every=1, progress=False).run(3)
    with open(run / "rollouts.jsonl", "a", encoding="utf-8") as f:  # what a policy may write
        f.write(json.dumps({"step": 3, "split": "train", "group": 9, "task_id": "odd-x", "prompt": "odd 1:",
                            "completion": HOSTILE, "reward": 0.96, "info": {"error": HOSTILE}}) + "\n")
    bench = tmp_path_factory.mktemp("bench") / "bench.json"
    assert main(["bench", "--env", "llmgym/Copy-v0", "--model", saved_tiny_model_dir, "--tasks", "2", "--samples", "2",
                 "--max-new-tokens", "4", "--out", str(bench)]) == 0
    return {"run": run, "bench": bench}


def test_report_writes_one_self_contained_page_for_a_run_and_for_a_bench(outputs, tmp_path, capsys):
    assert main(["report", str(outputs["run"])]) == 0
    page = (outputs["run"] / "report.html").read_text()
    assert "report.html" in capsys.readouterr().out
    # nothing to fetch: no external reference, a policy that forbids any, the curves inline
    assert "default-src 'none'" in page and "data:image/png;base64," in page
    assert not any(s in page for s in ('src="http', "href=", "<link", "@import", "url("))
    assert page.count("</script>") == 2 and "window.pwned" in page  # the hostile text is there, but inert
    assert main(["report", str(outputs["bench"]), "--out", str(tmp_path / "b.html")]) == 0
    assert "Per task" in (tmp_path / "b.html").read_text()
    assert main(["report", str(tmp_path)]) == 2  # neither a run nor a bench summary
    assert "neither a run directory" in capsys.readouterr().err


def test_the_page_works_in_a_real_headless_chromium(outputs, tmp_path):
    import os

    missing = None
    try:
        from playwright import sync_api
    except ImportError:
        missing = "playwright is not installed (the test extra has it)"
    if missing is None and shutil.which(CHROMIUM) is None:
        missing = f"no {CHROMIUM}: apt-get install -y chromium (scripts/setup.sh --test does)"
    if missing is not None:  # under CI the set-up installs both: a skip there would hide a broken install
        (pytest.fail if os.environ.get("CI") else pytest.skip)(missing)
    from llmgym.train.report import write_report

    run_page = write_report(outputs["run"], tmp_path / "run.html")
    bench_page = write_report(outputs["bench"], tmp_path / "bench.html")
    records = read_rollouts(outputs["run"])
    bench_samples = [json.loads(line) for line in outputs["bench"].with_name("bench.samples.jsonl").read_text().splitlines()]
    problems: list[str] = []
    with sync_api.sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path / "profile"), executable_path=CHROMIUM, headless=True,
            args=["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--no-first-run"])
        try:
            page = context.new_page()
            page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type in ("error", "warning") else None)
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.on("dialog", lambda d: (problems.append(f"dialog: {d.message}"), d.dismiss()))
            page.on("request", lambda r: None if r.url.startswith(("file:", "data:")) else problems.append(f"request {r.url}"))

            page.goto(run_page.as_uri())
            assert page.evaluate("document.getElementById('curves').naturalWidth") > 1000  # the curves, drawn
            # the run's sampler-vs-learner mismatch (its on-policy updates measure it): on the page's summary
            assert "sampler–learner KL, k3 (last measured)" in page.text_content("#summary")
            cards = page.locator(".rec")
            assert cards.count() == len(records) and page.text_content("#shown") == f"{len(records)} of {len(records)} shown"
            assert page.evaluate("window.pwned") is None  # the hostile completion ran nothing ...
            hostile = page.locator(".rec", has_text="needle-7731")
            assert hostile.count() == 1 and HOSTILE.replace("\u2028", "") in hostile.locator("pre").nth(1).text_content().replace("\u2028", "")
            page.fill("#search", "needle-7731")  # ... and is found as the text it is
            assert page.text_content("#shown") == f"1 of {len(records)} shown"
            page.fill("#search", "")
            page.fill("#min-reward", "0.5")
            high = [r for r in records if r["reward"] >= 0.5]
            assert 0 < len(high) < len(records)
            assert page.text_content("#shown") == f"{len(high)} of {len(records)} shown"
            shown = sorted(float(t.split()[1]) for t in page.locator(".rec:visible .reward").all_text_contents())
            assert shown == pytest.approx(sorted(r["reward"] for r in high), abs=1e-3)  # 4 significant digits
            page.select_option("#split", "eval")
            evals = [r for r in high if r["split"] == "eval"]
            assert page.text_content("#shown") == f"{len(evals)} of {len(records)} shown"
            page.select_option("#split", "")
            page.fill("#min-reward", "")
            page.screenshot(path=str(tmp_path / "run.png"), full_page=True)

            page.goto(bench_page.as_uri())
            assert page.locator("#tasks tbody tr").count() == 2 and page.is_hidden("#curves-section")
            first = bench_samples[0]["task_id"]
            page.fill("#search", first)
            assert page.text_content("#shown") == f"2 of {len(bench_samples)} shown"  # that task's two samples
            page.fill("#search", "")
            page.check("#failed")
            failed = [s for s in bench_samples if not s["passed"]]
            assert page.text_content("#shown") == f"{len(failed)} of {len(bench_samples)} shown"
            page.screenshot(path=str(tmp_path / "bench.png"), full_page=True)
        finally:
            context.close()
    assert problems == []
    assert (tmp_path / "run.png").stat().st_size > 10_000
