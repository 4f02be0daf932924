"""Every public docstring's ``Example:`` runs, under the module's installed name.

The doctests are collected here rather than with ``--doctest-modules``: pytest would import
``agents/grpo.py`` as a top-level ``agents.grpo`` (its folder name), a second copy of the module
beside ``llmgym.agents.grpo``; walking the installed package imports each module once, as users do.
"""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import pkgutil

import pytest

import llmgym
import llmgym.agents
import llmgym.envs

# vllm.py imports vLLM at module level by design (a clear ImportError without it: its examples run where
# vLLM is installed, as in the test environment); __main__ runs the CLI
SKIP = {"llmgym.__main__"} | ({"llmgym.engines.vllm"} if importlib.util.find_spec("vllm") is None else set())
# the interop adapters' examples run the adapted package itself (an optional extra; verifiers needs Python >= 3.11)
NEEDS = {"llmgym.fleet.vllm_plugin": "vllm", "llmgym.fleet.serve": "vllm",
         "llmgym.interop.verifiers_in": "verifiers", "llmgym.interop.verifiers_out": "verifiers",
         "llmgym.interop.verifiers_taskset": "verifiers", "llmgym.interop.textarena_in": "textarena",
         "llmgym.interop.adapters": "textarena", "llmgym.interop.trl_out": "datasets",
         "llmgym.interop.adapter_pools": "textarena"}
# llmgym.agents and llmgym.envs live in other folders (package-dir), so each package is walked itself
PACKAGES = (llmgym, llmgym.agents, llmgym.envs)
MODULES = sorted(
    {p.__name__ for p in PACKAGES}
    | {name for p in PACKAGES for _, name, _ in pkgutil.walk_packages(p.__path__, prefix=p.__name__ + ".")}
    - SKIP
)


def test_the_walk_sees_agents_and_envs():
    assert {"llmgym.agents.grpo", "llmgym.envs.math.math_verifier", "llmgym.envs.code.code_verifier"} <= set(MODULES)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    if name in NEEDS:
        pytest.importorskip(NEEDS[name], reason=f"{name}'s examples need {NEEDS[name]}")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False, report=True)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} doctest(s) failed"
