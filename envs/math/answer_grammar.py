"""Host-side grammars for the reasoning-gym answers that a dataset's scorer would ``eval`` or ``parse_expr``.

Nine reasoning-gym 0.1.25 scorers hand the model's answer to Python's ``eval`` (binary_matrix,
spiral_matrix, string_insertion, n_queens) or to ``sympy.parse_expr``, itself an ``eval`` of the
transformed text (polynomial_multiplication, simple_integration, intermediate_integration, countdown,
puzzle24). An answer that reached them as text would run as Python. Scoring runs in the sandbox
(:mod:`llmgym.envs.math.scorer_pools`), but a payload that ran code *there* could still write its own
score; so these answers are checked here first, on the host, and only an answer that cannot run
code reaches the scorer:

* the ``eval`` datasets: the dataset's own right answer (compared as the scorer compares it, before
  its ``eval``), or a plain Python literal -- strings, numbers, lists and tuples of them (what the
  scorers expect: a list of characters, a matrix as lists);
* the SymPy datasets: an arithmetic expression in Python syntax over numbers and plain names, with
  calls only to a fixed list of SymPy's mathematical functions (integration answers), none at all
  for the others; no attribute, subscript, string, lambda, comprehension or keyword; exponents that
  are numbers must be small (``9**9**9**9`` never reaches SymPy).

Every check is ASCII-only (no Unicode look-alikes: Python folds identifiers with NFKC), bounded in
length before anything parses it, and uses :func:`ast.parse`, which only parses -- linear on this
bounded input; nesting is capped by Python's parser itself. An answer outside its grammar never
reaches the scorer: it gets what the dataset gives an empty answer (its floor, 0.0 or 0.01 --
what reasoning-gym gives an answer it cannot parse) with ``info["error"]`` saying why. Only
expressions that are not literals but would have evaluated to a right list (``list("AB")``) lose
reasoning-gym's 0.1 partial credit.

Example:
    >>> from llmgym.envs.math.answer_grammar import check_answer
    >>> check_answer("countdown", "(25 - 5) * 4", {}) is None
    True
    >>> check_answer("countdown", "__import__('os').system('id')", {})
    'not allowed in a countdown answer: a call'
    >>> check_answer("spiral_matrix", "[1, 2, 3, 4]", {"answer": "1 2 4 3"}) is None
    True
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

__all__ = ["GUARDED_DATASETS", "MAX_EXPONENT", "MAX_EXPRESSION_CHARS", "MAX_LITERAL_CHARS", "check_answer"]

#: Longest answer (characters) the literal datasets' grammar reads (a 100×100 matrix fits).
MAX_LITERAL_CHARS = 100_000
#: Longest answer (characters) the expression datasets' grammar reads.
MAX_EXPRESSION_CHARS = 4_000
#: Largest absolute value of a numeric exponent.
MAX_EXPONENT = 1_000

# SymPy's mathematical functions an integration answer may call (reasoning-gym's own answers use
# sin, cos, exp, log, sqrt, asin, atan and Integral); anything else is not a function here.
_INTEGRATION_CALLS = frozenset(
    "sin cos tan cot sec csc asin acos atan acot asec acsc sinh cosh tanh coth sech csch asinh acosh "
    "atanh exp log ln sqrt Abs sign Integral".split()
)
_ARITHMETIC_OPS = (ast.Add, ast.Sub, ast.Mult, ast.Div)
_EXPRESSION_OPS = _ARITHMETIC_OPS + (ast.Pow,)


def _parse(answer: str, max_chars: int, what: str) -> tuple[ast.Expression | None, str | None]:
    if len(answer) > max_chars:
        return None, f"a {what} answer longer than {max_chars} characters is not scored"
    if not answer.isascii():
        return None, f"a {what} answer must be ASCII"
    try:
        return ast.parse(answer.strip(), mode="eval"), None
    except (SyntaxError, ValueError, MemoryError, RecursionError, OverflowError):
        return None, f"not a {what} answer (does not parse)"


def _name(node: ast.AST) -> str:
    return {ast.Call: "a call", ast.Attribute: "an attribute", ast.Subscript: "a subscript",
            ast.Name: "a name", ast.Lambda: "a lambda", ast.JoinedStr: "an f-string"}.get(
        type(node), f"{type(node).__name__}")


def _literal(answer: str, dataset: str) -> str | None:
    tree, error = _parse(answer, MAX_LITERAL_CHARS, dataset)
    if error:
        return error
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.List, ast.Tuple, ast.Load)):
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
            continue
        if (isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd))
                and isinstance(node.operand, ast.Constant) and isinstance(node.operand.value, (int, float))):
            continue
        if isinstance(node, (ast.USub, ast.UAdd)):
            continue
        return f"a {dataset} answer must be its right answer or a plain Python literal (found {_name(node)})"
    return None


def _exponent_value(n: ast.AST) -> float:
    """The value of a numeric exponent (numbers, + - * / and parentheses), ``ValueError`` for anything else."""
    if isinstance(n, ast.Constant) and isinstance(n.value, (int, float)) and not isinstance(n.value, bool):
        if abs(n.value) > MAX_EXPONENT:
            raise ValueError
        return float(n.value)
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.USub, ast.UAdd)):
        return -_exponent_value(n.operand) if isinstance(n.op, ast.USub) else _exponent_value(n.operand)
    if isinstance(n, ast.BinOp) and isinstance(n.op, _ARITHMETIC_OPS):
        a, b = _exponent_value(n.left), _exponent_value(n.right)
        if isinstance(n.op, ast.Div):
            return a / b if b else 0.0
        return {ast.Add: a + b, ast.Sub: a - b, ast.Mult: a * b}[type(n.op)]
    raise ValueError


def _small_number(node: ast.AST) -> bool:
    """A numeric exponent: numbers, + - * / and parentheses only, of absolute value ≤ MAX_EXPONENT."""
    try:
        return abs(_exponent_value(node)) <= MAX_EXPONENT
    except (ValueError, RecursionError):
        return False


def _tower(node: ast.AST) -> float:
    """The product of the numeric exponents along the deepest chain of powers in ``node``: ``((2**1000)**1000)**1000``
    is 10^9 -- each exponent small, the number astronomical -- and so is ``((2**1000 + 1)**1000 + 1)**1000``."""
    best = 1.0
    stack = [(node, 1.0)]  # (subtree, product of the numeric exponents of the powers above it)
    while stack:
        n, above = stack.pop()
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Pow) and not _has_name(n.right):
            try:
                exponent = abs(_exponent_value(n.right))
            except (ValueError, RecursionError, ZeroDivisionError):
                exponent = float("inf")
            above *= max(exponent, 1.0)
            best = max(best, above)
            stack.append((n.left, above))
            continue
        stack.extend((child, above) for child in ast.iter_child_nodes(n))
    return best


def _has_name(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Name) for n in ast.walk(node))


def _expression(answer: str, dataset: str, ops: tuple[type, ...], calls: frozenset[str], names: bool,
                floats: bool) -> str | None:
    tree, error = _parse(answer, MAX_EXPRESSION_CHARS, dataset)
    if error:
        return error
    for node in ast.walk(tree):
        if isinstance(node, (ast.Expression, ast.Load)) or isinstance(node, ops):
            continue
        if isinstance(node, (ast.USub, ast.UAdd)):
            continue
        if isinstance(node, ast.BinOp) and isinstance(node.op, ops):
            if isinstance(node.op, ast.Pow) and not _has_name(node.right) and not _small_number(node.right):
                return f"a numeric exponent in a {dataset} answer must be a number of at most {MAX_EXPONENT}"
            continue
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            continue
        if isinstance(node, ast.Constant) and type(node.value) in ((int, float) if floats else (int,)):
            continue
        if names and isinstance(node, ast.Name) and node.id.isalnum():  # no underscores: no dunders
            continue
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in calls
                and not node.keywords and 1 <= len(node.args) <= 3
                and not any(isinstance(a, ast.Starred) for a in node.args)):
            continue
        return f"not allowed in a {dataset} answer: {_name(node)}"
    if _tower(tree) > MAX_EXPONENT:
        return f"powers of powers in a {dataset} answer may multiply their numeric exponents to at most {MAX_EXPONENT}"
    return None


def _eval_dataset(is_right: Callable[[str, dict[str, Any]], bool]) -> Callable[[str, str, dict], str | None]:
    def check(dataset: str, answer: str, entry: dict[str, Any]) -> str | None:
        return None if is_right(answer, entry) else _literal(answer, dataset)
    return check


def _sympy_dataset(ops: tuple[type, ...], calls: frozenset[str] = frozenset(), names: bool = True,
                   floats: bool = True) -> Callable[[str, str, dict], str | None]:
    def check(dataset: str, answer: str, entry: dict[str, Any]) -> str | None:
        return _expression(answer, dataset, ops, calls, names, floats)
    return check


# Each scorer compares the answer with its right answer *before* it evals: that text passes as is.
_CHECKS: dict[str, Callable[[str, str, dict], str | None]] = {
    "binary_matrix": _eval_dataset(lambda a, e: a == e.get("answer")),
    "string_insertion": _eval_dataset(lambda a, e: a == e.get("answer")),
    "spiral_matrix": _eval_dataset(lambda a, e: isinstance(e.get("answer"), str) and a.strip() == e["answer"].strip()),
    "n_queens": _eval_dataset(lambda a, e: a in (e.get("metadata", {}).get("valid_answers") or ())),
    "polynomial_multiplication": _sympy_dataset(_EXPRESSION_OPS),
    "simple_integration": _sympy_dataset(_EXPRESSION_OPS, _INTEGRATION_CALLS),
    "intermediate_integration": _sympy_dataset(_EXPRESSION_OPS, _INTEGRATION_CALLS),
    "countdown": _sympy_dataset(_ARITHMETIC_OPS, names=False, floats=False),
    "puzzle24": _sympy_dataset(_ARITHMETIC_OPS, names=False, floats=False),
}

#: The datasets whose answers are checked here (their scorers ``eval`` / ``parse_expr`` the answer).
GUARDED_DATASETS = frozenset(_CHECKS)


def check_answer(dataset: str, answer: str, entry: dict[str, Any]) -> str | None:
    """``None`` when ``answer`` may go to ``dataset``'s scorer, else why it may not.

    Datasets outside :data:`GUARDED_DATASETS` accept everything (their scorers do not run the answer).

    Example:
        >>> from llmgym.envs.math.answer_grammar import check_answer
        >>> check_answer("simple_integration", "x**3/3 + C", {}) is None
        True
        >>> check_answer("simple_integration", "x**(9**9**9)", {})
        'a numeric exponent in a simple_integration answer must be a number of at most 1000'
        >>> check_answer("binary_matrix", "().__class__", {"answer": "0 1"})
        'a binary_matrix answer must be its right answer or a plain Python literal (found an attribute)'
    """
    check = _CHECKS.get(dataset)
    return None if check is None else check(dataset, answer, entry)
