"""Concrete task families for llmgym: toy tasks a tiny model learns on a CPU, math, code, games.

Each family's factories are registered by ``llmgym`` under ``llmgym/<Name>-v0`` (by string entry
point, so nothing here is imported until an env is made).
"""

__all__: list[str] = []
