r"""One spelling for what LaTeX and Unicode write many ways: text, fonts, spaces, percent words, stray letters.

An answer can say "centimeters" as ``\text{cm}``, ``\textbf{cm}``, ``\mathrm{~cm}``, ``{\rm cm}``, ``5\;cm``,
``5~cm``, ``\text{ c m}``, ``ｃｍ`` ...; math-verify drops most of them (``5 cm`` and ``5\hbox{cm}`` parse as
``5``), so any spelling the unit rule did not know answered "How long, in meters, ...?". The rule here is not
a list of spellings but a fold to one form before anything is judged (:func:`fold_answer`):

* Unicode to NFKC (``ｃｍ`` is ``cm``, ``𝑥`` is ``x``), combining marks and invisible format characters
  dropped, every kind of space a space, the Unicode signs a model writes (``−``, ``×``, ``π``, ``∞``, ...)
  as LaTeX, and any other symbol outside ASCII refused (:func:`unread_symbol`);
* every spacing command (``\,``, ``\;``, ``\ ``, ``~``, ``\quad``, ``\hspace{..}``, ``\phantom{..}``, ...)
  a space;
* every command with a braced argument that is not a math command of :data:`MATH_COMMANDS` (``\textbf``,
  ``\mathrm``, ``\hbox``, ``\operatorname``, an unknown ``\foo``) the argument as ``\text{...}``; font
  switches (``\rm cm``, ``{\bf cm}``) likewise; nested, adjacent and split text merged into one
  (``\text{c}\,\text{m}`` and ``\text{ c m}`` are ``\text{cm}``); a single letter in text that is not a unit
  symbol (``\mathrm{e}``, ``\mathrm{i}``) is that letter; an unknown command without an argument
  (``\cm``) is its name, as letters;
* percent words (``percent``, ``per cent``, ``pct``, in text or not), ``\text{%}``, ``٪``, ``％`` are the
  sign ``\%``.

Then letters outside ``\text{}`` that are not the reference's symbols (:func:`stray_letters`): at the
answer's end they are its unit (``5 cm`` is ``5 \text{ cm}``, judged like any unit); anywhere else they
are symbols the reference does not have, and the answer scores 0.

Example:
    >>> from llmgym.envs.math.answer_text import fold_answer
    >>> fold_answer(r"5 \textbf{cm}"), fold_answer(r"5\;\mathrm{c}\,\mathrm{m}"), fold_answer(r"3 \text{ per cent}")
    ('5 \\text{cm}', '5 \\text{cm}', '3 \\%')
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["MATH_COMMANDS", "fold_answer", "stray_letters", "unread_symbol"]

_FUNCTIONS = ("sin cos tan cot sec csc arcsin arccos arctan arccot arcsec arccsc sinh cosh tanh coth sech csch "
              "log ln lg exp lim sup inf max min gcd lcm det arg deg dim ker mod bmod pmod Pr hom").split()
#: LaTeX commands read as mathematics: their braced arguments are math, not text (anything else is text).
MATH_COMMANDS = frozenset(
    "frac dfrac tfrac cfrac sqrt binom dbinom tbinom choose over boxed fbox overline underline bar hat vec tilde "
    "widehat widetilde dot ddot check breve acute grave mathring overrightarrow overleftarrow overleftrightarrow "
    "mathbb mathcal mathfrak mathscr begin end left right middle big Big bigg Bigg bigl bigr Bigl Bigr biggl "
    "biggr Biggl Biggr displaystyle textstyle scriptstyle text cdot times div pm mp ast star circ bullet "
    "le leq ge geq lt gt ne neq approx equiv sim simeq cong propto leqslant geqslant ll gg "
    "in notin ni subset subseteq supset supseteq cup cap setminus emptyset varnothing infty infinity "
    "to rightarrow leftarrow Rightarrow Leftarrow leftrightarrow Leftrightarrow implies iff mapsto "
    "land lor lnot neg wedge vee oplus otimes forall exists nexists partial nabla int iint iiint oint sum prod "
    "cdots ldots dots vdots ddots colon mid nmid parallel perp angle measuredangle triangle square degree prime "
    "langle rangle lfloor rfloor lceil rceil vert lvert rvert Vert lVert rVert lbrace rbrace lbrack rbrack "
    "not quad qquad hbar ell Re Im aleph imath jmath limits nolimits top bot gets backslash hline cdotp "
    "longrightarrow Longrightarrow longleftrightarrow Longleftrightarrow uparrow downarrow "
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi omicron pi "
    "varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma "
    "Upsilon Phi Psi Omega".split()) | frozenset(_FUNCTIONS)

# --- Unicode ---------------------------------------------------------------------------------------------

#: Unicode signs a model writes, as the LaTeX they are (after NFKC).
_UNICODE_SIGNS = {
    "\u2212": "-", "\u2013": "-", "\u2012": "-", "\u00d7": r" \times ", "\u00b7": r" \cdot ", "\u22c5": r" \cdot ",
    "\u00f7": r" \div ", "\u03c0": r" \pi ", "\u221e": r" \infty ", "\u221a": r" \sqrt ", "\u2264": r" \le ",
    "\u2265": r" \ge ", "\u2260": r" \ne ", "\u222a": r" \cup ", "\u2229": r" \cap ", "\u00b0": r"^\circ ",
    "\u00b1": r" \pm ", "\u2208": r" \in ", "\u2205": r" \emptyset ", "\u066a": "%", "\u2032": "'",
    "\u00b2": "^2", "\u00b3": "^3", "\u00b9": "^1", "\u2044": "/", "\u2014": "-", "\u2248": r" \approx ",
    "\u2192": r" \to ", "\u2220": r" \angle ", "\u2261": r" \equiv ", "\u2213": r" \mp ", "\u2217": "*",
    "\u2a7d": r" \le ", "\u2a7e": r" \ge ",
}
_SUPERSCRIPTS = {"\u00b2": "^2", "\u00b3": "^3", "\u00b9": "^1"}  # before NFKC, which makes them plain digits
_DROPPED_CATEGORIES = frozenset({"Mn", "Me", "Cf", "Cc"})


def _greek(char: str) -> str | None:
    # a Greek letter as its command (θ is \theta, Δ is \Delta), where LaTeX has one
    name = unicodedata.name(char, "").split()
    if len(name) == 4 and name[:2] == ["GREEK", "SMALL"] and name[2] == "LETTER":
        command = name[3].lower()
    elif len(name) == 4 and name[:2] == ["GREEK", "CAPITAL"] and name[2] == "LETTER":
        command = name[3].capitalize()
    else:
        return None
    command = {"lamda": "lambda", "Lamda": "Lambda"}.get(command, command)
    return " \\" + command + " " if command in MATH_COMMANDS else None


def _fold_unicode(text: str) -> str:
    for sign, latex in _SUPERSCRIPTS.items():
        text = text.replace(sign, latex)
    # decomposed first, so that a combining mark is dropped rather than composed into a new letter (c + ́ is not ć)
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if unicodedata.category(c) not in _DROPPED_CATEGORIES)
    text = unicodedata.normalize("NFKC", text)
    out = []
    for char in text:
        if char.isascii():
            out.append(" " if char in "\t\n\r\f\v" else char)
        elif char in _UNICODE_SIGNS:
            out.append(_UNICODE_SIGNS[char])
        elif _greek(char):
            out.append(_greek(char))
        elif char.isspace() or unicodedata.category(char).startswith("Z"):
            out.append(" ")
        elif unicodedata.category(char) not in _DROPPED_CATEGORIES:
            out.append(char)
    return "".join(out)


def unread_symbol(text: str) -> str | None:
    r"""The first character of a folded answer that is neither ASCII nor a letter (``‰``, ``∑``), or ``None``:
    a sign the verifier does not read, which math-verify would silently drop (``3‰`` parses as ``3``).

    Example:
        >>> unread_symbol("3‰"), unread_symbol(r"3 \text{ см}")
        ('‰', None)
    """
    for char in text:
        if not char.isascii() and not char.isalpha():
            return char
    return None


# --- spacing, fonts, text ----------------------------------------------------------------------------------

_SPACE_COMMANDS = ("quad qquad enspace enskip thinspace medspace thickspace negthinspace negmedspace "
                   "negthickspace space nobreakspace hfill hfil vfill relax strut mathstrut nonumber "
                   "notag allowbreak nolinebreak linebreak newline").split()
_SPACE_WITH_ARGUMENT = ("hspace vspace phantom hphantom vphantom mspace kern mkern hskip mskip "
                        "label tag color").split()
_FONT_SWITCHES = ("rm bf it sf tt sl sc em up md cal normalfont rmfamily sffamily ttfamily bfseries mdseries "
                  "itshape upshape slshape scshape boldmath unboldmath tiny scriptsize footnotesize small "
                  "normalsize large Large LARGE huge Huge").split()

# tokens, left to right: a control symbol or word (``\\`` first, so a matrix's row break is never read as ``\ ``)
_TOKEN = re.compile(
    r"\\\\"
    r"|\\(?P<sym>[,;:!> ])"
    r"|\\(?P<arg>" + "|".join(_SPACE_WITH_ARGUMENT) + r")\*?\s*(?:\{[^{}]*\}|-?[\d.]+\s*[A-Za-z]{2})"
    r"|\\(?P<space>" + "|".join(_SPACE_COMMANDS) + r")(?![A-Za-z])"
    r"|(?P<tilde>~)"
)
_FONT_GROUP = re.compile(r"\{\s*\\(?:" + "|".join(_FONT_SWITCHES) + r")(?![A-Za-z])\s*([^{}]*)\}")
_FONT_SWITCH = re.compile(r"\\(?:" + "|".join(_FONT_SWITCHES) + r")(?![A-Za-z])\s*([^{}\\$]*)")
# a command and its braced argument, which may hold texts already folded (``\textbf{\textit{cm}}``, inside out)
_COMMAND_WITH_GROUP = re.compile(r"\\([A-Za-z]+)\s*\{((?:[^{}]|\\text\{[^{}]*\})*)\}")
# inside a text: a bare group (not a command's argument), and a command without an argument (``\%``, ``\pi``)
_GROUP_IN_TEXT = re.compile(r"(\\text\{(?:[^{}\\]|\\[^A-Za-z{}])*)\{([^{}]*)\}")
_COMMAND_IN_TEXT = re.compile(r"(\\text\{[^{}\\]*)\\(?:([A-Za-z]+)(?![A-Za-z])(?!\s*\{)|(%))\s*")
_ADJACENT_TEXT = re.compile(r"\\text\{([^{}]*)\}(\s*)\\text\{([^{}]*)\}")
_TEXT = re.compile(r"\\text\{([^{}]*)\}")
_BARE_COMMAND = re.compile(r"\\([A-Za-z]+)")
_PERCENT_WORD = re.compile(r"(?<![^\W\d_])(?<!\\)(?:per\s*cents?|percents?|pct)(?![^\W\d_])", re.IGNORECASE)
_SPACES = re.compile(r" {2,}")
_BRACE_WORD = re.compile(r"\\([lr])brace(?![A-Za-z])")


def _spacing(match: re.Match[str]) -> str:
    return match[0] if match[0] == "\\\\" else " "


def _text_command(match: re.Match[str]) -> str:
    name, argument = match[1], match[2]
    if name in MATH_COMMANDS and name != "text":
        return match[0]
    return r"\text{" + _TEXT.sub(r"\1", argument) + "}"


def _unit_symbol_letters() -> frozenset[str]:
    from llmgym.envs.math.answer_forms import UNIT_ALIASES
    return frozenset(w for w in UNIT_ALIASES if len(w) == 1)


def _tidy_text(match: re.Match[str]) -> str:
    # a text's words: spaces folded, single letters glued to their neighbours (``c m`` is ``cm``), a text that is
    # only a percent sign the sign, one that is a single letter and not a unit symbol that letter (``\mathrm{e}``)
    words = match[1].split()
    glued: list[str] = []
    for word in words:
        if glued and (len(word) == 1 or len(glued[-1]) == 1) and word.isalpha() and glued[-1].isalpha():
            glued[-1] += word
        else:
            glued.append(word)
    content = _PERCENT_WORD.sub(r"\\%", " ".join(glued))
    if content in ("%", r"\%"):
        return r"\%"
    if len(content) == 1 and content.isalpha() and content not in _unit_symbol_letters():
        return content
    lead = " " if match[1][:1].isspace() and content else ""
    return r"\text{" + lead + content + "}"


def fold_answer(text: str) -> str:
    r"""``text`` with every text, font and spacing command, Unicode variant and percent word in one form.

    Example:
        >>> from llmgym.envs.math.answer_text import fold_answer
        >>> [fold_answer(t) for t in [r"5 \hbox{cm}", r"5 {\rm cm}", r"5\mathrm{~cm}", "5\u00a0ｃｍ", r"5 \text{ c m}"]]
        ['5 \\text{cm}', '5 \\text{cm}', '5\\text{ cm}', '5 cm', '5 \\text{ cm}']
        >>> [fold_answer(t) for t in [r"3 \text{%}", "3٪", "3 pct", r"\frac{\,3}{6}", r"\mathrm{e}^{2}"]]
        ['3 \\%', '3%', '3 \\%', '\\frac{ 3}{6}', 'e^{2}']
    """
    text = _fold_unicode(text)
    text = _BRACE_WORD.sub(lambda m: "\\" + ("{" if m[1] == "l" else "}"), text)
    text = _TOKEN.sub(_spacing, text)
    text = _PERCENT_WORD.sub(r"\\%", text)
    text = _FONT_GROUP.sub(r"\\text{\1}", text)
    text = _FONT_SWITCH.sub(lambda m: r"\text{" + m[1] + "}" if m[1].strip() else " ", text)
    # inside out: an innermost command with a braced argument, a group or a command inside a text, until none is left
    # (each pass removes at least one; an answer is at most a few thousand characters)
    while True:
        folded = _COMMAND_WITH_GROUP.sub(_text_command, text)
        folded = _GROUP_IN_TEXT.sub(r"\1\2", folded)
        folded = _COMMAND_IN_TEXT.sub(lambda m: m[1] + ("%" if m[3] else m[2] + " "), folded)
        folded = _ADJACENT_TEXT.sub(lambda m: r"\text{" + m[1] + (" " if m[2] else "") + m[3] + "}", folded)
        if folded == text:
            break
        text = folded
    text = _BARE_COMMAND.sub(lambda m: m[0] if m[1] in MATH_COMMANDS else " " + m[1] + " ", text)
    text = _PERCENT_WORD.sub(r"\\%", text)  # \percent, \pct: an unknown command's name, read as its letters
    text = _TEXT.sub(_tidy_text, text)
    text = text.replace(r"\text{ \%}", r"\%")
    return _SPACES.sub(" ", text).strip()


# --- letters outside text: the reference's symbols, a unit, or neither ------------------------------------

_OUTSIDE_TEXT = re.compile(r"\\text\{[^{}]*\}|\\(?:begin|end|mathbb|mathcal|mathfrak|mathscr)\s*\{[^{}]*\}|\\[A-Za-z]+")
_LETTERS = re.compile(r"[^\W\d_]+")
_RELATION = r"(?:=|<|>|\\(?:le|leq|ge|geq|lt|gt|ne|neq|in|leqslant|geqslant)(?![A-Za-z]))"
_RELATION_BEFORE = re.compile(r"\s*" + _RELATION)
_RELATION_AFTER = re.compile(_RELATION + r"\s*$")
#: Function names written without their backslash, before their argument (``sin(x)``), and ``pi``.
_BARE_FUNCTION = re.compile(r"(?:" + "|".join(_FUNCTIONS[:13] + ["sqrt"]) + r")(?=\s*[({\\^_\dA-Za-z])|pi")
_TRAILING = re.compile(r"(?:[\s{}^/.]|\d|\\text\{[^{}]*\}|[^\W\d_])*$")
_POWER = re.compile(r"\^\s*\{?\s*([23])\s*\}?")


def _masked(text: str) -> str:
    # text and commands replaced by blanks of their length: what is left outside them keeps its positions
    return _OUTSIDE_TEXT.sub(lambda m: " " * len(m[0]), text)


def _symbols(text: str) -> set[str]:
    return {char for run in _LETTERS.findall(_masked(text)) for char in run}


def stray_letters(predicted: str, gold: str) -> tuple[str, str | None]:
    r"""``(predicted, None)`` with the letters at its end that are not the reference's symbols as its unit in
    ``\text{}``, or ``(predicted, why)`` when such letters are elsewhere (both folded by :func:`fold_answer`).

    The reference's symbols are its letters outside ``\text{}``; a letter before or after a relation (``x = 3``,
    ``-2 < x < 2``) names a variable; ``pi`` and a function name before its argument (``sin(x)``) are math.
    Applies where the reference is mathematical (a digit or a command outside its text); a reference of words
    sets nothing.

    Example:
        >>> stray_letters("5 cm", "5"), stray_letters("x = 3", "3"), stray_letters("2y + 1", "2x + 1")[1]
        (('5 \\text{ cm}', None), ('x = 3', None), 'the answer has symbols (y) the reference does not: a unit goes after the number')
    """
    outside = _masked(gold)
    if not re.search(r"\d", outside) and "\\" not in gold.replace(r"\text", ""):
        return predicted, None
    allowed = _symbols(gold)
    masked = _masked(predicted)
    for function in _BARE_FUNCTION.finditer(masked):
        masked = masked[: function.start()] + " " * len(function[0]) + masked[function.end():]
    for run in _LETTERS.finditer(masked):
        if set(run[0]) <= allowed:
            continue
        if len(run[0]) == 1 and (_RELATION_BEFORE.match(predicted, run.end())
                                 or _RELATION_AFTER.search(predicted, 0, run.start())):
            continue  # x = 3, 2 < x: a variable named by the answer
        if not _TRAILING.fullmatch(predicted, run.start()):
            strays = sorted({c for r in _LETTERS.findall(masked) for c in r} - allowed)
            return predicted, f"the answer has symbols ({''.join(strays)}) the reference does not: a unit goes after the number"
        head, tail = predicted[: run.start()], predicted[run.start():]
        power = _POWER.search(tail)
        words = _TEXT.sub(r" \1 ", _POWER.sub(" ", tail)).replace("{", " ").replace("}", " ")
        if re.search(r"\d", words):
            return predicted, "the answer has a number after its unit"
        unit = _TEXT.sub(_tidy_text, r"\text{ " + " ".join(words.split()) + "}")
        if not unit.startswith(r"\text"):
            return predicted, f"the answer has a symbol ({unit}) the reference does not"
        return head.rstrip() + " " + unit + (f"^{power[1]}" if power else ""), None
    return predicted, None
