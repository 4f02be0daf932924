r"""What a math question asks of its answer's form, and the units prose may name after a number.

Read from the question's text alone (a linear scan of its first :data:`DEFAULT_PROMPT_SCAN_CHARS`
characters): the forms it asks for (:func:`required_forms`, over :data:`FORM_PHRASES`), whether it asks for
or allows a decimal (:func:`asks_for_decimal`) or a percent (:func:`asks_for_percent`). And the unit
vocabulary (:data:`UNIT_ALIASES`): a unit in words right after an answer (``5 cm``, "5 square meters") is
kept with it as ``\text{}`` (:func:`with_unit`, :func:`unit_in_words`), so that it is judged, not dropped.
:class:`~llmgym.envs.math.math_verifier.MathVerifier` holds an answer to these forms and units.

Example:
    >>> from llmgym.envs.math.answer_forms import asks_for_decimal, required_forms, unit_in_words
    >>> required_forms("Express $0.5$ as a common fraction."), asks_for_decimal("Round to the nearest tenth.")
    (('lowest_terms',), True)
    >>> unit_in_words("5 cm")
    '5 \\text{ cm}'
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_PROMPT_SCAN_CHARS", "FORM_PHRASES", "UNIT_ALIASES", "asks_for_decimal", "asks_for_percent",
           "required_forms", "unit_in_words", "with_unit"]

#: Characters of a prompt searched for the question's expressions (prompts are trusted, but bounded anyway).
DEFAULT_PROMPT_SCAN_CHARS = 65_536


#: Phrases of a question that ask for the answer's form, and the form each asks for (checked in the sandbox,
#: on the answer as written: :func:`llmgym.envs.math.scorer_pools.math_verify_equal`).
FORM_PHRASES = (
    ("simplest radical form", "radical"),
    ("interval notation", "interval"),
    ("lowest terms", "lowest_terms"),
    ("common fraction", "lowest_terms"),
    ("reduced fraction", "lowest_terms"),
    ("simplest form", "lowest_terms"),
    ("as a decimal", "decimal"),
    ("in decimal form", "decimal"),
    ("scientific notation", "scientific"),
)

#: Abbreviations of common units, to their names (a question says "centimeters", an answer ``\text{cm}``).
UNIT_ALIASES = {
    "mm": "millimeter", "cm": "centimeter", "m": "meter", "km": "kilometer", "in": "inch", "ft": "foot",
    "feet": "foot", "yd": "yard", "mi": "mile", "mg": "milligram", "g": "gram", "kg": "kilogram", "s": "second",
    "sec": "second", "min": "minute", "h": "hour", "hr": "hour", "ml": "milliliter", "l": "liter", "lb": "pound",
    "lbs": "pound", "oz": "ounce", "metre": "meter", "litre": "liter", "mph": "mile per hour", "sq": "square",
    "deg": "degree", "cents": "cent", "inches": "inch", "cu": "cubic", "millimetre": "millimeter",
    "centimetre": "centimeter", "kilometre": "kilometer", "millilitre": "milliliter",
}
#: Words that qualify a unit (``square meters``, ``miles per hour``) but are none alone.
_UNIT_MODIFIERS = frozenset({"square", "cubic", "per", "sq", "cu"})
#: The unit names a word after a number in prose may be: the table's, abbreviations and names, less a single
#: letter (in prose and math alike a symbol: ``5 m`` may be five times m) and the modifiers.
_PROSE_UNIT_NAMES = sorted(
    ({w for name in UNIT_ALIASES.values() for w in name.split()} | set(UNIT_ALIASES)) - _UNIT_MODIFIERS
    - {w for w in UNIT_ALIASES if len(w) == 1}, key=len, reverse=True)
_PROSE_UNIT_NAME = "(?:" + "|".join(re.escape(w) + ("(?:e?s)?" if len(w) > 2 else "") for w in _PROSE_UNIT_NAMES) + r")\b"
_PROSE_UNIT = re.compile(
    r"[ \t]*((?:(?:square|cubic|sq|cu)\.?[ \t]+)?" + _PROSE_UNIT_NAME + r"(?:[ \t]*\^[ \t]*\{?[23]\}?)?"
    r"(?:[ \t]+per[ \t]+" + _PROSE_UNIT_NAME + r")?)", re.IGNORECASE)
_PHRASE_END = re.compile(r"[ \t]*(?:[.,;:!?)\]]|\n|$)")
_PROSE_POWER = re.compile(r"[ \t]*\^[ \t]*\{?([23])\}?")


_PROSE_PERCENT = re.compile(r"[ \t]*(?:\\?%|\u066a|\uff05|(?:per[ \t]*cents?|percents?|pct)\b)", re.IGNORECASE)


def with_unit(answer: str, after: str) -> str:
    r"""``answer`` with the unit that follows it in prose, if any, as ``\text{}`` (so it is judged like one).

    A unit is a word of :data:`UNIT_ALIASES` (an abbreviation of two letters or more, or a unit's name, plural
    allowed; ``square``, ``cubic`` and ``per`` join one), right after the answer; "in" is the preposition
    unless the phrase ends with it.

    Example:
        >>> from llmgym.envs.math.answer_forms import with_unit
        >>> with_unit("5", " cm long"), with_unit("5", " in total"), with_unit("5", " in."), with_unit("12", " apples")
        ('5 \\text{ cm}', '5', '5 \\text{ in}', '12')
    """
    if _PROSE_PERCENT.match(after):  # "3 percent", "3%": the sign, kept (a dropped sign paid where 3\% is refused)
        return answer + r" \%"
    match = _PROSE_UNIT.match(after)
    if match is None or (match[1].lower() == "in" and not _PHRASE_END.match(after, match.end())):
        return answer
    unit, power = match[1], _PROSE_POWER.search(match[1])
    if power:  # cm^2: a square centimeter
        unit = ("square " if power[1] == "2" else "cubic ") + _PROSE_POWER.sub("", unit)
    return answer + r" \text{ " + " ".join(unit.split()) + "}"


_NUMBER_THEN_WORDS = re.compile(r"\s*(-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+)(\s+[A-Za-z][^\\{}$]*)")


def unit_in_words(answer: str) -> str:
    r"""A number then a unit in plain words (``\boxed{5 cm}``, "Answer: 5 cm") as the number and a ``\text{}`` unit;
    anything else unchanged.

    Example:
        >>> from llmgym.envs.math.answer_forms import unit_in_words
        >>> unit_in_words("5 cm"), unit_in_words("12 apples"), unit_in_words(r"\frac{1}{2}")
        ('5 \\text{ cm}', '12 apples', '\\frac{1}{2}')
    """
    match = _NUMBER_THEN_WORDS.fullmatch(answer)
    if match is None:
        return answer
    unit = with_unit(match[1], match[2])
    return unit if unit != match[1] and _PROSE_UNIT.fullmatch(match[2].rstrip()) else answer


_DECIMAL_PRECISION = "(?:" + "|".join(
    ["whole", "integer", "tenths?", "hundredths?", "thousandths?", "millionths?", "ten", "hundred", "thousand",
     "million", "billion", "half", "quarter", "percent", "cents?", "dollars?", "degrees?", "units?", "square",
     "cubic"] + [re.escape(w) + "(?:e?s)?" for w in _PROSE_UNIT_NAMES]) + r")\b"
#: Phrases of a question that ask for (or allow) a decimal: only then may a decimal answer an exact reference.
_ASKS_FOR_DECIMAL = re.compile(
    r"\bas\s+an?\s+(?:\w+\s+)?decimal\b|\bin\s+decimal\s+form|\bdecimal\s+(?:places?|approximation|answer|number|value)"
    r"|\bto\s+\S+\s+places\b|\bnearest\s+" + _DECIMAL_PRECISION + r"|\brounded\s+(?:off\s+)?to\b"
    r"|\bround(?:ed|ing)?\s+(?:off|up|down)\b|\bapproximat|\bestimat|\bsignificant\s+(?:figure|digit)",
    re.IGNORECASE)


def asks_for_decimal(prompt: str) -> bool:
    r"""Whether ``prompt`` asks for (or allows) a decimal answer: "as a decimal", "decimal places", "to the nearest
    tenth" (a precision or a unit after "nearest": not "the nearest vertex"), "rounded to", "approximately",
    "significant figures", "estimate". Rounding is asked for by its precision, so "a round table" is not.

    Example:
        >>> asks_for_decimal("Round $\pi$ to the nearest hundredth."), asks_for_decimal("Express $2/3$ as a fraction.")
        (True, False)
        >>> asks_for_decimal("How far is $P$ from the nearest vertex of a round table?")
        False
    """
    return _ASKS_FOR_DECIMAL.search(prompt[:DEFAULT_PROMPT_SCAN_CHARS]) is not None



_PERCENT_WORD = re.compile(r"\bper\s?cent(?:age)?s?\b", re.IGNORECASE)
#: What ends the text before a percent word that is a quantity ("20 percent of 50", "$x$ percent", "twenty
#: percent"), not a request.
_PERCENT_QUANTITY = re.compile(
    r"(?:\d|\$|\}|\)|\b(?:zero|one|two|three|four|five|six|seven|eight|nine|ten|eleven|twelve|thirteen|fourteen|"
    r"fifteen|sixteen|seventeen|eighteen|nineteen|twenty|thirty|forty|fifty|sixty|seventy|eighty|ninety|hundred|"
    r"thousand|half))[\s~-]*\Z", re.IGNORECASE)


def asks_for_percent(prompt: str) -> bool:
    r"""Whether ``prompt`` asks for its answer in percent: a "percent" or "percentage" that is not a quantity of
    the question, i.e. not right after a number ("What percent of 50 is 10?", "as a percentage", "in percent",
    "the percent increase" ask; "What is 20 percent of 50?" does not).

    Example:
        >>> asks_for_percent("What percent of $50$ is $10$?"), asks_for_percent("What is 20 percent of $50$?")
        (True, False)
    """
    prompt = prompt[:DEFAULT_PROMPT_SCAN_CHARS]
    return any(_PERCENT_QUANTITY.search(prompt, max(0, m.start() - 24), m.start()) is None
               for m in _PERCENT_WORD.finditer(prompt))



def required_forms(prompt: str) -> tuple[str, ...]:
    r"""The forms ``prompt`` asks its answer to be written in (:data:`FORM_PHRASES`; a linear scan).

    Example:
        >>> required_forms("Express $0.\overline{3}$ as a common fraction in lowest terms.")
        ('lowest_terms',)
        >>> required_forms("Write $\sqrt{12}$ in simplest radical form."), required_forms("What is 2+2?")
        (('radical',), ())
    """
    text = prompt[:DEFAULT_PROMPT_SCAN_CHARS].lower()
    return tuple(dict.fromkeys(form for phrase, form in FORM_PHRASES if phrase in text))

