"""The sandbox side of "secrets never reach what the model drives": a sandboxed run and a persistent worker
(what the interop adapters and the math scorers run in) started while the trainer holds ``OPENAI_API_KEY``,
``LLMGYM_SERVE_SECRET`` and a user's token see none of them, in any environment they can read. A guard: the
sandbox builds its environment from nothing (``llmgym/sandbox/runner.py``, ``worker.py``)."""

from __future__ import annotations

import textwrap

import pytest

from llmgym.sandbox import SandboxLimits, check_sandbox, run_python
from llmgym.sandbox.worker import SandboxWorker

INFO = check_sandbox()
pytestmark = pytest.mark.skipif(
    bool(set(INFO["missing"]) - {"cgroup"}),
    reason=f"sandbox mechanisms missing: {INFO['missing']} -- run `sudo bash .ci/install-sandbox.sh`",
)

SECRETS = {"LLMGYM_SERVE_SECRET": "fleet-s3cret-0451", "OPENAI_API_KEY": "sk-test-8d1f2a", "MY_TOKEN": "tok-77c1e9"}

LOOK = textwrap.dedent("""
    import glob, os
    seen = [repr(dict(os.environ))]
    for path in glob.glob("/proc/*/environ"):
        try:
            seen.append(open(path, "rb").read().decode("utf-8", "replace"))
        except OSError:
            pass
    result = "\\n".join(seen)
""")


def _leaked(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if name in text or value in text]


@pytest.fixture
def secrets_set(monkeypatch):
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)


def test_a_sandboxed_run_sees_no_secret_of_the_trainer(secrets_set):
    r = run_python(LOOK + "print(result)", limits=SandboxLimits(wall_seconds=20))
    assert r.passed, r.stderr
    assert "PATH" in r.stdout and _leaked(r.stdout) == []


def test_a_sandboxed_worker_sees_no_secret_of_the_trainer(secrets_set):
    source = "def handle(state, request):\n    scope = {}\n    exec(request, scope)\n    return scope['result']\n"
    with SandboxWorker(source) as worker:
        status, seen = worker.call(None, LOOK, time_limit=20)
    assert status == "ok", seen
    assert "PATH" in seen and _leaked(seen) == []
