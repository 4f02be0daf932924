"""math-verify's parse and comparison, as the sandboxed worker that runs them (in the sandbox only).

:mod:`llmgym.envs.math.scorer_pools` hands this file's text to a :class:`~llmgym.sandbox.worker.SandboxWorker`:
the sandbox's zygote runs it once (``setup`` imports math-verify and warms SymPy), parses each gold answer
in ``prepare`` (trusted data) and forks a child per check for ``handle`` (model text). math-verify's own
signal-based time-out is off: the sandbox kills the check. Importing it on the host runs nothing but
these definitions; it imports nothing of ``llmgym`` (the sandbox does not have it).
"""

import logging
import math

__all__ = ["MAX_NUMBER_BITS", "GOLD_PARSE_SECONDS", "GOLD_UNUSABLE", "FORMS", "setup", "prepare", "handle"]

#: Numbers beyond this many bits are refused before math-verify compares them: SymPy would compute
#: 9^{9^{9}} (~1.2e9 bits) exactly, in C, for minutes. 2^20 bits (~315,000 digits) is far beyond
#: any real answer and still quick to handle.
MAX_NUMBER_BITS = 1 << 20
#: A gold answer gets at least this long to parse (it is trusted, and one that fails makes the step
#: raise: a check's short time limit on a loaded machine must not stop a run).
GOLD_PARSE_SECONDS = 20.0
#: The start of prepare()'s error that means the task's gold answer, not a check, failed.
GOLD_UNUSABLE = "gold answer unusable: "
mv = None
_golds = {}

class _DropDisabledTimeoutWarning(logging.Filter):
    def filter(self, record):  # parsing_timeout=None is on purpose: the sandbox enforces the limit
        return not record.getMessage().startswith("Timeout is disabled")

def setup():
    global mv
    import math_verify
    mv = math_verify
    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropDisabledTimeoutWarning())
    # Import SymPy's lazy parts (simplification, sets, relations, ...) here, once, in the zygote:
    # each check's child would otherwise import them again.
    for gold, predicted in (("1", "2"), ("x^2 + 2x + 1", "(x+1)^2"), ("\\sqrt{2}", "2^{1/2}"),
                            ("\\frac{1}{3}", "0.333333"), ("\\{1, 2\\}", "(1, 2)"), ("[0, 1)", "(0, 1]"),
                            ("x = 3", "3"), ("10\\%", "0.1"), ("\\sin(x)^2 + \\cos(x)^2", "1"),
                            ("\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "\\pi"), ("x < 2", "(-\\infty, 2)")):
        mv.verify(_parse(gold), _parse(predicted), timeout_seconds=None)
    _form_verdict("\\frac{1}{2}", "\\frac{2\\sqrt{3}}{4}", ["3/6", "y = 2^3 \\cdot 3"], sorted(FORMS))
    _form_verdict("\\frac{\\pi}{2}", "\\binom{8}{4} + \\left|1\\right|", [], ["exact", "normal", "scientific"])

def _parse(candidate):
    parsed = mv.parse("$" + candidate + "$", parsing_timeout=None)
    if not parsed:
        parsed = mv.parse(candidate, parsing_timeout=None)
    return list(parsed)

def _log2_size(expr):
    # an upper bound on log2 of the magnitude of expr's numbers (inf when astronomical)
    if getattr(expr, "is_Integer", False):
        return float(abs(int(expr)).bit_length())
    if getattr(expr, "is_Rational", False):
        return float(max(abs(int(expr.p)).bit_length(), int(expr.q).bit_length()))
    if getattr(expr, "is_Float", False):
        value = abs(float(expr))
        return math.log2(value + 1.0) if math.isfinite(value) else math.inf
    args = getattr(expr, "args", ())
    if not args:
        return 0.0
    name = type(expr).__name__
    if getattr(expr, "is_Pow", False):
        base, exponent = _log2_size(args[0]), _log2_size(args[1])
        if base == 0.0:
            return 0.0
        return math.inf if exponent > 60 else base * 2.0 ** exponent
    if name in ("factorial", "factorial2", "subfactorial", "binomial", "gamma", "RisingFactorial", "FallingFactorial"):
        n_bits = max(_log2_size(a) for a in args)
        return math.inf if n_bits > 60 else 2.0 ** n_bits * n_bits
    return sum(_log2_size(a) for a in args)

def _too_large(parsed):
    return any(not isinstance(p, str) and _log2_size(p) > MAX_NUMBER_BITS for p in parsed)

def _parse_gold(gold, limit):
    # In a throw-away fork of the zygote, killed at the limit: a gold SymPy takes forever to parse must
    # not hang the zygote. Trusted data only (the dataset's answer), so its pickle may come back.
    import os, pickle, select, time
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        try:
            parsed = _parse(gold)
            out = (parsed, None if parsed else "the gold answer %r could not be parsed" % gold)
        except Exception as e:
            out = ([], "the gold answer %r could not be parsed (%s)" % (gold, type(e).__name__))
        data = memoryview(pickle.dumps(out))
        while data:
            data = data[os.write(write, data):]
        os._exit(0)
    os.close(write)
    buf, deadline = b"", time.monotonic() + limit
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([read], [], [], left)[0]:
            buf = None
            break
        chunk = os.read(read, 1 << 16)
        if not chunk:
            break
        buf += chunk
    os.close(read)
    if buf is None:
        os.kill(pid, 9)
    os.waitpid(pid, 0)
    if buf is None:
        return None
    return pickle.loads(buf)

def prepare(context):  # in the zygote, on trusted data: the gold answer, parsed once
    gold, settings, limit = context
    if gold not in _golds:
        # trusted data, and a gold that fails makes the step raise: a loaded machine gets time
        parsed = _parse_gold(gold, max(limit, GOLD_PARSE_SECONDS))
        if parsed is None:  # not cached: a loaded machine may do it next time
            raise ValueError(GOLD_UNUSABLE + "parsing the gold answer took longer than %s s" % max(limit, GOLD_PARSE_SECONDS))
        if len(_golds) >= 4096:
            _golds.clear()
        _golds[gold] = parsed
    gold_parsed, error = _golds[gold]
    if error is not None:  # raised here, in the trusted zygote: a check's child could forge anything it sends
        raise ValueError(GOLD_UNUSABLE + error)
    return gold_parsed, gold, settings

# -- the answer as written: echoes, required forms, and the reference's own form ----------------------------
# math-verify compares values: "What is 3/6 in lowest terms?" answered 6/12 (or the question's own 3/6
# spelled \frac{\,3}{6}) is equal to the reference. What was *written* is read here with math-verify's own
# LaTeX normaliser and parser (latex2sympy2_extended), SymPy's evaluation switched off, and fractions
# of two integers kept as written (the parser would reduce them).
_AS_WRITTEN = None
_WRAPPERS = None

def _as_written_parser():
    global _AS_WRITTEN, _WRAPPERS
    if _AS_WRITTEN is None:
        import re, sympy
        from latex2sympy2_extended.latex2sympy2 import _Latex2Sympy
        from latex2sympy2_extended.math_normalization import NormalizationConfig, normalize_latex

        class AsWritten(_Latex2Sympy):
            def _kept(self, out, top, bottom):
                if isinstance(out, sympy.Rational):  # two integers, reduced by the parser: as written instead
                    return sympy.Mul(top, sympy.Pow(bottom, -1, evaluate=False), evaluate=False)
                return out

            def convert_frac(self, frac):
                out = super().convert_frac(frac)
                if isinstance(out, sympy.Rational) and frac.upper is not None and frac.lower is not None:
                    return self._kept(out, self.convert_expr(frac.upper), self.convert_expr(frac.lower))
                return out

            def convert_interval(self, expr):
                # a pair the parser reads as an interval that is empty -- (3, \\frac{\\pi}{2}), (2, 1) -- is a point
                # (the parser's own intent, missed where its comparison stays unevaluated): its entries are kept
                out = super().convert_interval(expr)
                if out == sympy.S.EmptySet:
                    return sympy.Tuple(self.convert_expr(expr.expr()[0]), self.convert_expr(expr.expr()[1]))
                return out

            def convert_matrix(self, matrix):
                # immutable, so a Basic whose entries are read like any tree (a mutable Matrix is not one)
                out = super().convert_matrix(matrix)
                return sympy.ImmutableMatrix(out) if isinstance(out, sympy.MatrixBase) else out

            def convert_mp(self, mp):
                out = super().convert_mp(mp)
                if isinstance(out, sympy.Rational) and (mp.DIV() or mp.CMD_DIV() or mp.COLON()):
                    left, right = (mp.mp(0), mp.mp(1)) if hasattr(mp, "mp") else (mp.mp_nofunc(0), mp.mp_nofunc(1))
                    return self._kept(out, self.convert_mp(left), self.convert_mp(right))
                return out

        config = NormalizationConfig(basic_latex=True, units=True, malformed_operators=True, nits=False,
                                     boxed="all", equations=False)  # nits would rewrite 0.5 as \frac{1}{2}
        wrappers = re.compile(r"\\(?:text|textrm|textnormal|mathrm|mathbf|textbf|mbox)\s*(?=\{)")

        def parse(text):
            with sympy.evaluate(False):
                return AsWritten().parse(normalize_latex(wrappers.sub("", text), config))
        _AS_WRITTEN = parse
    return _AS_WRITTEN

def _written(text):
    try:
        tree = _as_written_parser()(text)
    except Exception:
        return None
    return tree if hasattr(tree, "func") else None

def _factors(tree):
    import sympy
    out = []
    for f in sympy.Mul.make_args(tree):
        out += _factors(f) if f.is_Mul and f is not tree else [f]
    return out

def _int_fraction(tree):
    # (p, q, written as a fraction) of an integer or a fraction of integers as written, sign allowed
    import sympy
    if tree.is_Integer:
        return int(tree), 1, False
    if isinstance(tree, sympy.Rational):
        return int(tree.p), int(tree.q), True
    if not tree.is_Mul:
        return None
    nums, dens = [], []
    for f in _factors(tree):
        if f.is_Integer:
            nums.append(int(f))
        elif f.is_Pow and f.exp == -1 and f.base.is_Integer:
            dens.append(int(f.base))
        else:
            return None
    if nums[:1] == [-1] and len(nums) > 1:
        sign, nums = -1, nums[1:]
    else:
        sign = 1
    if len(nums) != 1 or len(dens) != 1:  # a product or a mixed number is not a fraction written out
        return None
    if sign < 0 and nums[0] < 0:  # two minus signs are not a fraction written out either
        return None
    return sign * nums[0], dens[0], True

def _in_lowest_terms(tree):
    parts = _int_fraction(tree)
    if parts is None:
        return False
    p, q, fraction = parts
    return not fraction or (q > 1 and math.gcd(abs(p), q) == 1)

def _is_decimal(tree):
    import sympy
    core = [f for f in _factors(tree) if f != -1] if tree.is_Mul else [tree]
    return len(core) == 1 and (core[0].is_Float or core[0].is_Integer)

def _content(tree):
    # the gcd of the integer coefficients of a sum (1 for anything else)
    import sympy
    if tree.is_Integer:
        return abs(int(tree))
    if tree.is_Add:
        g = 0
        for term in tree.args:
            g = math.gcd(g, _content(term))
        return g
    if tree.is_Mul:
        c = 1
        for f in _factors(tree):
            if f.is_Integer:
                c *= abs(int(f))
        return c
    return 1

def _roots(term):
    # the roots (x^{1/q}) among a product's factors, as (radicand, index) pairs
    return sorted((str(f.base), int(f.exp.q)) for f in _factors(term)
                  if f.is_Pow and f.exp.is_Rational and not f.exp.is_Integer)

def _in_simplest_radical_form(tree):
    import sympy
    from sympy import preorder_traversal
    tree = _canon(tree)  # 12^{1/2}, \sqrt[4]{144}: roots written as exponents are roots too
    for node in preorder_traversal(tree):
        if node.is_Float:
            return False
        if node.is_Mul:  # one root per index in a product: \sqrt{2}\sqrt{6} is \sqrt{12}
            indices = [q for _, q in _roots(node)]
            if len(indices) != len(set(indices)):
                return False
        if node.is_Add:  # like terms combined: \sqrt{3} + \sqrt{3} is 2\sqrt{3}
            kinds = [tuple(_roots(term)) for term in node.args]
            if len(kinds) != len(set(kinds)):
                return False
        if not node.is_Pow:
            continue
        exp = node.exp
        if exp.is_Rational and not exp.is_Integer:  # a root: an integer radicand with no power of the root's index
            if exp < 0 or exp.p != 1 or not node.base.is_Integer or not 0 < node.base < 10 ** 18:
                return False  # 2^{3/2} is 2\sqrt{2}
            if any(k >= exp.q for k in sympy.factorint(int(node.base)).values()):
                return False
        elif exp.is_negative and any(n.is_Pow and n.exp.is_Rational and not n.exp.is_Integer
                                     for n in preorder_traversal(node.base)):
            return False  # a radical in a denominator
    dens = [f for f in _factors(tree) if f.is_Pow and f.exp == -1]
    if len(dens) > 1 or (dens and not dens[0].base.is_Integer):
        return False
    if dens:  # the numeric part reduced: no common factor of the numerator's coefficients and the denominator
        numerator = [f for f in _factors(tree) if f not in dens]
        return math.gcd(_content(sympy.Mul(*numerator, evaluate=False)) if numerator else 1, int(dens[0].base)) == 1
    return True

def _numeric_exponent(exp):
    # an exponent written with numbers, + - * and division only (1/2, 0.5, 10.0, \frac{1}{2}), as one Rational
    import sympy
    from sympy import preorder_traversal
    nodes = list(preorder_traversal(exp))
    if len(nodes) > 50 or not all(n.is_Add or n.is_Mul or n.is_Integer or n.is_Rational or n.is_Float
                                  or (n.is_Pow and n.exp == -1 and n.base.is_Integer and n.base != 0)
                                  for n in nodes):
        return None
    if any(n.is_Integer and abs(int(n)) > 10 ** 6 for n in nodes):
        return None
    with sympy.evaluate(True):
        value = sympy.nsimplify(exp.doit(), rational=True)
    return value if value.is_Rational else None

def _canonical(tree):
    # the tree as written, less what does nothing: * 1, + 0, ^1, / 1, two minus signs, 2.0 for 2, a nested
    # product or sum; a numeric exponent as one Rational (16^{1/2}, 16^{0.5}, \sqrt[2]{16} are \sqrt{16})
    import sympy
    if not tree.args:
        if tree.is_Float and float(tree).is_integer():
            return sympy.Integer(int(tree))
        return tree
    args = [_canonical(a) for a in tree.args]
    if tree.is_Mul:
        flat = []
        for a in args:
            flat += list(a.args) if a.is_Mul else [a]
        if any(a == 0 for a in flat):
            return sympy.S.Zero
        negative = sum(1 for a in flat if a == -1) % 2
        flat = [a for a in flat if a != 1 and a != -1] + ([sympy.S.NegativeOne] if negative else [])
        if not flat:
            return sympy.S.One
        return flat[0] if len(flat) == 1 else sympy.Mul(*flat, evaluate=False)
    if tree.is_Add:
        flat = []
        for a in args:
            flat += list(a.args) if a.is_Add else [a]
        flat = [a for a in flat if a != 0]
        if not flat:
            return sympy.S.Zero
        return flat[0] if len(flat) == 1 else sympy.Add(*flat, evaluate=False)
    if tree.is_Pow:
        base, exp = args
        if exp.is_number and not exp.is_Rational:
            exp = _numeric_exponent(exp) or exp
        if exp == 1:
            return base
        if base == 1:
            return sympy.S.One
        return sympy.Pow(base, exp, evaluate=False)
    try:
        return tree.func(*args, evaluate=False)
    except TypeError:
        return tree.func(*args)

def _canon(tree):
    # _canonical where SymPy can rebuild the tree (a matrix or an odd set may not): else the tree as written
    import sympy
    try:
        with sympy.evaluate(False):
            return _canonical(tree)
    except Exception:
        return tree

def _is_exact(tree):
    # no decimal that is not an integer: 0.666667 is not 2/3, 12.566371 not 4\pi (2.0 is 2)
    from sympy import preorder_traversal
    return not any(n.is_Float and not float(n).is_integer() for n in preorder_traversal(tree))

def _entries(tree):
    # the entries of a tuple, a matrix (row by row) or an interval's ends, in order; None for anything else
    import sympy
    if isinstance(tree, sympy.Tuple):
        return list(tree.args)
    if isinstance(tree, sympy.MatrixBase):
        return [sympy.Integer(n) for n in tree.shape] + list(tree)
    if isinstance(tree, sympy.Interval):
        return [tree.start, tree.end, tree.left_open, tree.right_open]
    return None

def _decimals_are_exact(reference, tree):
    # the answer's decimals read as the exact numbers they write (0.5 is 1/2, 0.666667 is 666667/10^6): is the
    # answer then exactly the reference's value? (0.5 for 1/2 is; 0.666667 for 2/3 and 12.566371 for 4\pi are not)
    import sympy
    from sympy import preorder_traversal
    if reference == tree:
        return True
    if reference.free_symbols or tree.free_symbols:
        return False
    entries = _entries(reference), _entries(tree)
    if entries != (None, None):  # a tuple, matrix or interval: entry by entry, in order
        return (None not in entries and len(entries[0]) == len(entries[1])
                and all(_decimals_are_exact(r, t) for r, t in zip(*entries)))
    try:
        exact = tree.xreplace({n: sympy.Rational(repr(float(n))) for n in preorder_traversal(tree) if n.is_Float})
        with sympy.evaluate(True):
            difference = sympy.N(_evaluated(reference) - _evaluated(exact), 60)
        return difference.is_number and abs(difference) < sympy.Rational(1, 10 ** 50)
    except Exception:
        return False

def _sig(tree):
    # the tree as written, up to spelling: a sum's terms and a product's factors flattened and sorted,
    # factors 1 dropped, a negative integer as -1 times its size, an evaluated fraction p/q as p \cdot q^{-1}
    # (how a fraction is written), -oo as -1 \cdot oo; a set's elements sorted
    import sympy
    if tree.is_Integer:
        n = int(tree)
        return ("int", n) if n >= -1 else ("Mul",) + tuple(sorted([("int", -1), ("int", -n)]))
    if tree.is_Rational:
        p, q = int(tree.p), int(tree.q)
        return _sig(sympy.Mul(p, sympy.Pow(q, -1, evaluate=False), evaluate=False))
    if tree == sympy.S.NegativeInfinity:
        return ("Mul",) + tuple(sorted([("int", -1), ("atom", "oo")]))
    if tree.is_Float:
        return ("float", str(tree))
    if tree == sympy.E or tree == sympy.exp(1, evaluate=False):
        return ("atom", "E")
    if isinstance(tree, sympy.log) and len(tree.args) == 2:  # \log_b a, \ln a (log(a, E)), \log a (base 10)
        a, b = tree.args
        if b == sympy.E or b == sympy.exp(1, evaluate=False):
            return ("log", _sig(a))
        return _sig(sympy.Mul(sympy.log(a, evaluate=False), sympy.Pow(sympy.log(b, evaluate=False), -1, evaluate=False),
                              evaluate=False))
    if not tree.args:
        return ("atom", sympy.srepr(tree))
    if tree.is_Mul or tree.is_Add:
        kind = "Mul" if tree.is_Mul else "Add"
        parts = []
        for arg in tree.args:
            s = _sig(arg)
            parts += list(s[1:]) if s[0] == kind else [s]
        if kind == "Mul":
            parts = [s for s in parts if s != ("int", 1)]
        if not parts:
            return ("int", 1)
        return parts[0] if len(parts) == 1 else (kind,) + tuple(sorted(parts, key=repr))
    args = [_sig(a) for a in tree.args]
    if isinstance(tree, sympy.FiniteSet):
        args = sorted(args, key=repr)
    return (type(tree).__name__,) + tuple(args)

def _evaluated(tree):
    # what SymPy makes of the tree when it evaluates (a coefficient is not multiplied into a sum: 2(1+\sqrt{3})
    # stays as written)
    import sympy
    from sympy.core.parameters import distribute
    with sympy.evaluate(True), distribute(False):
        return tree.doit()

def _is_normal(tree):
    # written out: the tree is what SymPy's evaluation makes of it, up to spelling -- 70, \frac{2}{3}, 2\sqrt{3},
    # \frac{\pi}{2}, 2x + 2, 2(x + 1), (x+1)^2 are; \binom{8}{4}, 70 + 1 - 1, |70|, \lfloor 70 \rfloor, 70 \cdot 10^{0},
    # \sqrt{16}, \sqrt{12}, \frac{12}{18}, 2^{10}, 3\%, (x+1)^2 + x - x, \frac{6x}{4} are not (each evaluates to another tree)
    import sympy
    if not isinstance(tree, sympy.Basic):
        return False
    try:
        return _sig(_evaluated(tree)) == _sig(tree)
    except Exception:
        return False

def _is_scientific(tree):
    # a \times 10^{n} with 1 <= |a| < 10 and an integer n, or 10^{n}
    import sympy
    factors = [f for f in _factors(tree) if f != 1]
    powers = [f for f in factors if f.is_Pow and f.base == 10 and f.exp.is_Integer]
    if len(powers) != 1:
        return False
    rest = [f for f in factors if f is not powers[0]]
    if not rest:
        return True
    if rest[:1] == [-1] or rest[:1] == [sympy.S.NegativeOne]:
        rest = rest[1:]
    return len(rest) == 1 and (rest[0].is_Float or rest[0].is_Integer) and 1 <= abs(float(rest[0])) < 10

def _is_interval(tree):
    import sympy
    return isinstance(tree, (sympy.Interval, sympy.Union)) or tree in (sympy.S.Reals, sympy.S.EmptySet)

FORMS = {"lowest_terms": (_in_lowest_terms, "a fraction in lowest terms (or an integer)"),
         "decimal": (_is_decimal, "a decimal number"),
         "radical": (_in_simplest_radical_form, "simplest radical form"),
         "interval": (_is_interval, "interval notation"),
         "scientific": (_is_scientific, "scientific notation"),
         "exact": (_is_exact, "an exact value (the reference is exact; a decimal is an approximation)"),
         "normal": (_is_normal, "a value written out (the reference is; this answer still evaluates to another form)")}

#: Forms the reference's own writing sets (the question need not ask): the reason an answer that breaks one scores 0.
_REFERENCE_RULES = {
    "exact": "the reference is exact and the question asks for no decimal: this decimal is an approximation",
    "normal": "the reference is written out; the answer is not (it still evaluates to another form)",
}

def _holds(check, tree):
    # a form holds for a tree, or for each entry of a tuple or matrix, or each end of an interval (\frac{2}{4} in
    # (\frac{2}{4}, 3) is not in lowest terms)
    import sympy
    if check(tree):
        return True
    parts = (list(tree.args) if isinstance(tree, sympy.Tuple) else list(tree) if isinstance(tree, sympy.MatrixBase)
             else [tree.start, tree.end] if isinstance(tree, sympy.Interval) else [])
    return bool(parts) and all(_holds(check, part) for part in parts)

def _form_verdict(gold, predicted, spans, forms):
    # None when the answer, equal to the reference, is written as the question asks; else the reason
    mine = _written(predicted)
    reference = _written(gold)
    for form in forms:
        check, name = FORMS[form]
        if form in _REFERENCE_RULES:  # not asked by the question: followed where the reference itself follows it
            if reference is None or not check(reference):
                continue
            if mine is None or not (check(mine) or (form == "exact" and _decimals_are_exact(reference, mine))):
                return _REFERENCE_RULES[form]
            continue
        if reference is not None and not _holds(check, reference):
            continue  # the dataset writes its own answer otherwise: the form is not checked
        if mine is None or not _holds(check, mine):
            return "the question asks for %s; the answer is not written that way" % name
    # trees compared through srepr, which orders the arguments of a sum or product: 3 \times 2^3 is 2^3 \cdot 3;
    # and canonical, so that an echo with a no-op (\cdot 1, + 0, ^{1}, 16^{1/2} for \sqrt{16}) is the echo
    import sympy
    mine = None if mine is None else _canon(mine)
    reference = None if reference is None else _canon(reference)
    tree = None if mine is None else sympy.srepr(mine)
    if mine is None or mine.is_Integer or (reference is not None and tree == sympy.srepr(reference)):
        return None  # an integer is a value; the reference as written is right
    for span in spans:
        for side in [span] + (span.split("=") if "=" in span else []):
            theirs = _written(side)
            theirs = None if theirs is None else _canon(theirs)
            if theirs is not None and sympy.srepr(theirs) == tree:
                return "the answer is one of the question's own expressions, not evaluated"
    return None

# -- the answer's type: math-verify finds the set {-1, 1} equal to the interval (-1, 1), and the list "1, 2" equal to
# the interval (1, 2); an answer must be of a type the reference can be read as, by what was parsed (not how it
# was spelled: no spelling of a set escapes)
def _kind(parsed):
    import sympy
    tree = next((p for p in parsed if not isinstance(p, str)), None)
    if isinstance(tree, sympy.Union):
        kinds = {_kind([a]) for a in tree.args}
        return kinds.pop() if len(kinds) == 1 else "union of kinds"
    if tree is sympy.S.EmptySet:
        return "empty set"
    if isinstance(tree, sympy.FiniteSet):
        return "set"
    if isinstance(tree, (sympy.Interval, sympy.Tuple)) or tree is sympy.S.Reals:
        return "pair or interval"  # (1, 2) is an open interval or a point: one spelling, the same reading
    if isinstance(tree, sympy.MatrixBase):
        return "matrix"
    if isinstance(tree, sympy.Set):
        return "set expression"
    return "number or expression"

def _kind_mismatch(gold_parsed, parsed):
    gold, mine = _kind(gold_parsed), _kind(parsed)
    if gold == mine or "empty set" in (gold, mine) or (gold, mine) == ("number or expression", "set"):
        return None  # a number is also the list of one solution: 5 and \{5\}
    return "the answer is a %s; the reference is a %s" % (mine, gold)

def handle(state, request):  # in the check's child: model text
    gold_parsed, gold, (float_rounding, numeric_precision, strict) = state
    predicted, spans, forms = request
    parsed = _parse(predicted)
    if not parsed:
        return [0.0, None]
    for side, p in (("gold answer", gold_parsed), ("answer", parsed)):
        if _too_large(p):
            return [0.0, "the %s holds a number over %d bits: not compared" % (side, MAX_NUMBER_BITS)]
    equal = mv.verify(gold_parsed, parsed, float_rounding=float_rounding, numeric_precision=numeric_precision,
                      strict=strict, timeout_seconds=None)
    if not equal:
        return [0.0, None]
    mismatch = _kind_mismatch(gold_parsed, parsed)
    if mismatch:
        return [0.0, mismatch]
    reason = _form_verdict(gold, predicted, spans, forms) if (spans or forms) else None
    return [0.0, reason] if reason else [1.0, None]
