r"""Taking a math answer out of a completion, and a dataset's stored answer into the same form.

How an answer is taken from a completion (:func:`extract_answer`), first rule that applies wins:

0. **Region.** If the completion has ``<answer>…</answer>``, only the content of the last such block
   is read (an unclosed last ``<answer>`` runs to the end). Otherwise, if it has ``</think>``, only
   the text after the last ``</think>`` is read (when that is not blank).
1. **Boxed.** The content of the last ``\boxed{…}`` (or ``\fbox{…}``), braces balanced.
2. **Answer marker.** After the last ``####`` (GSM8K), ``answer is``, ``answer:`` or ``answer =``
   (any case, so "The final answer is" too), up to the end of that line and sentence: the first
   ``$…$`` math in it, else the whole phrase when it is mathematical, else its first number.
3. **Bare answer.** The whole region, when it is one line of mathematics (no prose words outside
   LaTeX commands and environment names): ``\frac{1}{2}``, ``(1, 2)``, ``x = 3``, ``1,000``,
   ``\begin{pmatrix} 1 \\ 2 \end{pmatrix}``.
4. **Math span.** The last ``$…$``, ``$$…$$``, ``\(…\)`` or ``\[…\]`` whose content is mathematical
   (so currency such as "$5 and $3" is skipped).
5. **Last number.** The last number in the region: integer, decimal, ``a/b``, ``1,234`` (commas
   dropped), with its sign.
6. **Short text.** The whole region, when it is one line of at most three words ("Monday").

Nothing found: reward 0, ``info["error"]`` says so. After a marker, a number that is part of a word, a
string or a path (``x2``, ``'2'``, ``pytest-2/``) is not an answer.

**Gold answers** go through the same rules, so a gold stored the way datasets store it works: bare
LaTeX without ``$`` (MATH: ``\frac{1}{2}``), a plain number, GSM8K's ``"...reasoning... #### 18"``, a
``\boxed{}`` solution; an ``int``/``float``/``Fraction`` is turned into text first. A gold from
which no rule extracts anything is used whole.

Extraction is linear in the text's length (scanners and regexes without overlapping quantifiers); a
unit in words right after the answer is kept with it (:func:`~llmgym.envs.math.answer_forms.with_unit`).
:class:`~llmgym.envs.math.math_verifier.MathVerifier` compares what it extracts.
"""

from __future__ import annotations

import fractions
import re
from decimal import Decimal
from typing import Any

from llmgym.envs.math.answer_forms import unit_in_words, with_unit

__all__ = ["extract_answer", "extract_answer_and_rule", "last_boxed", "math_spans", "normalize_gold", "tidy_answer"]


_ANSWER_OPEN = re.compile(r"<answer>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"</answer>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think>", re.IGNORECASE)
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_MARKER = re.compile(r"####|\banswer\b\s*(?:is\b|:|=)\s*:?", re.IGNORECASE)
_NUMBER = re.compile(
    r"(?:(?<![\w)\]}])-)?(?:\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?(?:\s*/\s*\d+)?|\.\d+)"
)
# after an answer marker, a number counts only as its own token: the 2 of ``pytest-2/``, ``x2`` or ``'2'`` inside
# code or a path is not an answer
_STANDALONE_NUMBER = re.compile(r"(?<![\w./\\'\"`-])(?:" + _NUMBER.pattern + r")(?![\w/\\'\"`]|\.\d)")
_TEXT_COMMAND = re.compile(r"\\(?:text|textbf|textit|mathrm|mathbf|mbox|operatorname)\s*\{[^{}]*\}")
_LATEX_COMMAND = re.compile(r"\\[A-Za-z]+")
_SENTENCE_END = re.compile(r"\.(?=\s|$)")


def _region(text: str) -> str:
    opens = list(_ANSWER_OPEN.finditer(text))
    if opens:
        rest = text[opens[-1].end():]
        close = _ANSWER_CLOSE.search(rest)
        return rest[: close.start()] if close else rest
    closes = list(_THINK_CLOSE.finditer(text))
    if closes and text[closes[-1].end():].strip():
        return text[closes[-1].end():]
    return text


_BRACE = re.compile(r"[{}]")


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces balanced), or ``None``.

    Example:
        >>> from llmgym.envs.math.answer_extraction import last_boxed
        >>> print(last_boxed(r"so \\boxed{1} then \\boxed{\\frac{1}{2}}"), last_boxed("none"))
        \\frac{1}{2} None
    """
    starts = [match.end() for match in _BOXED.finditer(text)]
    if not starts:
        return None
    # one pass over the braces pairs each "{" with its "}" (a brace's partner depends only on what
    # follows it), so trying every box from the last costs O(len(text)), not O(boxes * len(text))
    partner: dict[int, int] = {}
    stack: list[int] = []
    for brace in _BRACE.finditer(text, starts[0] - 1):
        if brace.group() == "{":
            stack.append(brace.start())
        elif stack:
            partner[stack.pop()] = brace.start()
    for start in reversed(starts):  # a truncated last box (no closing brace) yields to the one before
        end = partner.get(start - 1)
        if end is not None:
            return text[start:end]
    return None


# ``\begin{pmatrix} ... \end{pmatrix}``: the environment's name is LaTeX, not a word of prose (a
# matrix gold was taken for text and reduced to its last number)
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\s*\{[A-Za-z]+\*?\}")


def _is_math(text: str) -> bool:
    """One line, and no word of two or more letters outside LaTeX commands and ``\\text{}``."""
    text = text.strip()
    if not text or "\n" in text:
        return False
    bare = _LATEX_COMMAND.sub(" ", _TEXT_COMMAND.sub(" ", _ENVIRONMENT.sub(" ", text)))
    return re.search(r"[A-Za-z]{2,}", bare) is None


# ``1\,000`` (a thin space between digit groups, as LaTeX typesets thousands): math-verify reads it as
# ``1 \cdot 000`` = 0, so 1,000 scored 0 against 1000 and 1.0 against 0
_THIN_SPACE_THOUSANDS = re.compile(r"(?<![\d.])\d{1,3}(?:\\,\d{3})+(?![\d])")


def tidy_answer(candidate: str) -> str:
    r"""``candidate`` without what surrounds an answer: spaces, markdown bold, a final period, one pair of ``$``;
    LaTeX's thin-spaced thousands (``1\,000``) joined.

    Example:
        >>> from llmgym.envs.math.answer_extraction import tidy_answer
        >>> tidy_answer(" **$1\\,000$.** "), tidy_answer("$x$")
        ('1000', 'x')
    """
    candidate = _THIN_SPACE_THOUSANDS.sub(lambda m: m.group().replace("\\,", ""), candidate)
    candidate = candidate.strip().strip("*").strip()  # markdown bold around an answer
    candidate = candidate.rstrip(".。").strip()
    if len(candidate) > 1 and candidate[0] == candidate[-1] == "$":
        candidate = candidate.strip("$").strip()
    return candidate


def _math_spans_with_ends(text: str) -> list[tuple[str, int]]:
    """Contents of ``$$…$$``, ``$…$`` (unescaped dollars), ``\\(…\\)`` and ``\\[…\\]``, left to right.

    A scanner, linear in ``len(text)``: the closing delimiter after a position is looked up once and
    remembered (a regex with lazy ``.+?`` rescans to the end for every unclosed opener: quadratic).
    """
    spans: list[tuple[str, int]] = []  # (content, index after the closing delimiter)
    found: dict[str, tuple[int, int]] = {}  # delimiter -> (searched from, first closer at or after)

    def closer(delim: str, start: int, unescaped: bool) -> int:
        known = found.get(delim)
        if known is not None and known[0] <= start and (known[1] < 0 or known[1] >= start):
            return known[1]
        k = start
        while True:
            k = text.find(delim, k)
            if k < 0 or not unescaped or text[k - 1] != "\\":
                break
            k += 1
        found[delim] = (start, k)
        return k

    i, n = 0, len(text)
    while i < n:
        dollar, backslash = text.find("$", i), text.find("\\", i)
        j = backslash if dollar < 0 else dollar if backslash < 0 else min(dollar, backslash)
        if j < 0:
            break
        if text[j] == "$":
            if j > 0 and text[j - 1] == "\\":  # an escaped dollar
                i = j + 1
                continue
            if text.startswith("$$", j):
                k = closer("$$", j + 3, True)
                if k >= 0:
                    spans.append((text[j + 2 : k], k + 2))
                    i = k + 2
                    continue
            k = closer("$", j + 2, True)
            if k >= 0:
                spans.append((text[j + 1 : k], k + 1))
                i = k + 1
                continue
        elif text.startswith(("\\(", "\\["), j):
            k = closer("\\)" if text[j + 1] == "(" else "\\]", j + 3, False)
            if k >= 0:
                spans.append((text[j + 2 : k], k + 2))
                i = k + 2
                continue
        i = j + 1
    return spans


def math_spans(text: str) -> list[str]:
    r"""Contents of the math spans of ``text``, left to right (:func:`_math_spans_with_ends`).

    Example:
        >>> from llmgym.envs.math.answer_extraction import math_spans
        >>> math_spans(r"pay \$5, then $x+1$ and \(y\)")
        ['x+1', 'y']
    """
    return [span for span, _ in _math_spans_with_ends(text)]


def _last_number(text: str) -> str | None:
    last = None
    for last in _NUMBER.finditer(text):
        pass
    return None if last is None else with_unit(re.sub(r"[,\s]", "", last.group()), text[last.end():])


def _after_marker(text: str) -> str | None:
    markers = list(_MARKER.finditer(text))
    if not markers:
        return None
    phrase = text[markers[-1].end():].strip().split("\n", 1)[0]
    spans = _math_spans_with_ends(phrase)
    if spans:
        return with_unit(spans[0][0], phrase[spans[0][1]:]) if tidy_answer(spans[0][0]) else spans[0][0]
    phrase = _SENTENCE_END.split(phrase, 1)[0]  # "42. I hope it is correct" -> "42"
    if _is_math(phrase):
        return unit_in_words(phrase)
    number = _STANDALONE_NUMBER.search(phrase)
    return with_unit(re.sub(r"[,\s]", "", number.group()), phrase[number.end():]) if number else None


def extract_answer_and_rule(text: str) -> tuple[str | None, str | None]:
    r"""The answer a completion gives (:func:`extract_answer`) and the rule that found it (``"boxed"``,
    ``"marker"``, ``"bare"``, ``"math_span"``, ``"last_number"``, ``"short_text"``), or ``(None, None)``.

    Example:
        >>> from llmgym.envs.math.answer_extraction import extract_answer_and_rule
        >>> extract_answer_and_rule("The answer is 42."), extract_answer_and_rule("Hmm, no idea at all here.")
        (('42', 'marker'), (None, None))
    """
    # a unit in words after the answer (``5 cm``, ``$5$ cm``) is kept as ``\text{}``: it is judged, not dropped
    region = _region(text)
    boxed = last_boxed(region)
    if boxed is not None:
        return unit_in_words(tidy_answer(boxed)), "boxed"
    marked = _after_marker(region)
    if marked is not None and tidy_answer(marked):
        return tidy_answer(marked), "marker"
    whole = tidy_answer(region)
    if whole and "$" not in whole and _is_math(whole):
        return unit_in_words(whole), "bare"
    spans = [(s, end) for s, end in _math_spans_with_ends(region) if _is_math(s)]
    if spans:
        return with_unit(tidy_answer(spans[-1][0]), region[spans[-1][1]:]), "math_span"
    number = _last_number(region)
    if number is not None:
        return number, "last_number"
    if whole and "\n" not in whole and len(whole.split()) <= 3:
        return whole, "short_text"
    return None, None


def extract_answer(text: str) -> str | None:
    r"""The answer a completion gives, as LaTeX without ``$`` (rules in the module docstring), or ``None``.

    Example:
        >>> from llmgym.envs.math import extract_answer
        >>> extract_answer(r"so $x = 2$ and the result is \boxed{\frac{1}{2}}.")
        '\\frac{1}{2}'
        >>> extract_answer("<think>3 + 4 = 7</think><answer>7</answer>")
        '7'
        >>> extract_answer("Natalia sold 48/2 = 24 clips in May.\n#### 72")
        '72'
        >>> extract_answer("The answer is 42.")
        '42'
        >>> extract_answer(r"\left( 3, \frac{\pi}{2} \right)")
        '\\left( 3, \\frac{\\pi}{2} \\right)'
        >>> extract_answer("He paid $5 for pens and $3 for paper, 8 dollars in total")
        '8'
        >>> extract_answer("The rod is 5 cm long."), extract_answer("So it is 5 in total.")  # a unit in words is kept
        ('5 \\text{ cm}', '5')
        >>> extract_answer("Monday"), extract_answer("I am not sure how to solve this one.")
        ('Monday', None)
    """
    return extract_answer_and_rule(text)[0]


def normalize_gold(answer: Any) -> str:
    r"""A dataset's stored answer as LaTeX without ``$``: the rules of :func:`extract_answer`, else whole.

    Example:
        >>> from llmgym.envs.math import normalize_gold
        >>> normalize_gold("Weng earns 12/60 = $0.2 per minute... #### 10")
        '10'
        >>> normalize_gold(r"\frac{1}{2}"), normalize_gold(18), normalize_gold("Monday")
        ('\\frac{1}{2}', '18', 'Monday')
    """
    if answer is None:
        raise ValueError("the task has no reference answer (task.answer is None)")
    if isinstance(answer, bool):
        raise TypeError(f"a math gold answer must be text or a number, got {answer!r}")
    if isinstance(answer, (int, Decimal)):
        return str(answer)
    if isinstance(answer, fractions.Fraction):
        return str(answer) if answer.denominator != 1 else str(answer.numerator)
    if isinstance(answer, float):
        return repr(answer)
    if not isinstance(answer, str):
        raise TypeError(
            f"a math gold answer must be text or a number, got {type(answer).__name__}: {answer!r:.80}"
        )
    candidate, _ = extract_answer_and_rule(answer)
    return candidate if candidate is not None else tidy_answer(answer)
