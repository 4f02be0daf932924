r"""Math answer checking on top of ``math-verify``: equality, forms and units, time limits.

An answer is taken from the completion, and the gold from the task, by the rules of
:mod:`llmgym.envs.math.answer_extraction`; what the question asks of the answer's form and which units
prose names are read by :mod:`llmgym.envs.math.answer_forms`. math-verify parses bare LaTeX unreliably
(``\dfrac12`` and ``\sqrt{2}`` parse to nothing, ``3\sqrt{3}`` to ``3``, ``(1, 2)`` to ``2``), so
every extracted answer, gold and prediction alike, is wrapped as ``$…$`` before parsing (falling
back to math-verify's plain-expression parser when that yields nothing). Two answers whose
normalised text is equal match without parsing (word answers such as "Monday").

**Where it runs.** Extraction runs in the caller and is linear in the completion's length
(scanners and regexes without overlapping quantifiers; the env caps the length at
``max_completion_chars``). Two plain numbers are compared there too, where the verdict is certain.
Everything else -- math-verify's parsing of model text with SymPy -- runs in the sandbox
(:mod:`llmgym.envs.math.scorer_pools`): a persistent sandboxed worker forks a fresh child per check and
kills it at ``time_limit`` (math-verify's own ``signal.alarm`` time-out is switched off). Nothing
keeps running after a step returns. Answers holding numbers over :data:`MAX_NUMBER_BITS` bits (power
towers, huge factorials) are refused before comparison; answers over :data:`MAX_ANSWER_CHARS`
characters are not compared at all.
"""

from __future__ import annotations

import fractions
import math
import re
from decimal import Decimal

from llmgym import Score, Task, Verifier
from llmgym.envs.math.answer_extraction import (  # noqa: F401  (last_boxed: importable from here, as before)
    extract_answer,
    extract_answer_and_rule,
    last_boxed,
    math_spans,
    normalize_gold,
    tidy_answer,
)
from llmgym.envs.math.answer_forms import (
    DEFAULT_PROMPT_SCAN_CHARS,
    FORM_PHRASES,
    UNIT_ALIASES,
    asks_for_decimal,
    asks_for_percent,
    required_forms,
)
from llmgym.envs.math.answer_text import fold_answer, stray_letters, unread_symbol
from llmgym.envs.math.scorer_pools import MATH_VERIFY_MAX_NUMBER_BITS, close_workers, math_verify_equal
from llmgym.env.verifiers import RegexFormat, VerifierUnavailableError, WeightedSum
from llmgym.runtime.install import install_hint

__all__ = [
    "FORM_PHRASES",
    "MAX_ANSWER_CHARS",
    "UNIT_ALIASES",
    "asks_for_decimal",
    "asks_for_percent",
    "MAX_NUMBER_BITS",
    "extract_answer",
    "normalize_gold",
    "required_forms",
    "MathVerifier",
    "ThinkAnswerFormat",
    "math_reward",
]



_TEXT_WRAPPER = re.compile(r"\\(?:text|mathrm|textbf)\s*\{([^{}]*)\}")
# Spaces next to these carry no meaning: ``1 + 2`` is ``1+2``, ``(1, 2)`` is ``(1,2)``. Spaces between
# two digits or two letters do (``1 1/2`` is not ``11/2``), so they stay.
_SPACE_AROUND_OPERATOR = re.compile(r"\s*([-+*/=,;:<>^_()\[\]{}|!])\s*")
_SPACE_BEFORE_COMMAND = re.compile(r"\s+(?=\\)")
_PURE_WORDS = re.compile(r"[A-Za-z][A-Za-z\s,'.\-]*")
_GREEK = frozenset(
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi omicron pi "
    "varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega".split()
)
_SYMBOL = re.compile(r"\\([A-Za-z]+)|([A-Za-z])")


def _unwrap(text: str) -> str:
    return _TEXT_WRAPPER.sub(r"\1", text).strip()


_NUMBER_LITERAL = re.compile(
    r"[+-]?(?:\d+(?:\.\d+)?|\.\d+|\\[dt]?frac\{\d+\}\{\d+\}|\d+/\d+)"
)
_VARIABLE_PREFIX = re.compile(r"[A-Za-z]\s*=\s*")


def _is_number_literal(text: str) -> bool:
    r"""``-12``, ``3.5``, ``\frac{7}{2}``, ``7/2`` (after ``\text{}``/``$`` unwrapping, an optional ``x =``);
    a fraction only in lowest terms, with a denominator above 1: ``20/4`` is a division left undone
    (the question "Compute 20 / 4." echoed), not a number written out.

    Example:
        >>> [_is_number_literal(t) for t in ["-12", "x = 3.5", r"\frac{7}{2}", "8 * 18", "1 = 17", "2^{3}"]]
        [True, True, True, False, False, False]
        >>> [_is_number_literal(t) for t in ["20 / 4", r"\frac{6}{1}", "-14/4"]]
        [False, False, False]
    """
    text = _unwrap(text).strip().strip("$").strip()
    match = _VARIABLE_PREFIX.match(text)
    if match:
        text = text[match.end():]
    text = text.replace(" ", "")
    if not _NUMBER_LITERAL.fullmatch(text):
        return False
    value = _host_number(text)
    return value is None or value[1] or "/" not in _canonical(text) or value[0].denominator > 1 and _is_evaluated_number(text)


def _is_words(text: str) -> bool:
    """Plain words (``Monday``, ``New York``, ``yes``): no digits, operators or LaTeX; two letters at least."""
    return bool(_PURE_WORDS.fullmatch(text)) and bool(re.search(r"[A-Za-z]{2}", text))


def _plain(text: str, fold_case: bool = False) -> str:
    """Text for the string fast path: no ``\\text{}`` wrapper, no spaces around operators and commas.

    Case is kept (``2N`` is not ``2n``) unless ``fold_case`` (both answers are plain words).
    """
    # whitespace runs first become one space, so the two patterns below never rescan a long run
    text = re.sub(r"\s+", " ", _unwrap(text))
    text = _SPACE_BEFORE_COMMAND.sub("", _SPACE_AROUND_OPERATOR.sub(r"\1", text))
    return text.lower() if fold_case else text


def _symbols(text: str) -> set[str]:
    """Latin letters and Greek-letter commands of a math answer, case kept (``\\Delta`` and ``\\delta`` differ)."""
    found = set()
    for match in _SYMBOL.finditer(_unwrap(text)):
        command, letter = match.groups()
        if letter:
            found.add(letter)
        elif command.lower() in _GREEK:
            found.add(command)
    return found


_FRACTION_COMMAND = re.compile(r"\\[dt]?frac\s*(?:\{\s*(\d+)\s*\}|(\d))\s*(?:\{\s*(\d+)\s*\}|(\d))")
_SIZING = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg|displaystyle)(?![A-Za-z])|\\[,;:! ]")
_STYLE_VARIANT = re.compile(r"\\[dt](frac|binom)(?![A-Za-z])")
_ONE_CHAR_GROUP = re.compile(r"([\^_])\{\s*([A-Za-z0-9])\s*\}")
_SPACE_AFTER_COMMAND = re.compile(r"(\\[A-Za-z]+)\s+(?=([A-Za-z])?)")


def _canonical(text: str) -> str:
    r"""Text for telling an echo: ``_plain`` with ``\frac{3}{6}`` / ``\dfrac36`` as ``3/6``, ``\dbinom`` as
    ``\binom``, ``2^{3}`` as ``2^3``, sizing and thin spaces dropped, and no space after a command but
    one before a letter (``\cdot 3`` is ``\cdot3``, ``\pi r`` stays)."""
    text = _STYLE_VARIANT.sub(r"\\\1", text.strip().strip("$"))
    text = _FRACTION_COMMAND.sub(lambda m: f"{m[1] or m[2]}/{m[3] or m[4]}", text)
    text = _ONE_CHAR_GROUP.sub(r"\1\2", _SIZING.sub("", text))
    text = _SPACE_AFTER_COMMAND.sub(lambda m: m[1] + (" " if m[2] else ""), text)
    return _plain(text)


def _is_evaluated_number(text: str) -> bool:
    """An integer, a decimal or a fraction in lowest terms: a value written out, never an echo."""
    value = _host_number(text)
    if value is None:
        return False
    plain = _canonical(text).lstrip("+-")
    if "/" not in plain:
        return True
    num, _, den = plain.partition("/")
    return num.isdigit() and den.isdigit() and int(den) > 1 and math.gcd(int(num), int(den)) == 1


def _question_expressions(prompt: str) -> set[str]:
    """The canonical text of each math span of ``prompt`` and of each side of an ``=`` in it."""
    found = set()
    for span in math_spans(prompt):
        found.add(_canonical(span))
        if "=" in span:
            found.update(_canonical(side) for side in span.split("="))
    found.discard("")
    return found


def _prompt_text(task: Task) -> str:
    prompt = task.prompt if isinstance(task.prompt, str) else "\n".join(
        str(m.get("content", "")) for m in task.prompt if isinstance(m, dict))
    return prompt[:DEFAULT_PROMPT_SCAN_CHARS]


# -- percent signs and units (host, lexical) --------------------------------------------------------------

_PERCENT = re.compile(r"\\?%")
_NUMBER_PERCENT = re.compile(r"(?<![\d.])([+-]?)(\d+(?:\.\d+)?|\.\d+)\s*\\?%")


def _percents(task: Task, gold: str, predicted: str) -> tuple[str, str]:
    r"""Gold and answer with their percent signs read one way.

    Where the question asks for a percent (:func:`asks_for_percent`) or the reference carries a ``%``,
    numbers are percents: the sign is dropped from both (``3\%`` and ``3`` are one answer, ``0.03`` is not).
    Elsewhere ``%`` means hundredths: ``3\%`` is ``0.03`` (a number written before it is shifted here; math-verify
    would read a percentage both ways, 3 and 0.03 alike).
    """
    if "%" not in gold and "%" not in predicted:
        return gold, predicted
    if "%" in gold or asks_for_percent(_prompt_text(task)):
        return tidy_answer(_PERCENT.sub("", gold)), tidy_answer(_PERCENT.sub("", predicted))

    def hundredths(match: re.Match[str]) -> str:
        value = Decimal(match[2]).scaleb(-2)
        return match[1] + format(value.normalize() if value != value.to_integral() else value.quantize(1), "f")
    return gold, _NUMBER_PERCENT.sub(hundredths, predicted)


# a wrapper's words, and the power after it (any power: \text{ units}^2 is square units, \mathrm{cm}^{3} cubic
# centimeters, \text{ m}^{-1} a unit of its own)
_UNIT_WRAPPER = re.compile(
    r"\\(?:text|textrm|textnormal|mathrm|mbox)\s*\{([^{}]*)\}(?:\s*\^\s*(\{[^{}]*\}|[^\s{}\\]))?")
_WORD = re.compile(r"[^\W\d_]+")  # any script's letters: "см" is a unit the question may not name
_POWER_WORDS = {"2": "square", "3": "cubic", "-1": "per"}


def _power_word(power: str) -> str:
    """A wrapper's power as a unit word: 2, 3 and -1 are "square", "cubic" and "per", any other the power itself
    (``^{-2}``: "per square meter" is not a meter); none is empty."""
    power = "".join(power.strip("{}").split())
    return _POWER_WORDS.get(power, "^" + power if power else "")


def _unit_sequence(text: str, wrapped: bool) -> list[str]:
    """The words of ``text`` (only those in ``\\text{}``-like wrappers if ``wrapped``) as unit names, in order:
    lower case, abbreviations spelled out, plurals made singular, ``/`` as "per", a wrapper's power before its words ("square",
    "cubic", or the power as written). A single letter is a symbol, not a unit, unless it is a wrapped
    abbreviation (``\\text{ m}``); in prose, neither is "in" (the preposition)."""
    if wrapped:
        parts, end = [], None
        for found in _UNIT_WRAPPER.finditer(text):
            gap = text[end:found.start()] if end is not None else ""
            if "/" in gap or "".join(gap.split()) == "}{":  # \text{m}/\text{s}, \frac{\text{m}}{\text{s}}: per
                parts.append("per")
            words, power = found.groups()
            parts.append(f"{_power_word(power or '')} {words.replace('/', ' per ')}")  # m/s: meters per second
            end = found.end()
        text = " ".join(parts)
    sequence = []
    for word in re.findall(r"\^\S+|[^\W\d_]+", text):
        if word.startswith("^"):
            sequence.append(word)
            continue
        word = word.lower()
        if len(word) == 1 and (not wrapped or word not in UNIT_ALIASES):
            continue  # \mathrm{i}, \mathrm{e}, \mathrm{d}, the m of "$5m$": a symbol, not a unit
        if not wrapped and word == "in":
            continue
        if word in UNIT_ALIASES:
            sequence.extend(UNIT_ALIASES[word].split())
        elif len(word) > 3 and word.endswith("s"):
            sequence.append(word[:-1])
        else:
            sequence.append(word)
    return sequence


def _unit_words(text: str, wrapped: bool) -> set[str]:
    """The words of :func:`_unit_sequence`, as a set (what a question names)."""
    return set(_unit_sequence(text, wrapped))


# a unit holds no digit: the trailing ``\text{ (or 5)}`` of a hedge is not one, and is never dropped
_TRAILING_UNIT = re.compile(r"(?:\s*\\(?:text|textrm|textnormal|mathrm|mbox)\s*\{[^{}\d]*\}(?:\^\{?\d\}?)?)+\s*$")


def _drop_unit(text: str) -> str:
    """``text`` less the unit words that end it (``5 \\text{ cm}^2`` is ``5``), unless nothing else is left."""
    kept = _TRAILING_UNIT.sub("", text)
    return kept if kept.strip() else text


_KNOWN_UNITS = frozenset(UNIT_ALIASES) | frozenset(w for name in UNIT_ALIASES.values() for w in name.split())
"""Every word :data:`UNIT_ALIASES` knows as a unit (an abbreviation or a full name)."""


#: Words a unit may be where the question names none, beyond :data:`UNIT_ALIASES`: a generic unit and currencies.
_GENERIC_UNITS = frozenset({"unit", "dollar", "euro", "cent", "penny", "pennie"})
#: Words that scale the number before them: never a unit ("3 thousand" is not 3, "3 hundredths" not 3).
_SCALE_WORDS = frozenset({"hundred", "thousand", "million", "billion", "trillion", "dozen", "tenth", "hundredth",
                          "thousandth", "millionth", "billionth", "k"})


def _unit_mismatch(task: Task, gold: str, predicted: str) -> str | None:
    r"""Why the answer's unit is not the reference's, or ``None``.

    A unit is a word in ``\text{}`` (every text, font and letter outside the reference's symbols is folded there
    first: :mod:`llmgym.envs.math.answer_text`). Units are compared as written, never converted: where the
    reference has one the answer's must be the same (``5 \text{ cm}`` does not answer ``5 \text{ m}``, nor does
    ``500 \text{ cm}``); where it has none but the question names units, the answer's must be one of them
    (``5 \text{ cm}`` answers "How long, in centimeters, ...?", not "... in meters?"); where neither names a unit,
    the answer's words must be units or words of the question (``45 minutes`` for "How long did he walk?", "18
    rolls" for "How many rolls are left?"), and never a word that scales the number (``3 \text{ thousand}``).
    An answer without a unit is read in the reference's.
    """
    ours = _unit_sequence(predicted, wrapped=True)
    mine = set(ours)
    if not mine:
        return None
    if len(ours) != len(mine):  # "meter meter" is a square meter, never a meter: a unit says each word once
        return f"the answer's unit ({' '.join(ours)}) repeats a word: write a power as one (cm^2, square centimeters)"
    scale = sorted(mine & _SCALE_WORDS)
    if scale:
        return f"the answer's words ({' '.join(scale)}) scale its number: write the number itself"
    theirs = _unit_sequence(gold, wrapped=True)
    if theirs:  # compared as written, in order: "meter meter" is not "meter", "second per meter" not "meter per second"
        return None if ours == theirs else (
            f"the answer's unit ({' '.join(ours)}) is not the reference's ({' '.join(theirs)})")
    prompt = _prompt_text(task)
    named = _unit_words(prompt, wrapped=False) | _unit_words(prompt, wrapped=True)
    if not named & _KNOWN_UNITS:
        # nothing to hold the answer's unit to (a unitless reference, a question naming no unit): a unit or the
        # question's own words, nothing else (deny by default)
        unknown = sorted(mine - _KNOWN_UNITS - _GENERIC_UNITS - named)
        return None if not unknown else f"the answer's words ({' '.join(unknown)}) are neither a unit nor the question's"
    unknown = sorted(mine - named)
    if unknown:
        return f"the answer's unit ({' '.join(unknown)}) is not one the question names"
    asked = _unit_sequence(prompt, wrapped=False) + ["|"] + _unit_sequence(prompt, wrapped=True)
    if not any(asked[i:i + len(ours)] == ours for i in range(len(asked))):  # in the question's order: s/m is not m/s
        return f"the answer's unit ({' '.join(ours)}) is not one the question names (its words in this order)"
    return None


def _echoes_question(task: Task, predicted: str, gold: str) -> bool:
    r"""Whether ``predicted`` is one of the question's own expressions, verbatim, and not the reference.

    Example:
        >>> _echoes_question(Task(r"What is $\frac{3}{6}$ in lowest terms?"), "3/6", r"\frac{1}{2}")
        True
        >>> _echoes_question(Task(r"Express $\frac{3}{4}$ as a decimal."), r"\frac34", "0.75")
        True
        >>> _echoes_question(Task(r"Is $7$ more than $2 + 4$?"), "7", r"\text{yes}")  # an integer is a value
        False
    """
    prompt = _prompt_text(task)
    mine = _canonical(predicted)
    value = _host_number(predicted)
    if not mine or mine == _canonical(gold) or (value is not None and not value[1] and "/" not in mine):
        return False  # an integer is a value, never a form of one; the reference as written is right
    return mine in _question_expressions(prompt)


def _case_only_difference(gold: str, predicted: str) -> bool:
    """True if the answers' symbols differ only in case (``2N`` / ``2n``): math-verify folds case, math does not."""
    a, b = _symbols(gold), _symbols(predicted)
    return a != b and {s.lower() for s in a} == {s.lower() for s in b}


# -- numbers decided on the host; everything else by math-verify in the sandbox -------------------

#: An extracted answer longer than this (characters) is not handed to math-verify: no real answer is
#: that long, and parsing kilobytes of LaTeX costs seconds of a worker's time limit for nothing.
MAX_ANSWER_CHARS = 2000

#: Numbers beyond this many bits are refused before comparison (in the sandbox): SymPy would compute
#: 9^{9^{9}} (~1.2e9 bits) exactly, inside single long C calls.
MAX_NUMBER_BITS = MATH_VERIFY_MAX_NUMBER_BITS

_HOST_NUMBER = re.compile(
    r"(?P<sign>[+-]?)(?:"
    r"(?P<int>\d{1,3}(?:,\d{3})+|\d+)(?P<dec>\.\d+)?|(?P<bare_dec>\.\d+)"  # 12, 1,000, 3.5, .5
    r"|(?P<num>\d+)/(?P<den>\d+)"  # 7/2
    r"|\\[dt]?frac(?:\{(?P<fnum>\d+)\}\{(?P<fden>\d+)\}|(?P<fnum1>\d)(?P<fden1>\d))"  # \frac{7}{2}, \frac72
    r")"
)
_HOST_NUMBER_MAX_CHARS = 100


def _host_number(text: str) -> tuple[fractions.Fraction, bool] | None:
    r"""``(exact value, written with a decimal point)`` of a plain number literal, else ``None``.

    Example:
        >>> [_host_number(t) for t in ["-12", "1,000", r"\frac{7}{2}", "x = 3", "2^{3}"]]  # doctest: +NORMALIZE_WHITESPACE
        [(Fraction(-12, 1), False), (Fraction(1000, 1), False), (Fraction(7, 2), False), None, None]
    """
    if len(text) > _HOST_NUMBER_MAX_CHARS:
        return None
    match = _HOST_NUMBER.fullmatch(text.strip())
    if match is None:
        return None
    g = match.groupdict()
    sign = -1 if g["sign"] == "-" else 1
    if g["int"] is not None or g["bare_dec"] is not None:
        digits = (g["int"] or "0").replace(",", "") + (g["dec"] or g["bare_dec"] or "")
        return sign * fractions.Fraction(digits), bool(g["dec"] or g["bare_dec"])
    num, den = (g["num"], g["den"]) if g["num"] is not None else (g["fnum"] or g["fnum1"], g["fden"] or g["fden1"])
    if int(den) == 0:
        return None
    return sign * fractions.Fraction(int(num), int(den)), False


def _host_verdict(gold: str, predicted: str, float_rounding: int) -> float | None:
    """1.0 / 0.0 where both answers are plain numbers and math-verify's verdict is certain, else ``None``.

    Equal values are equal to math-verify too. Two exact numbers (no decimal point) that differ are
    unequal to it (it compares integers and fractions exactly). With a decimal point it rounds to
    ``float_rounding`` places: only a difference well beyond that is decided here.
    """
    g, p = _host_number(gold), _host_number(predicted)
    if g is None or p is None:
        return None
    (gv, g_dec), (pv, p_dec) = g, p
    if gv == pv:
        return 1.0
    if not (g_dec or p_dec):
        return 0.0
    margin = fractions.Fraction(2, 10**float_rounding) + max(abs(gv), abs(pv)) * fractions.Fraction(1, 10**12)
    return 0.0 if abs(gv - pv) > margin else None


def _host_form(gold: str, predicted: str, forms: tuple[str, ...]) -> str | None:
    """For two plain numbers of equal value: why the answer breaks a form the reference sets, or ``None``
    (the same rules as the sandbox's ``exact`` and ``normal``)."""
    (_, g_dec), (value, p_dec) = _host_number(gold), _host_number(predicted)  # type: ignore[misc]
    if "exact" in forms and not g_dec and p_dec and value != _host_number(gold)[0]:  # type: ignore[index]
        return "the reference is exact and the question asks for no decimal: this decimal is an approximation"
    if "normal" in forms and _is_evaluated_number(gold) and not _is_evaluated_number(predicted):
        return "the reference is written out; the answer is not (it still evaluates to another form)"
    return None


def _math_verify_installed() -> None:
    import importlib.util

    if importlib.util.find_spec("math_verify") is None:
        raise ModuleNotFoundError(
            f"MathVerifier needs the 'math-verify' package: {install_hint('math')} (or pip install math-verify)",
            name="math_verify",
        )


class MathVerifier(Verifier):
    r"""1.0 when the completion's answer equals ``task.answer`` mathematically (math-verify), else 0.0.

    Extraction and gold normalisation follow :mod:`llmgym.envs.math.answer_extraction` (last ``\boxed{}``,
    ``<answer>`` tags, "answer is X", ``#### X``, bare math, last math span, last number). Equality is
    math-verify's: numeric within ``float_rounding`` digits, symbolic, sets/tuples/intervals,
    equations ``x = 3`` vs ``3``, percentages.

    Where does the answer go? Extraction is linear-time host code. Two plain numbers (``-12``,
    ``3.5``, ``1,000``, ``7/2``, ``\frac{7}{2}``) are compared on the host when the verdict is
    certain; everything else goes to math-verify, which runs in the sandbox
    (:mod:`llmgym.envs.math.scorer_pools`): model text never reaches SymPy on the host.

    Args:
        time_limit: seconds per check, enforced by killing the sandboxed check (``None``: the
            sandbox worker's own limit, 60 s).
        float_rounding, numeric_precision, strict: passed to ``math_verify.verify``.
        literal_answer: the answer must be a number written out (``-12``, ``3.5``, ``\frac{7}{2}``,
            ``7/2``, optionally ``x = ...``), not an expression: math-verify evaluates expressions, so
            without this a policy scores 1.0 by echoing the question's ``8 * 18`` (on for Arithmetic).
        refuse_echo: an answer that is one of the question's own math expressions (a ``$…$`` span,
            or one side of an ``=`` in it) scores 0 unless it is the reference answer as written or
            an integer: math-verify evaluates it, so "What is $\frac{3}{6}$ in lowest terms?"
            answered ``\frac{3}{6}``, or "Express $0.75$ as a common fraction." answered ``0.75``,
            would score 1.0 (default on). Compared as parsed trees, not as text, in the sandbox:
            ``\frac{\,3}{6}``, ``3/6`` and ``\dfrac36`` are one tree, ``3 \times 2^3`` and
            ``2^3 \cdot 3`` another; no-ops do not count (``2^{10} \cdot 1``, ``+ 0``, ``^{1}``,
            ``16^{1/2}`` for ``\sqrt{16}``).
        check_form: where the question asks for a form (:data:`FORM_PHRASES`: "in lowest terms", "as
            a common fraction", "in simplest radical form", "as a decimal", "in interval
            notation", "in scientific notation"), an answer equal to the reference must also be written
            in it -- ``\frac{6}{12}`` is not in lowest terms, ``\sqrt{12}`` not in simplest radical
            form -- when the reference itself is. And, asked or not, the reference's own form: where
            it is exact, an answer's decimals must give exactly its value (``0.666667`` does not
            answer ``\frac{2}{3}``) unless the question asks for a decimal (:func:`asks_for_decimal`);
            where it is written out (SymPy's evaluation leaves it as it is), so must the answer be
            (``\binom{8}{4}``, ``70 + 1 - 1``, ``\sqrt{16}``, ``\frac{12}{18}`` are not). Percent signs
            are read one way (in a percent question both ``3\%`` and ``3`` are 3 percent; elsewhere
            ``3\%`` is ``0.03``) and a unit (in ``\text{}``, or in words right after the answer) must be
            the reference's, or one the question names where the reference has none. A tuple's or
            matrix's entries are each held to these forms (default on). Before any of it, both answers are
            folded to one spelling (:mod:`llmgym.envs.math.answer_text`: every text, font and spacing command as
            ``\text{}``, Unicode variants, percent words as ``\%``), letters outside text that are not the
            reference's symbols are a unit at the end or refused elsewhere, and (always) an answer must be of
            a type the reference can be read as: the set ``\{-1, 1\}`` does not answer the interval ``(-1, 1)``.

    Raises:
        ModuleNotFoundError: math-verify is not installed (at construction: an env fails at ``make``).
        VerifierUnavailableError: at a check, the task's reference answer is empty or math-verify
            cannot parse it (in time): no completion could be scored against it, the right one included.

    ``info`` holds ``extracted`` (the prediction's answer), ``extracted_by`` (the rule) and ``gold``.
    A check that cannot run at all (no sandbox, a worker that does not start) raises; a completion
    whose check fails or times out scores 0.0 with ``info["error"]``.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.math import MathVerifier
        >>> v = MathVerifier()
        >>> task = Task("What is 1/2 as a decimal?", answer=r"\frac{1}{2}")
        >>> v(task, "It is 0.5").reward, v(task, r"\boxed{\frac12}").reward, v(task, "0.25").reward
        (1.0, 1.0, 0.0)
        >>> v(Task("q", answer="... so she has 18 left. #### 18"), "The answer is 18.").reward
        1.0
        >>> v(Task("q", answer="2x + 2"), r"\boxed{2(x+1)}").reward  # math-verify, in the sandbox
        1.0
        >>> v(task, "I am not sure how to solve this one.").info["error"]
        'no answer found in the completion'
    """

    time_limit = 5.0

    def __init__(
        self,
        time_limit: float | None = 5.0,
        *,
        float_rounding: int = 6,
        numeric_precision: int = 15,
        strict: bool = True,
        literal_answer: bool = False,
        refuse_echo: bool = True,
        check_form: bool = True,
    ):
        _math_verify_installed()
        super().__init__()
        self.time_limit = time_limit
        self.literal_answer = literal_answer
        self.refuse_echo, self.check_form = refuse_echo, check_form
        self.float_rounding, self.numeric_precision, self.strict = float_rounding, numeric_precision, strict

    def verify(self, task: Task, completion: str) -> Score:
        gold = normalize_gold(task.answer)
        if not gold.strip():  # the dataset's fault, not the completion's: never a silent 0 for everyone
            raise VerifierUnavailableError(
                f"the task has no reference answer (answer={task.answer!r}): nothing can be scored against it; "
                "give the task its answer or drop it from the dataset")
        predicted, rule = extract_answer_and_rule(completion)
        info = {"extracted": predicted, "extracted_by": rule, "gold": gold}
        if predicted is None:
            return Score(0.0, {**info, "error": "no answer found in the completion"})
        if len(predicted) > MAX_ANSWER_CHARS:
            return Score(0.0, {**info, "extracted": predicted[:100] + "...",
                               "error": f"the answer is {len(predicted)} characters long (over {MAX_ANSWER_CHARS}): not compared"})
        # one spelling for text, fonts, spaces, Unicode and percent words, on both sides, before anything is judged
        gold, predicted = fold_answer(gold), fold_answer(predicted)
        symbol = unread_symbol(predicted)
        if symbol is not None:
            return Score(0.0, {**info, "error": f"the answer has a sign the verifier does not read ({symbol!r})"})
        if self.literal_answer and not _is_number_literal(predicted):
            return Score(0.0, {**info, "error": "the answer must be a number written out, not an expression"})
        words = _is_words(_unwrap(predicted)) and _is_words(_unwrap(gold))
        if _plain(predicted, fold_case=words) == _plain(gold, fold_case=words):
            return Score(1.0, info)
        gold, predicted = _percents(task, gold, predicted)
        if not words and self.check_form:
            predicted, stray = stray_letters(predicted, gold)  # letters at the end are a unit; elsewhere, not the reference's
            if stray:
                return Score(0.0, {**info, "error": stray})
            mismatch = _unit_mismatch(task, gold, predicted)
            if mismatch:
                return Score(0.0, {**info, "error": mismatch})
            if _unit_words(predicted, wrapped=True):  # checked: the numbers are compared without their units
                gold, predicted = _drop_unit(gold), _drop_unit(predicted)
        if self.refuse_echo and _echoes_question(task, predicted, gold):
            return Score(0.0, {**info, "error": "the answer is one of the question's own expressions, not evaluated"})
        if not words and _case_only_difference(gold, predicted):
            return Score(0.0, {**info, "error": "the answers differ in the case of a symbol"})
        asked = required_forms(_prompt_text(task)) if self.check_form else ()
        # the reference's own form: exact where it is exact (unless the question asks for a decimal), written out
        # where it is written out
        implied = (() if asks_for_decimal(_prompt_text(task)) else ("exact",)) + ("normal",) if self.check_form else ()
        forms = asked + implied
        verdict = _host_verdict(gold, predicted, self.float_rounding)
        if verdict is not None and not (verdict and asked):  # a right number may still be in the wrong form
            reason = _host_form(gold, predicted, implied) if verdict else None
            return Score(0.0, {**info, "error": reason}) if reason else Score(verdict, info)
        spans = tuple(math_spans(_prompt_text(task))) if self.refuse_echo else ()
        reward, error = math_verify_equal(
            gold, predicted, float_rounding=self.float_rounding, numeric_precision=self.numeric_precision,
            strict=self.strict, time_limit=self.time_limit, question_spans=spans, forms=forms,
        )
        return Score(reward, info if error is None else {**info, "error": error})

    def _safe(self, task: Task, completion: str) -> Score:
        # No forked child: extraction is linear on bounded text, and math-verify runs in the sandbox,
        # killed at the time limit there.
        return self._guarded(task, completion)

    def close(self) -> None:
        """Stop this process's idle sandboxed scorer workers (they start again when needed)."""
        close_workers()

    def __enter__(self) -> MathVerifier:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"MathVerifier(time_limit={self.time_limit})"



# -- format and combined reward -------------------------------------------------------------------


class ThinkAnswerFormat(RegexFormat):
    """1.0 for exactly ``<think>…</think><answer>…</answer>`` (whitespace around allowed), else 0.0.

    Each tag appears once, in that order, the answer is not empty, and nothing else is outside them.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.math import ThinkAnswerFormat
        >>> fmt = ThinkAnswerFormat()
        >>> fmt(Task("q"), "<think>2+2=4</think>\\n<answer>4</answer>").reward
        1.0
        >>> fmt(Task("q"), "<answer>4</answer>").reward, fmt(Task("q"), "<think>a</think><answer>4</answer> ok").reward
        (0.0, 0.0)
    """

    PATTERN = (
        r"\A\s*<think>(?:(?!</?think>|</?answer>).)*</think>\s*"
        r"<answer>(?:(?!</?think>|</?answer>).)*(?!</?think>|</?answer>)\S(?:(?!</?think>|</?answer>).)*</answer>\s*\Z"
    )

    def __init__(self, time_limit: float | None = None):
        super().__init__(self.PATTERN, time_limit=time_limit)

    def verify(self, task: Task, completion: str) -> Score:
        # The scanner below accepts exactly what PATTERN matches, in linear time: the regex backtracks
        # quadratically over an unclosed answer (16k characters took 7 s, 64k would take minutes).
        return Score(float(_think_answer_shape(completion)), {"pattern": self.pattern.pattern})


_TAGS = ("<think>", "</think>", "<answer>", "</answer>")


def _think_answer_shape(text: str) -> bool:
    """``<think>…</think>`` blank ``<answer>…</answer>``, blanks around, no tag inside, a non-blank answer."""
    text = _strip_regex_space(text)
    if not (text.startswith("<think>") and text.endswith("</answer>")):
        return False
    close = text.find("</think>")
    if close < 0:
        return False
    think, rest = text[7:close], _strip_regex_space(text[close + 8 :], right=False)
    if len(rest) < 17 or not rest.startswith("<answer>"):
        return False
    answer = rest[8:-9]
    if any(tag in part for tag in _TAGS for part in (think, answer)):
        return False
    return bool(_strip_regex_space(answer))


def _strip_regex_space(text: str, right: bool = True) -> str:
    # what `\s*` at the ends skips: str.isspace() and the regex's \s differ on a few separators
    # (\x1c-\x1f are whitespace to str, not to re), so strip exactly re's set
    start, end = 0, len(text)
    while start < end and _IS_RE_SPACE(text[start]):
        start += 1
    while right and end > start and _IS_RE_SPACE(text[end - 1]):
        end -= 1
    return text[start:end]


_RE_SPACE = re.compile(r"\s")


def _IS_RE_SPACE(char: str) -> bool:  # noqa: N802
    return _RE_SPACE.match(char) is not None


def math_reward(format_weight: float = 0.1, time_limit: float | None = 5.0) -> WeightedSum:
    """``format_weight · ThinkAnswerFormat + (1 − format_weight) · MathVerifier`` (best reward 1.0).

    ``info["format"]`` and ``info["correct"]`` hold each part's details.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.math import math_reward
        >>> reward = math_reward(format_weight=0.1)
        >>> task = Task("2+2?", answer="4")
        >>> [round(reward(task, c).reward, 2) for c in ("<think>easy</think><answer>4</answer>", "4", "<think>?</think><answer>5</answer>")]
        [1.0, 0.9, 0.1]
    """
    if not 0.0 <= format_weight <= 1.0:
        raise ValueError(f"format_weight must be within [0, 1], got {format_weight}")
    return WeightedSum(
        {
            "format": (format_weight, ThinkAnswerFormat()),
            "correct": (1.0 - format_weight, MathVerifier(time_limit=time_limit)),
        }
    )
