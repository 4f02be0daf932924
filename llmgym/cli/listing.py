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

from llmgym.cli.common import plugin_options
from llmgym.cli.usage import UsageError
from llmgym.runtime.display import is_live, make_console
from llmgym.runtime.install import install_hint

__all__ = ["WIDE", "add_parser", "cmd_list", "adapter_rows"]

WIDE = 120
"""Terminal columns from which ``list`` draws tables; a narrower terminal, a pipe or a file gets one
paragraph per row."""


def _tables(console) -> bool:
    """Tables only in a terminal at least :data:`WIDE` columns wide: a pipe or a file (whatever
    ``$COLUMNS`` says) gets paragraphs, one env per grep and no description cut."""
    return is_live(console) and console.width >= WIDE


def add_parser(subparsers, common: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``list`` sub-command to ``subparsers``."""
    p = subparsers.add_parser("list", parents=[plugin_options()],
                              help="registered envs, env adapters (verifiers, TextArena) and agents")
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
    from llmgym.env.registry import registered_envs

    console = make_console()
    infos = registered_envs(args.family)
    if args.family and not infos:
        families = sorted({i.family for i in registered_envs()})
        raise UsageError(f"no env family {args.family!r}; families: {', '.join(families)}")
    rows = []  # (id, family, multi-turn, needs, description)

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
            rows.append((_common_id_pattern(names), family, "yes" if first.multi_turn else "", needs(first),
                         f"{len(members)} envs; `llmgym list --family {family}` lists them"))
            continue
        for info in members:
            rows.append((info.id, info.family, "yes" if info.multi_turn else "", needs(info), info.description))
    tables = _tables(console)
    caption = "levels: sequence, token for every env — gymnasium.make(id, tokenizer=tok, level=...)"
    if tables:
        envs = Table(title="environments", title_justify="left", caption_justify="left", caption=caption)
        for name in ("id", "family", "multi-turn", "needs"):
            envs.add_column(name, no_wrap=True)
        envs.add_column("description", min_width=16, ratio=1)
        for row in rows:
            envs.add_row(*row)
        console.print(envs)
    else:  # a narrow terminal, a pipe or a file: one env per paragraph, descriptions never cropped
        console.print("[bold]environments[/]")
        for env_id, family, multi_turn, needed, description in rows:
            tags = ", ".join(t for t in (family, "multi-turn" if multi_turn else "", f"needs {needed}" if needed else "")
                             if t)
            console.print(f"[bold]{env_id}[/] ({tags})", soft_wrap=True)
            console.print(f"    {description}", soft_wrap=True, highlight=False)
        console.print(caption, soft_wrap=True)
    _print_adapters(console)
    agent_rows = []
    for name, cls in AGENTS.items():
        config = cls.config_class()
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        agent_rows.append((name, str(config.group_size), f"{config.lr:g}", f"{config.kl_coef:g}", doc.replace("``", "")))
    title = "agents: llmgym train --agent NAME [--set field=value]"
    if tables:
        agents = Table(title=title, title_justify="left")
        agents.add_column("name", no_wrap=True)
        agents.add_column("group", justify="right")
        agents.add_column("lr", justify="right")
        agents.add_column("KL coef", justify="right")
        agents.add_column("description", ratio=1)
        for row in agent_rows:
            agents.add_row(*row)
        console.print(agents)
    else:
        console.print(f"\n[bold]{title}[/]", soft_wrap=True)
        for name, group, lr, kl, doc in agent_rows:
            console.print(f"[bold]{name}[/] (group {group}, lr {lr}, KL coef {kl})", soft_wrap=True)
            console.print(f"    {doc}", soft_wrap=True, highlight=False)
    return 0



def adapter_rows() -> list[tuple[str, str, str]]:
    """``(spec, status, description)`` of each env adapter: its installed package version or how to install it.

    Example:
        >>> from llmgym.cli.listing import adapter_rows
        >>> [spec for spec, _, _ in adapter_rows()]
        ['verifiers:<module>', 'textarena:<game id>']
    """
    from llmgym.interop.adapters import ADAPTERS, adapter_versions

    versions = adapter_versions()
    return [(f"{a.name}:{a.target}",
             f"{a.distribution} {versions[a.name]}" if versions[a.name] else f"missing: {install_hint(a.name)}",
             a.description) for a in ADAPTERS.values()]


def _print_adapters(console) -> None:
    from rich.table import Table

    rows = adapter_rows()
    title = "env adapters: --env <adapter>:<target> (docs/interop.md)"
    if _tables(console):
        table = Table(title=title, title_justify="left")
        table.add_column("--env", no_wrap=True)
        table.add_column("installed", no_wrap=True)
        table.add_column("description", ratio=1)
        for spec, status, description in rows:
            table.add_row(spec, status if not status.startswith("missing") else f"[red]{status}[/]", description)
        console.print(table)
    else:
        console.print(f"\n[bold]{title}[/]", soft_wrap=True)
        for spec, status, description in rows:
            console.print(f"[bold]{spec}[/] ({status})", soft_wrap=True, highlight=False)
            console.print(f"    {description}", soft_wrap=True, highlight=False)
