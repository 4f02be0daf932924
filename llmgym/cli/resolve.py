"""From the names on a command line to the objects of a run: env id, agent name, model, agent config, engine.

Each check turns a user's mistake (an unknown env or agent, a missing model, a bad ``--set`` field) into
one :class:`~llmgym.cli.usage.UsageError` line instead of a traceback.

Example:
    >>> from llmgym.cli.resolve import require_agent
    >>> require_agent("grpo").name
    'grpo'
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
from pathlib import Path
from typing import Any

from llmgym.cli.usage import LIST_HINT, UsageError, first_line
from llmgym.runtime.display import quiet_hf_progress
from llmgym.runtime.install import install_hint
from llmgym.runtime.threads import set_torch_threads

__all__ = ["require_env", "ENV_ARG_RESERVED", "make_run_env", "require_agent", "MODEL_HINT", "resolve_model", "load_run_model", "check_model", "build_agent_config", "check_env_makes", "build_engine"]

def require_env(env_id: str):
    """The :class:`~llmgym.env.registry.EnvInfo` of ``env_id``; a :class:`UsageError` if unknown or unusable.

    An adapter spec (``verifiers:<module>``, ``textarena:<game id>``) is checked instead (package
    installed, module or game known) and gives the ``gymnasium`` ``EnvSpec`` that makes it
    (:func:`llmgym.interop.adapters.adapted_env_spec`).
    """
    from llmgym.interop.adapters import adapted_env_spec, parse_env_spec
    from llmgym.env.registry import env_info

    if parse_env_spec(env_id) is not None:
        try:
            return adapted_env_spec(env_id)
        except (ValueError, ModuleNotFoundError) as exc:
            raise UsageError(str(exc)) from None
    try:
        info = env_info(env_id)
    except KeyError as exc:
        message = str(exc.args[0])
        raise UsageError(message if "llmgym list" in message else f"{message} ({LIST_HINT})") from None
    missing = [m for m in info.requires if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        extra = {"math": "math", "code": "code"}.get(info.family)
        how = install_hint(extra) if extra else f"pip install {' '.join(missing)}"
        raise UsageError(f"{env_id} needs the Python package(s) {', '.join(missing)}, not installed here: {how}")
    return info


ENV_ARG_RESERVED = ("tokenizer", "level", "max_new_tokens")
"""``gymnasium.make`` keywords the CLI sets itself (``--level``, ``--max-new-tokens`` / the agent config)."""


def _env_error_message(env_id: str, exc: BaseException) -> str:
    """One line from an env constructor's error: without gymnasium's "was raised ... with kwargs (...)" tail
    (which holds the tokenizer's repr, hundreds of lines), and with the CLI spelling of ``path=``."""
    message = str(exc).split(" was raised from the environment creator for ")[0]
    message = " ".join(message.split()) or type(exc).__name__
    if len(message) > 600:
        message = message[:600] + " …"
    if "path=" in message:
        message += " On the command line: --env-arg path=FILE."
    return message if message.startswith(env_id) else f"{env_id}: {message}"


def make_run_env(env_id: str, tokenizer, level: str = "sequence", max_new_tokens: int = 64,
              env_args: dict[str, Any] | None = None):
    """``gymnasium.make(env_id, ...)`` with ``env_args`` (``--env-arg``); a bad env or argument is a :class:`UsageError`."""
    import gymnasium

    from llmgym.env.registry import EnvInfo

    checked = require_env(env_id)  # an adapter spec: the EnvSpec that makes it; an llmgym id: made by its id
    env_args = dict(env_args or {})
    reserved = [key for key in ENV_ARG_RESERVED if key in env_args]
    if reserved:
        raise UsageError(f"--env-arg {reserved[0]}=... is set by llmgym itself (use --level / --max-new-tokens "
                         f"or the agent's max_new_tokens)")
    try:
        return gymnasium.make(env_id if isinstance(checked, EnvInfo) else checked, tokenizer=tokenizer, level=level,
                              max_new_tokens=max_new_tokens, **env_args)
    except ModuleNotFoundError as exc:
        raise UsageError(f"{env_id}: {exc}") from None
    except (TypeError, ValueError, FileNotFoundError, gymnasium.error.Error) as exc:
        raise UsageError(_env_error_message(env_id, exc)) from None


def require_agent(name: str):
    """The agent class registered as ``name``; a :class:`UsageError` if unknown."""
    from llmgym.agents import AGENTS

    key = name.strip().lower()
    if key in AGENTS:
        return AGENTS[key]
    close = difflib.get_close_matches(key, list(AGENTS), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"unknown agent {name!r}.{hint} Known agents: {', '.join(AGENTS)}")


MODEL_HINT = "give a directory saved with save_pretrained() (e.g. RUN/checkpoints/last), a hub id in your HF cache, or 'tiny'"


def resolve_model(spec: str) -> str:
    """Check that ``spec`` names a loadable model *before* any work; return what to load.

    A run directory (one holding ``checkpoints/last``) is named as such, with the checkpoint to use;
    a directory without ``config.json`` is named too (transformers would fail deep in a tokenizer);
    a hub id missing from the local Hugging Face cache fails in about a second when the hub cannot
    be reached (``HF_HUB_OFFLINE=1``: at once), not after a minute of retries.

    Example:
        >>> from llmgym.cli.resolve import resolve_model
        >>> resolve_model("tiny")
        'tiny'
        >>> resolve_model("/no/such/dir")
        Traceback (most recent call last):
        ...
        llmgym.cli.usage.UsageError: no model at '/no/such/dir': ...
    """
    import os

    if spec == "tiny":
        return spec
    path = Path(spec).expanduser()
    if path.is_dir():
        last = path / "checkpoints" / "last"
        if (last / "config.json").is_file():
            raise UsageError(f"{spec!r} is a training run directory, not a model: use --model {last}")
        if (path / "config.json").is_file():
            try:
                config = json.loads((path / "config.json").read_text())
            except (OSError, ValueError):
                config = {}
            if isinstance(config, dict) and "agent" in config and "env" in config:  # a run's config.json
                raise UsageError(f"{spec!r} is a training run directory without a checkpoint: train it with "
                                 f"checkpoints, or give its base model {config.get('model')!r}")
            return str(path)
        raise UsageError(f"{spec!r} holds no model (no config.json in it): {MODEL_HINT}")
    if path.exists():
        raise UsageError(f"--model {spec!r} is a file, not a model directory: {MODEL_HINT}")
    from llmgym.runtime.models import looks_like_hub_id

    if not looks_like_hub_id(spec) or spec.startswith(("/", ".", "~")):
        raise UsageError(f"no model at {spec!r}: {MODEL_HINT}")
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(spec, "config.json"), str):
        return spec  # cached: loads without network
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):
        raise UsageError(f"model {spec!r} is not in your Hugging Face cache and HF_HUB_OFFLINE is set: "
                         f"download it first (hf download {spec}) or {MODEL_HINT}")
    from huggingface_hub import model_info

    try:  # one short request instead of transformers' minute of retries when the hub is unreachable
        model_info(spec, timeout=5)
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UsageError(f"model {spec!r} is not in your Hugging Face cache and the hub did not answer ({first}): "
                         f"download it where you have network (hf download {spec}) or {MODEL_HINT}") from None
    return spec


def load_run_model(spec: str, device: str | None = None, threads: int | None = None):
    """``(model, tokenizer, threads)`` from ``'tiny'``, a saved directory or a hub id, on ``device`` (``None``:
    CPU), with torch's CPU threads set for it (:func:`llmgym.runtime.threads.set_torch_threads`; ``threads``:
    ``--threads``) and their count; a :class:`UsageError` if absent."""
    from llmgym.runtime.models import load_model

    target = resolve_model(spec)
    quiet_hf_progress()
    try:
        model, tokenizer = load_model(target, device=device if device not in (None, "cpu") else None)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, ValueError) as exc:  # a directory with a broken or missing tokenizer / weights
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"could not load model {spec!r} ({first}); {MODEL_HINT}") from None
    return model, tokenizer, set_torch_threads(model, requested=threads)


def check_model(spec: str) -> None:
    """Fail early (a :class:`UsageError`) if ``spec`` names no loadable model; loads nothing."""
    resolve_model(spec)


def _coerce_field(agent_name: str, field: dataclasses.Field, value: Any) -> Any:
    """Check ``value`` against a config field's annotation (ints become floats where a float is wanted)."""
    annotation = str(field.type)
    wrong = UsageError(f"--set {field.name}: {agent_name} expects {annotation}, got {value!r}")
    if value is None:
        if "None" in annotation:
            return None
        raise wrong
    if annotation.startswith("bool"):
        if isinstance(value, bool):
            return value
        raise wrong
    if "float" in annotation:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise wrong
    if "int" in annotation:
        if isinstance(value, bool):
            raise wrong
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise wrong
    if "str" in annotation:
        if isinstance(value, str):
            return value
        raise wrong
    return value


def build_agent_config(agent_cls, fields: dict[str, Any]):
    """The agent's config dataclass with ``fields`` applied, checked field by field.

    Example:
        >>> from llmgym.agents import GRPO
        >>> from llmgym.cli import build_agent_config
        >>> build_agent_config(GRPO, {"lr": 1, "group_size": 4}).lr
        1.0
        >>> build_agent_config(GRPO, {"group_sise": 4})
        Traceback (most recent call last):
        ...
        llmgym.cli.usage.UsageError: unknown field 'group_sise' for agent grpo (did you mean group_size?); valid fields: ...
    """
    default = agent_cls.config_class()
    known = {f.name: f for f in dataclasses.fields(default)}
    checked = {}
    for key, value in fields.items():
        if key not in known:
            close = difflib.get_close_matches(key, list(known), n=2)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UsageError(f"unknown field {key!r} for agent {agent_cls.name}{hint}; "
                             f"valid fields: {', '.join(known)}")
        checked[key] = _coerce_field(agent_cls.name, known[key], value)
    try:
        config = dataclasses.replace(default, **checked)
    except (ValueError, TypeError) as exc:
        raise UsageError(f"bad setting for agent {agent_cls.name}: {exc}") from None
    _check_agent_config(agent_cls.name, config)
    return config


def _check_agent_config(agent_name: str, config) -> None:
    """Settings the agent would only reject mid-run (or deep inside torch/gymnasium): a :class:`UsageError` now."""
    seed = getattr(config, "seed", 0)
    if isinstance(seed, int) and seed < 0:
        raise UsageError(f"seed must be >= 0, got {seed} (--seed / --set seed=)")
    if all(hasattr(config, f) for f in ("temperature", "top_p", "max_new_tokens")):
        from llmgym.engines import SamplingParams

        try:
            SamplingParams(temperature=config.temperature, top_p=config.top_p, max_new_tokens=config.max_new_tokens)
        except (ValueError, TypeError) as exc:
            raise UsageError(f"bad setting for agent {agent_name}: {exc}") from None
    if hasattr(config, "lr"):
        import torch

        try:  # the optimiser's own checks (lr >= 0, weight_decay >= 0), on a throw-away parameter
            torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=config.lr,
                              weight_decay=getattr(config, "weight_decay", 0.0))
        except (ValueError, TypeError) as exc:
            raise UsageError(f"bad setting for agent {agent_name}: {exc}") from None


def check_env_makes(env_id: str, model: str, env_args: dict[str, Any] | None = None, level: str = "sequence",
                    max_new_tokens: int = 64) -> None:
    """Make ``env_id`` once with ``model``'s tokenizer (its weights are not loaded) and ``env_args``:
    a missing ``--env-arg path=`` or an unknown keyword is a :class:`UsageError` before a command
    prints anything."""
    from llmgym.runtime.models import load_tokenizer, tiny_model_path

    target = resolve_model(model)
    quiet_hf_progress()
    try:
        tokenizer = load_tokenizer(tiny_model_path() if target == "tiny" else target)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"could not load the tokenizer of {model!r} ({first}); {MODEL_HINT}") from None
    make_run_env(env_id, tokenizer, level, max_new_tokens, env_args).close()


def build_engine(kind: str, engine_args: dict[str, Any], model, tokenizer, *, lora_r: int = 0,
                 max_staleness: int | None = None):
    """The agent's rollout engine for ``--engine``: ``None`` for hf (the agent builds its own ``HFEngine``
    over the model it trains), a :class:`~llmgym.engines.vllm.VLLMEngine` over ``model`` for vllm (with
    ``lora_r > 0``: LoRA enabled at that rank, ``max_staleness + 1`` adapter versions kept). A
    setting vLLM rejects is a :class:`UsageError`; the caller closes the engine."""
    if kind == "hf":
        return None
    if kind == "vllm-server":
        from llmgym.fleet.fleet_engine import FleetEngine, FleetError

        options = dict(engine_args)
        if lora_r:
            options.setdefault("lora_versions", int(max_staleness or 0) + 1)
        try:
            return FleetEngine(options.pop("servers"), tokenizer, model, **options)
        except (FleetError, ValueError, TypeError) as exc:
            raise UsageError(f"--engine vllm-server: {str(exc).splitlines()[0]}") from None
    if kind != "vllm":
        raise UsageError(f"--engine {kind} cannot train (it samples from a server's weights): use hf or vllm")
    from llmgym.engines.vllm import VLLMEngine

    options = dict(engine_args)
    if lora_r:
        options.setdefault("lora_rank", int(lora_r))
        options.setdefault("lora_versions", int(max_staleness or 0) + 1)
    try:
        return VLLMEngine(model, tokenizer, **options)
    except (ValueError, TypeError) as exc:  # a setting vLLM refused as it started (its config's cross-checks)
        raise UsageError(f"--engine vllm: {first_line(exc)}") from None
