"""What a reasoning-gym answer earns: the RL reward decided on the host from the entry's own answer.

reasoning-gym's ``score_answer`` is written for evaluation, and several of its scores (0.1.25) pay
answers that hold no solution — a policy trained on them learns the hole, not the task:

* ``game_of_life_halting`` compares ``bool(answer)``: every non-empty string scores 1.0;
* ``coin_flip`` gives prefix credit: ``0`` scores 1.0 for any probability below 0.1 (``"0"`` is a
  prefix of ``"0.0625"``);
* ``complex_arithmetic`` scores ``min(1, exp(-distance))``: ``NaN`` makes it ``min(1, nan) = 1.0``;
* ``number_sorting`` accepts ``NaN`` (JSON's ``NaN`` compares as sorted and within tolerance) and any
  value off by less than 1;
* ``puzzle24`` checks that the value truncates to 24 and that four numbers of the value range appear,
  never that they are the puzzle's: the constant ``6*4*1*1`` scores 1.0 on every puzzle;
* partial credit for content-free answers: an all-zero ``game_of_life`` grid (≈ 0.96), the number
  echoed for ``prime_factorization`` (0.5), the puzzle with its blanks filled with 1 for
  ``sudoku``/``mini_sudoku``/``futoshiki`` (≈ 0.5), a format example for ``knights_knaves``, ``00:00:00``
  for ``time_intervals`` (≈ 0.85).

:func:`guard` turns an upstream score into the env's reward. ``scoring="binary"`` (the envs' default)
pays 1.0 for a right answer and 0.0 otherwise: for the four datasets above whose full score itself
is wrong (:data:`OWN_CHECKS`) llmgym decides correctness from the entry's answer with its own
parser; elsewhere an answer is right when reasoning-gym gives it its full score (1.0).
``scoring="upstream"`` returns reasoning-gym's score unchanged (evaluation parity with
reasoning-gym's published numbers, holes included).

Everything here runs on the host on model text, so it never evaluates it: answers are read by
small parsers of plain numbers and lists, linear in the answer's length and refused past
:data:`MAX_ANSWER_CHARS`.
"""

from __future__ import annotations

import ast
import math
import re
from fractions import Fraction
from typing import Any, Callable

__all__ = ["SCORINGS", "OWN_CHECKS", "RESTATEMENTS", "MAX_ANSWER_CHARS", "guard", "parse_number"]

SCORINGS = ("binary", "upstream")
"""``"binary"``: 1.0 iff the answer is right (the RL default); ``"upstream"``: reasoning-gym's own score."""

MAX_ANSWER_CHARS = 4096
"""Answers longer than this are not parsed by the own checks (scored 0): every answer they read is short."""

# a plain decimal with an optional short exponent: no NaN, no infinity, no unbounded exponent
# (Fraction("1e999999999") would compute 10**999999999); one pass of a regex without nested repeats
_NUMBER = re.compile(r"[+-]?(?:\d{1,64}(?:\.\d{0,64})?|\.\d{1,64})(?:[eE][+-]?\d{1,3})?")
_FRACTION = re.compile(r"([+-]?\d{1,64})\s{0,8}/\s{0,8}(\d{1,64})")


def parse_number(text: str) -> Fraction | None:
    """``text`` as an exact finite number (``3``, ``-0.25``, ``1.5e-3``, ``5/16``), else ``None``.

    Example:
        >>> from llmgym.envs.math.rg_guards import parse_number
        >>> parse_number(" 5/16 "), parse_number("0.3125"), parse_number("1e-2")
        (Fraction(5, 16), Fraction(5, 16), Fraction(1, 100))
        >>> [parse_number(t) for t in ("NaN", "inf", "1/0", "1e99999", "0x10", "")]
        [None, None, None, None, None, None]
    """
    text = text.strip()
    if not text or len(text) > 200:
        return None
    if _NUMBER.fullmatch(text):
        return Fraction(text)
    found = _FRACTION.fullmatch(text)
    if found and int(found.group(2)) != 0:
        return Fraction(int(found.group(1)), int(found.group(2)))
    return None


def _strip_quotes(item: str) -> str:
    item = item.strip()
    if len(item) >= 2 and item[0] == item[-1] and item[0] in "'\"":
        return item[1:-1]
    return item


def _number_list(text: str) -> list[Fraction] | None:
    """``[1, '2.5', "-3"]`` (a bracketed, comma-separated list of plain numbers, quoted or not), else ``None``."""
    text = text.strip()
    if len(text) < 2 or text[0] != "[" or text[-1] != "]":
        return None
    inner = text[1:-1].strip()
    if not inner:
        return []
    values = [parse_number(_strip_quotes(item)) for item in inner.split(",")]
    return None if any(v is None for v in values) else values


# -- llmgym's own checks, for the datasets whose upstream full score pays wrong answers --------------

def _game_of_life_halting(answer: str, entry: dict) -> bool:
    # the question asks for 'True' or 'False'; upstream compared bool(answer), true for any non-empty text
    said = answer.strip().strip(".'\"").strip().lower()
    return said in ("true", "false") and said == str(entry["answer"]).strip().lower()


def _coin_flip(answer: str, entry: dict) -> bool:
    rational = entry["metadata"]["rational"]
    exact = Fraction(int(rational["numerator"]), int(rational["denominator"]))
    text = answer.replace(",", "").strip()
    percent = text.endswith("%")
    value = parse_number(text[:-1] if percent else text)
    if value is None:
        return False
    if percent:
        value /= 100
    # upstream's absolute 1e-4, and a relative bound so that "0" cannot pass for a tiny probability
    error = abs(value - exact)
    return error <= Fraction(1, 10_000) and error <= exact / 1000


_COMPLEX_TERM = re.compile(r"([+-]?)(\d{1,64}(?:\.\d{0,64})?|\.\d{1,64})?([ij]?)")


def _complex(text: str) -> complex | None:
    """``a + bi`` / ``a - bi`` / ``bi`` / ``a`` (``i`` or ``j``; spaces and outer brackets ignored), finite only."""
    text = text.replace(" ", "").lower()
    while len(text) > 1 and text[0] == "(" and text[-1] == ")":
        text = text[1:-1]
    if not text or len(text) > 200:
        return None
    parts: dict[str, float] = {}
    pos = 0
    while pos < len(text):
        found = _COMPLEX_TERM.match(text, pos)
        sign, digits, unit = found.groups()
        if found.end() == pos or (not digits and not unit) or (parts and not sign):
            return None  # not a term, or two terms without an operator between them
        kind = "imag" if unit else "real"
        if kind in parts:
            return None  # one real and one imaginary part at most: no arithmetic left for the reader
        value = float(digits) if digits else 1.0
        parts[kind] = -value if sign == "-" else value
        pos = found.end()
    return complex(parts.get("real", 0.0), parts.get("imag", 0.0))


def _complex_arithmetic(answer: str, entry: dict) -> bool:
    value = _complex(answer)
    expected = complex(*entry["metadata"]["result"])
    return value is not None and abs(value - expected) <= 1e-9 * max(1.0, abs(expected))


def _number_sorting(answer: str, entry: dict) -> bool:
    given = _number_list(answer.replace("'", '"'))
    expected = [Fraction(str(v)) for v in entry["metadata"]["sorted_numbers"]]
    return given is not None and given == expected  # the same numbers, exactly, in the asked order


_SIGNED_NUMBER = re.compile(r"-?\d{1,64}(?:\.\d{1,64})?")


def _gsm_symbolic(answer: str, entry: dict) -> bool:
    # upstream reads the first number with r"\b-?\d+...": "\b" cannot precede "-", so "-288" scored as 288
    found = _SIGNED_NUMBER.search(answer.replace(",", ""))
    reference = parse_number(str(entry["answer"]).replace(",", ""))
    return found is not None and reference is not None and Fraction(found.group(0)) == reference


def _knights_knaves(answer: str, entry: dict) -> bool:
    # upstream keeps every "<name> ... <role>" pair in any text: a statement quoted from the question
    # ("if Amelia is a hero then Elizabeth is a hero") scored 1.0 where its pairs matched the solution.
    # Here the answer must be only "<name> is a/an <role>" clauses joined by "and", each name once.
    meta = entry["metadata"]
    names = [str(name).lower() for name in meta["names"]]
    roles = {str(meta["knight_knave_terms"]["knight"]).lower(): True, str(meta["knight_knave_terms"]["knave"]).lower(): False}
    words = answer.lower().replace(",", " ").replace(".", " ").replace(";", " ").split()
    said: dict[str, bool] = {}
    i = 0
    while i < len(words):
        if words[i] == "and" and said:
            i += 1
            continue
        clause = words[i:i + 4]
        if (len(clause) < 4 or clause[0] not in names or clause[0] in said or clause[1] != "is"
                or clause[2] not in ("a", "an") or clause[3] not in roles):
            return False
        said[clause[0]] = roles[clause[3]]
        i += 4
    return said == {name: bool(truth) for name, truth in zip(names, meta["solution"])}


def _exact_value(node: ast.AST) -> Fraction | None:
    """An arithmetic expression of integers (``+ - * /``, unary signs, brackets) evaluated exactly, else ``None``."""
    if isinstance(node, ast.Expression):
        return _exact_value(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return Fraction(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        inner = _exact_value(node.operand)
        return None if inner is None else (-inner if isinstance(node.op, ast.USub) else inner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub, ast.Mult, ast.Div)):
        a, b = _exact_value(node.left), _exact_value(node.right)
        if a is None or b is None:
            return None
        if isinstance(node.op, ast.Div):
            return a / b if b else None
        return a + b if isinstance(node.op, ast.Add) else a - b if isinstance(node.op, ast.Sub) else a * b
    return None


def _puzzle24(answer: str, entry: dict) -> bool:
    # upstream checks int(value) == 24 and that four numbers in the value range appear -- not that they
    # are the puzzle's: "6*4*1*1" scored 1.0 on every puzzle, and int() made 24.5 pass ("7/2*7*1")
    if len(answer) > 1000 or not answer.isascii():
        return False
    try:
        tree = ast.parse(answer.strip(), mode="eval")
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    constants = [n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)]
    if not all(type(c) is int for c in constants):
        return False
    wanted = sorted(int(n) for n in entry["metadata"]["numbers"])
    try:
        return sorted(constants) == wanted and _exact_value(tree) == 24
    except RecursionError:  # a thousand unary signs
        return False


OWN_CHECKS: dict[str, Callable[[str, dict], bool]] = {
    "game_of_life_halting": _game_of_life_halting,
    "coin_flip": _coin_flip,
    "complex_arithmetic": _complex_arithmetic,
    "number_sorting": _number_sorting,
    "gsm_symbolic": _gsm_symbolic,
    "knights_knaves": _knights_knaves,
    "puzzle24": _puzzle24,
}
"""Datasets whose upstream full score pays wrong answers: ``binary`` scoring decides these itself."""


def _strip_outer(text: str, double_negations: bool = False) -> str:
    """``text`` without spaces and without brackets that enclose all of it (``((p))`` → ``p``); with
    ``double_negations``, leading ``¬¬`` go too (``¬¬(¬¬p)`` → ``p``). One pass to pair the brackets,
    one to walk inwards."""
    text = "".join(text.split())
    closing, stack = {}, []
    for i, char in enumerate(text):
        if char == "(":
            stack.append(i)
        elif char == ")" and stack:
            closing[stack.pop()] = i
    start, end = 0, len(text) - 1
    while start < end:
        if closing.get(start) == end:
            start, end = start + 1, end - 1
        elif double_negations and text.startswith("¬¬", start):
            start += 2
        else:
            break
    return text[start:end + 1]


def _top_level_parts(text: str, operator: str) -> list[str]:
    """``text`` split at ``operator`` outside brackets (one linear scan)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += (char == "(") - (char == ")")
        if char == operator and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    return parts + [text[start:]]


def _restates_premises(answer: str, entry: dict) -> bool:
    """Whether a propositional-logic answer only restates (or weakens) the premises it was given.

    Any valid non-trivial conclusion scores 1.0 upstream, and a premise follows from the premises: an
    echo of the question's own premise scored 1.0. Refused: a premise (brackets, spaces and double
    negations aside), a conjunction or disjunction made only of premises, anything over 1,000
    characters (the work stays bounded: each level of brackets is one linear pass, 20 levels at most),
    and a premise weakened (:func:`_weakens_premises`: what follows from one premise alone, or from
    the premises the answer quotes).
    """
    def canonical(text: str) -> str:
        return _strip_outer(text, double_negations=True)

    premises = {canonical(p) for p in entry["metadata"]["premises"]}

    def restates(text: str, depth: int = 0) -> bool:
        text = canonical(text)
        if text in premises:
            return True
        if depth > 20:  # no conclusion nests and/or 20 deep: refused rather than searched further
            return True
        for operator in ("∧", "∨"):
            parts = _top_level_parts(text, operator)
            if len(parts) > 1:
                return all(restates(part, depth + 1) for part in parts)
        return False

    if len(answer) > 1000 or restates(answer):  # a conclusion is short: a longer one is not credited
        return True
    return _weakens_premises(answer, entry["metadata"]["premises"])


# -- propositional formulas, read on the host: a linear recursive-descent parser and truth tables as bitsets

_PROP_OPERATORS = {"↔": 0, "→": 1, "∨": 2, "∧": 3}  # reasoning-gym's precedence, loosest first
_MAX_PROP_VARIABLES = 16
_MAX_PROP_DEPTH = 100


def _prop_tokens(text: str) -> list[str] | None:
    tokens = []
    for char in text:
        if char.isspace():
            continue
        if char in "()¬" or char in _PROP_OPERATORS or "A" <= char <= "Z":
            tokens.append(char)
        else:
            return None
    return tokens


def _prop_parse(text: str) -> Any:
    """A formula as nested tuples (``("P",)``, ``("¬", f)``, ``(op, f, g)``, binary operators grouping
    to the left as reasoning-gym's parser groups them), or ``None`` when it is not one. Linear."""
    tokens = _prop_tokens(text)
    if not tokens:
        return None
    pos = 0

    def binary(level: int, depth: int) -> Any:
        nonlocal pos
        left = binary(level + 1, depth) if level < 3 else unary(depth)
        while left is not None and pos < len(tokens) and _PROP_OPERATORS.get(tokens[pos]) == level:
            op = tokens[pos]
            pos += 1
            right = binary(level + 1, depth) if level < 3 else unary(depth)
            left = None if right is None else (op, left, right)
        return left

    def unary(depth: int) -> Any:
        nonlocal pos
        if pos >= len(tokens) or depth > _MAX_PROP_DEPTH:
            return None
        token = tokens[pos]
        pos += 1
        if token == "¬":
            inner = unary(depth + 1)
            return None if inner is None else ("¬", inner)
        if token == "(":
            inner = binary(0, depth + 1)
            if inner is None or pos >= len(tokens) or tokens[pos] != ")":
                return None
            pos += 1
            return inner
        return (token,) if "A" <= token <= "Z" else None

    formula = binary(0, 0)
    return formula if formula is not None and pos == len(tokens) else None


def _prop_table(formula: Any, bits: dict[str, int], full: int) -> int:
    """The formula's truth table as a bitset: bit ``i`` is its value under the ``i``-th assignment."""
    if len(formula) == 1:
        return bits[formula[0]]
    if formula[0] == "¬":
        return full & ~_prop_table(formula[1], bits, full)
    a, b = _prop_table(formula[1], bits, full), _prop_table(formula[2], bits, full)
    return {"∧": a & b, "∨": a | b, "→": (full & ~a) | b, "↔": full & ~(a ^ b)}[formula[0]]


def _prop_subformulas(formula: Any, found: set) -> set:
    stack = [formula]
    while stack:
        node = stack.pop()
        found.add(node)
        stack.extend(node[1:] if len(node) > 1 else ())
    return found


def _prop_variables(formula: Any) -> set[str]:
    return {node[0] for node in _prop_subformulas(formula, set()) if len(node) == 1}


def _weakens_premises(answer: str, premises: list[str]) -> bool:
    """Whether a (valid) conclusion is only a premise weakened: it follows from one premise alone, or
    from the premises it quotes (as sub-formulas) -- ``(p ∨ X)``, ``(X → p)``, ``(p ∧ (X ∨ ¬X))``,
    ``((p ∧ q) ∨ X)`` for premises ``p``, ``q`` and anything ``X``. A real inference combines premises:
    from ``Q`` and ``(Q → P)``, ``(P ∧ Q)`` quotes ``Q`` but does not follow from it alone. An answer
    this parser cannot read is refused too (only refused answers reasoning-gym paid 1.0 reach here)."""
    conclusion = _prop_parse(answer)
    parsed = [_prop_parse(p) for p in premises]
    if conclusion is None:
        return True
    parsed = [p for p in parsed if p is not None]
    variables = sorted(_prop_variables(conclusion).union(*(_prop_variables(p) for p in parsed)))
    if len(variables) > _MAX_PROP_VARIABLES:
        return False  # not decided here (2^16 assignments at most): the syntactic refusals above stand
    size = 1 << len(variables)
    full = (1 << size) - 1
    # variable k is true in the assignments whose index has bit k set: 2^k zeros, 2^k ones, repeated
    bits = {v: (((1 << (1 << k)) - 1) << (1 << k)) * (full // ((1 << (2 << k)) - 1)) for k, v in enumerate(variables)}
    table = _prop_table(conclusion, bits, full)
    tables = {p: _prop_table(p, bits, full) for p in parsed}

    def entails(premise_table: int) -> bool:
        return premise_table & ~table == 0

    if any(entails(t) for t in tables.values()):
        return True
    quoted = _prop_subformulas(conclusion, set())
    together = full
    for premise, premise_table in tables.items():
        if premise in quoted:
            together &= premise_table
    return together != full and entails(together)


def _unevaluated_integral(answer: str, entry: dict) -> bool:
    """Whether an integration answer leaves an integral unevaluated (the question echoed as ``Integral(f, x)``).

    SymPy's ``Integral(f, x)`` differentiates back to ``f``, so the echoed question scored 1.0 upstream
    on every task. An antiderivative has no integral sign left in it: any ``Integral`` (any case) is
    refused. The few items whose own answer is unevaluated (SymPy could not integrate them, about one
    in nine of ``intermediate_integration``) then earn nothing under ``binary``: a policy cannot be
    told the echo from a solution there. One linear pass.
    """
    return "integral" in answer.lower()


RESTATEMENTS: dict[str, Callable[[str, dict], bool]] = {
    "propositional_logic": _restates_premises,
    "simple_integration": _unevaluated_integral,
    "intermediate_integration": _unevaluated_integral,
}
"""Datasets that accept any valid answer, some of which only restate the question: refused by ``binary``."""


def guard(dataset: str, answer: str | None, entry: dict[str, Any], upstream: Any,
          scoring: str = "binary") -> tuple[float, dict[str, Any]]:
    """``(reward, info)`` for ``answer`` (the extracted answer, ``None`` if none) to a reasoning-gym ``entry``.

    ``upstream`` is the dataset's own ``score_answer`` (``None`` or not finite counts as 0). With
    ``scoring="binary"`` the reward is 1.0 when the answer is right — by llmgym's own check for the
    datasets in :data:`OWN_CHECKS`, else when ``upstream`` is its full 1.0 — and 0.0 otherwise; with
    ``"upstream"`` it is ``upstream`` as given. ``info`` holds ``upstream_score`` and ``scoring``
    (and ``correct``, and ``checked_by`` when an own check decided).

    Example:
        >>> from llmgym.envs.math.rg_guards import guard
        >>> entry = {"answer": "False", "metadata": {}}
        >>> guard("game_of_life_halting", "False", entry, 1.0)[0], guard("game_of_life_halting", "no idea", entry, 1.0)[0]
        (1.0, 0.0)
        >>> guard("game_of_life_halting", "no idea", entry, 1.0, scoring="upstream")[0]  # reasoning-gym's own bool(answer)
        1.0
        >>> guard("prime_factorization", "245", {"answer": "5 × 7 × 7"}, 0.5)  # the number echoed: half credit upstream
        (0.0, {'scoring': 'binary', 'upstream_score': 0.5, 'correct': False})
    """
    if scoring not in SCORINGS:
        raise ValueError(f"scoring must be one of {SCORINGS}, got {scoring!r}")
    try:
        upstream_score = float(upstream) if upstream is not None else 0.0
    except (TypeError, ValueError):
        upstream_score = 0.0
    if not math.isfinite(upstream_score):
        upstream_score = 0.0
    info: dict[str, Any] = {"scoring": scoring, "upstream_score": upstream_score}
    if scoring == "upstream":
        return upstream_score, info
    check = OWN_CHECKS.get(dataset)
    if check is None:
        correct = upstream_score >= 1.0
        restates = RESTATEMENTS.get(dataset)
        if correct and restates is not None and isinstance(answer, str) and restates(answer, entry):
            correct, info["restates_question"] = False, True
    else:
        info["checked_by"] = "llmgym"
        correct = isinstance(answer, str) and len(answer) <= MAX_ANSWER_CHARS and bool(check(answer, entry))
    info["correct"] = correct
    return (1.0 if correct else 0.0), info
