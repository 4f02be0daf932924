"""One error base: every exception (and warning) class llmgym defines derives from llmgym.errors' base,
and keeps the built-in type it always had."""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import pytest

from llmgym.errors import LLMGymError, LLMGymWarning

from test_doctests import MODULES, NEEDS


def _defined_exceptions(module) -> list[type]:
    return [obj for _, obj in inspect.getmembers(module, inspect.isclass)
            if obj.__module__ == module.__name__ and issubclass(obj, BaseException)]


@pytest.mark.parametrize("name", MODULES)
def test_every_llmgym_exception_derives_from_the_one_base(name):
    if name in NEEDS and importlib.util.find_spec(NEEDS[name]) is None:
        pytest.skip(f"{name} needs {NEEDS[name]}")
    module = importlib.import_module(name)
    for cls in _defined_exceptions(module):
        if cls.__name__.startswith("_"):
            continue  # private control flow (a pause, a stop) that never reaches a user
        base = LLMGymWarning if issubclass(cls, Warning) else LLMGymError
        assert issubclass(cls, base), f"{name}.{cls.__name__} does not derive from llmgym.errors.{base.__name__}"


def test_the_base_keeps_the_builtin_types():
    from llmgym.cli.usage import UsageError
    from llmgym.fleet.fleet_engine import FleetError
    from llmgym.sandbox.policy import SandboxUnavailableError

    assert issubclass(FleetError, ConnectionError) and issubclass(SandboxUnavailableError, RuntimeError)
    with pytest.raises(LLMGymError, match="no such env"):
        raise UsageError("no such env")
    # an OSError subclass (a fleet's ConnectionError) still carries a plain message through the base
    assert str(FleetError("server gone")) == "server gone"


def test_the_walk_finds_the_errors_it_checks():
    names = {f"{cls.__module__}.{cls.__name__}" for name in MODULES if name not in NEEDS
             for cls in _defined_exceptions(importlib.import_module(name))}
    assert {"llmgym.env.verifiers.VerifierUnavailableError", "llmgym.sandbox.policy.SandboxError",
            "llmgym.train.checkpoint.CheckpointError", "llmgym.cli.usage.UsageError"} <= names
