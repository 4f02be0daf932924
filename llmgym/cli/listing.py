"""``llmgym list``: registered envs and agents as tables (large families folded into one row).

Example:
    >>> from llmgym.cli.listing import _common_id_pattern
    >>> _common_id_pattern(["llmgym/RG-ab-v0", "llmgym/RG-cd-v0"])
    'llmgym/RG-<name>-v0'
"""

from __future__ import annotations

import argparse
import importlib.util
from collections.abc import Sequence

from llmgym.cli.common import UsageError, _console

__all__ = ["add_parser", "cmd_list"]


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``list`` sub-command to ``subparsers``."""
    p = subparsers.add_parser("list", help="registered envs and agents")
    p.add_argument("--family", help="only the envs of one family (e.g. toy, math, games)")
    p.add_argument("--all", action="store_true", help="one row per env, also in large families")
    p.set_defaults(handler=cmd_list)
    return p


def _common_id_pattern(ids: Sequence[str]) -> str:
    """``llmgym/RG-ab-v0``, ``llmgym/RG-acre-v0`` → ``llmgym/RG-<name>-v0``."""
    import os.path

    prefix = os.path.commonprefix(list(ids))
    suffix = os.path.commonprefix([i[::-1] for i in ids])[::-1]
    return f"{prefix}<name>{suffix}"


def cmd_list(args: argparse.Namespace) -> int:
    """``llmgym list``: registered envs and agents as tables (large families folded into one row)."""
    from itertools import groupby

    from rich.table import Table

    from llmgym.agents import AGENTS
    from llmgym.registry import registered_envs

    console = _console()
    infos = registered_envs(args.family)
    if args.family and not infos:
        families = sorted({i.family for i in registered_envs()})
        raise UsageError(f"no env family {args.family!r}; families: {', '.join(families)}")
    envs = Table(title="environments", title_justify="left", caption_justify="left",
                 caption="levels: sequence, token for every env — gymnasium.make(id, tokenizer=tok, level=...)")
    envs.add_column("id", no_wrap=True)
    envs.add_column("family", no_wrap=True)
    envs.add_column("multi-turn", no_wrap=True)
    envs.add_column("needs", no_wrap=True)
    envs.add_column("description", min_width=16, ratio=1)

    def needs(info) -> str:
        return ", ".join(m if importlib.util.find_spec(m.split(".")[0]) else f"[red]{m} (missing)[/]"
                         for m in info.requires) or ""

    fold = not (args.family or args.all)
    by_family = groupby(sorted(infos, key=lambda i: (i.family != "toy", i.family, i.id)), key=lambda i: i.family)
    for family, members in by_family:
        members = list(members)
        if fold and len(members) > 8:
            names = [m.id for m in members]
            first = members[0]
            envs.add_row(_common_id_pattern(names), family, "yes" if first.multi_turn else "",
                         needs(first), f"{len(members)} envs; `llmgym list --family {family}` lists them")
            continue
        for info in members:
            envs.add_row(info.id, info.family, "yes" if info.multi_turn else "", needs(info),
                         info.description)
    console.print(envs)
    agents = Table(title="agents: llmgym train --agent NAME [--set field=value]", title_justify="left")
    agents.add_column("name", no_wrap=True)
    agents.add_column("group", justify="right")
    agents.add_column("lr", justify="right")
    agents.add_column("KL coef", justify="right")
    agents.add_column("description", ratio=1)
    for name, cls in AGENTS.items():
        config = cls.config_class()
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        agents.add_row(name, str(config.group_size), f"{config.lr:g}", f"{config.kl_coef:g}", doc.replace("``", ""))
    console.print(agents)
    return 0

