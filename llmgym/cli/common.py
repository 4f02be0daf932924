"""The options several ``llmgym`` commands share: ``--set`` / ``--env-arg`` pairs and config files,
``--device`` / ``--dtype`` and the learner's scale options, ``--import`` of the user's modules.

What else the commands share has a module of its own: :mod:`llmgym.cli.usage` (the usage error, exit
codes), :mod:`llmgym.cli.console` (what they print), :mod:`llmgym.cli.resolve` (env, agent and model from
their names), :mod:`llmgym.cli.run_files` (a run's directory), :mod:`llmgym.cli.engine_options`
(``--engine``).

Example:
    >>> from llmgym.cli.common import parse_overrides
    >>> parse_overrides(["lr=1e-3"])
    {'lr': 0.001}
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from llmgym.cli.usage import UsageError
from llmgym.runtime.install import install_hint

__all__ = ["parse_overrides", "PAIR_OPTIONS", "check_spaced_pairs", "read_config_file", "DTYPES", "ENGINE_DECODES", "check_device", "scale_options", "apply_scale_options", "plugin_options", "import_user_modules"]

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
        llmgym.cli.usage.UsageError: --set takes field=value as one word, without spaces around '=': write --set lr=1e-4 (got: --set lr = 1e-4)
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


def read_config_file(path: str) -> dict[str, Any]:
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
        llmgym.cli.usage.UsageError: --device 'tpu': give auto, cpu, cuda or cuda:N
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
        raise UsageError(f"--lora-r needs the peft package, not installed here: {install_hint('peft')}")
    return fields


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
        llmgym.cli.usage.UsageError: --import no_such_module_xyz: no module named 'no_such_module_xyz' ...
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
