"""How many HumanEval problems are fully determined by their own docstring examples? (a red-team count)

Method: for each of the 164 problems, read the examples in the prompt's docstring -- doctest
``>>> f(args)`` lines with the expected value on the next line, and (``--wide``, the default) also
lines ``f(args) ==> y``, ``f(args) -> y``, ``f(args) == y``, ``f(args) = y``, ``f(args) should return
y`` -- with ``ast.literal_eval`` only. The candidate is a lookup table of those pairs
(``TABLE.get(repr(args))``, ``None`` for anything else); ``CodeVerifier`` runs it against the
problem's full tests in the sandbox. A pass means the tests check nothing the docstring does not show.

``--retry N`` also plays the table policy in ``llmgym/CodeRetry-v0`` on the first N problems, adding
every ``assert candidate(x) == y`` line the transcript shows (what quoted feedback used to hand over).

    python benchmarks/humaneval_docstring_lookup.py [--retry 40]

Measured 2026-11-26: doctest examples parse for 69 problems, either form for 132; the table passes
1 of 164 (HumanEval/34). CodeRetry, first 40: 8 wins while feedback quoted hidden asserts, 1 after.
"""

from __future__ import annotations

import argparse
import ast
import re

_ARROW = re.compile(r"^\s*(?:>>>\s*)?(.*?\))\s*(?:==>|=>|->|==|=|should return|returns?|\u279e)\s*(.+?)\s*$")
_QUOTED_ASSERT = re.compile(r"\s*assert\s+candidate\((.*)\)\s*==\s*(.+)$")


def _literal(text: str):
    try:
        return True, ast.literal_eval(text.strip().rstrip(".,;"))
    except Exception:  # noqa: BLE001  (anything that is not a literal)
        return False, None


def _call_args(text: str, entry: str):
    try:
        node = ast.parse(text.strip(), mode="eval").body
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == entry:
            return tuple(ast.literal_eval(a) for a in node.args)
    except Exception:  # noqa: BLE001
        pass
    return None


def docstring_examples(text: str, entry: str, wide: bool = True) -> dict[str, object]:
    """``{repr(args): value}`` of the examples written in ``text``."""
    rows: dict[str, object] = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        stripped = line.strip()
        if stripped.startswith(">>>") and i + 1 < len(lines) and not lines[i + 1].strip().startswith(">>>"):
            args, (ok, value) = _call_args(stripped[3:], entry), _literal(lines[i + 1])
            if args is not None and ok:
                rows[repr(args)] = value
                continue
        if wide and entry in stripped:
            found = _ARROW.match(stripped)
            if found:
                args, (ok, value) = _call_args(found.group(1).lstrip(">").strip(), entry), _literal(found.group(2))
                if args is not None and ok:
                    rows[repr(args)] = value
    return rows


def table_program(rows: dict[str, object], entry: str) -> str:
    return f"```python\nTABLE = {rows!r}\ndef {entry}(*args):\n    return TABLE.get(repr(args))\n```"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--narrow", action="store_true", help="doctest >>> examples only")
    parser.add_argument("--retry", type=int, default=0, help="also play CodeRetry on the first N problems")
    args = parser.parse_args()

    from llmgym.envs.code import CodeVerifier, load_humaneval

    tasks = load_humaneval()
    tables = [docstring_examples(t.metadata["prompt_code"], t.metadata["entry_point"], not args.narrow) for t in tasks]
    scores = CodeVerifier(max_workers=2).verify_batch(
        tasks, [table_program(rows, t.metadata["entry_point"]) for rows, t in zip(tables, tasks)])
    won = [t.id for t, s in zip(tasks, scores) if s.reward == 1.0]
    print(f"problems with parsed examples: {sum(bool(r) for r in tables)}/{len(tasks)}; "
          f"determined by them (the table passes every test): {len(won)}/{len(tasks)} {won}")
    if args.retry:
        import gymnasium

        import llmgym  # noqa: F401

        env = gymnasium.make("llmgym/CodeRetry-v0", dataset="humaneval")
        wins = []
        for task in tasks[: args.retry]:
            obs, _ = env.reset(options={"task": task})
            entry, total, done = task.metadata["entry_point"], 0.0, False
            while not done:
                rows = docstring_examples(obs["prompt"], entry)
                for line in obs["prompt"].splitlines():
                    quoted = _QUOTED_ASSERT.match(line)
                    if quoted:
                        (ok, value), call = _literal(quoted.group(2)), _call_args(f"{entry}({quoted.group(1)})", entry)
                        if ok and call is not None:
                            rows[repr(call)] = value
                obs, reward, terminated, truncated, _ = env.step(table_program(rows, entry))
                total, done = total + reward, terminated or truncated
            if total >= 1.0:
                wins.append(task.id)
        print(f"CodeRetry, first {args.retry}: the table policy wins {len(wins)} {wins}")


if __name__ == "__main__":
    main()
