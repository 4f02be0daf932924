r"""The code judge: tests run in one sandboxed process, the candidate's code in another.

:class:`~llmgym.envs.code.CodeVerifier` runs every completion with :meth:`llmgym.sandbox.Sandbox.run_judged`:

* the **candidate process** (the run's uid, a fresh interpreter) runs :data:`RUNNER`, which executes
  the program (``main.py``: prompt + completion), then serves calls of its top-level functions;
* the **judge process** (another uid) runs :func:`judge_source`: the task's trusted code (HumanEval's
  prompt, so its helpers such as ``poly`` are the dataset's own), then the tests, where the entry
  point and every other top-level function or class of the program is a *proxy* that sends the call
  to the candidate process -- except names the tests take from the task or from Python's builtins
  (a program that defines ``abs`` does not change the ``abs`` of the tests), and modules the
  program imported are imported by the judge itself (standard library only) for tests that use them
  without importing.

Arguments and return values cross as plain data only -- ``None``, ``bool``, ``int``, ``float``,
``complex``, ``str``, ``bytes``, ``list``, ``tuple``, ``dict``, ``set``, ``frozenset`` of exactly those
types (subclasses are refused), and ``range``, dict views and lazy iterators (a generator, ``map``,
``zip`` ...) of them, which arrive as the same kind of value (an iterator arrives as a one-shot
iterator over its items: ``list(f(x))`` works, ``f(x) == [...]`` is false, as in Python) -- encoded
as tagged JSON (:func:`encode_plain` / :func:`decode_plain`); anything else fails the call with a
``TypeError`` in the test. A candidate's exception comes back as
its type name and message and is raised in the test as that built-in exception (``ValueError``,
``ZeroDivisionError``, ...) or as ``CandidateError`` for any other type. Mutation of a list, dict or
set argument is copied back into the caller's object after the call (HumanEval and MBPP tests that
check in-place sorting see it); identity is not: a value that comes back is always a new object,
and aliasing between arguments is not kept.

The verdict is the judge's own: its exit status 0 **and** a per-run random token that only the judge
holds, written on a pipe only the judge has (``judge_report``), after the last test. Nothing the
candidate prints, raises, traces or exits with reaches either.

Example:
    >>> from llmgym.envs.code.code_judge import decode_plain, encode_plain
    >>> value = {"a": [1, 2.5, None], (1, 2): {3, 4}, "s": frozenset("x")}
    >>> decode_plain(encode_plain(value)) == value
    True
    >>> encode_plain(type("AlwaysEqual", (), {"__eq__": lambda s, o: True})())
    Traceback (most recent call last):
    ...
    TypeError: a value of type AlwaysEqual cannot cross to the judge (plain data only: None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset; range, dict views and iterators of those)
"""

from __future__ import annotations

import json
from typing import Any

__all__ = ["CODEC", "JUDGE", "RUNNER", "decode_plain", "encode_plain", "judge_source"]

#: The plain-data codec, shared verbatim by the judge, the candidate runner and the host
#: (Python 3.8+, standard library only). Containers are ``[tag, payload]`` lists; scalars are JSON's
#: own; a JSON object never appears, so anything else in a message is refused.
CODEC = r'''
import json as _json

_PLAIN = ("None, bool, int, float, complex, str, bytes, list, tuple, dict, set, frozenset; "
          "range, dict views and iterators of those")
_MAX_DEPTH = 200
_MAX_ITEMS = 1000000
_ITEMS = type({}.items())
_VIEWS = {type({}.keys()): "K", type({}.values()): "V", _ITEMS: "E"}
MAX_MESSAGE = 8 << 20

def _enc(x, depth=0):
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if depth > _MAX_DEPTH:
        raise TypeError("a value nested deeper than %d levels cannot cross to the judge" % _MAX_DEPTH)
    if t is list:
        return ["L", [_enc(v, depth + 1) for v in x]]
    if t is tuple:
        return ["T", [_enc(v, depth + 1) for v in x]]
    if t is dict:
        return ["D", [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in x.items()]]
    if t is set:
        return ["S", [_enc(v, depth + 1) for v in x]]
    if t is frozenset:
        return ["F", [_enc(v, depth + 1) for v in x]]
    if t is complex:
        return ["C", [x.real, x.imag]]
    if t is bytes:
        return ["B", x.hex()]
    if t is range:
        return ["R", [x.start, x.stop, x.step]]
    if t in _VIEWS:
        return [_VIEWS[t], [_enc(v, depth + 1) for v in (x if t is not _ITEMS else (list(p) for p in x))]]
    if hasattr(t, "__next__") and hasattr(t, "__iter__"):
        # a lazy iterator (generator, map, filter, zip ...) crosses as a one-shot iterator over its
        # items, so list(f(x)) works and f(x) == [...] stays False, as in Python
        items = []
        for v in x:
            if len(items) >= _MAX_ITEMS:
                raise TypeError("an iterator of more than %d items cannot cross to the judge" % _MAX_ITEMS)
            items.append(_enc(v, depth + 1))
        return ["I", items]
    raise TypeError("a value of type %s cannot cross to the judge (plain data only: %s)"
                    % (getattr(t, "__name__", "?"), _PLAIN))

def _dec(x):
    t = type(x)
    if x is None or t is bool or t is int or t is float or t is str:
        return x
    if t is not list or len(x) != 2 or type(x[0]) is not str:
        raise ValueError("malformed plain-data message")
    tag, body = x
    if tag == "C":
        if type(body) is not list or len(body) != 2 or not all(type(v) in (int, float) for v in body):
            raise ValueError("malformed complex number")
        return complex(body[0], body[1])
    if tag == "B":
        if type(body) is not str:
            raise ValueError("malformed bytes")
        return bytes.fromhex(body)
    if type(body) is not list:
        raise ValueError("malformed container")
    if tag == "L":
        return [_dec(v) for v in body]
    if tag == "T":
        return tuple(_dec(v) for v in body)
    if tag == "S":
        return set(_dec(v) for v in body)
    if tag == "F":
        return frozenset(_dec(v) for v in body)
    if tag == "R":
        if len(body) != 3 or not all(type(v) is int for v in body) or body[2] == 0:
            raise ValueError("malformed range")
        return range(body[0], body[1], body[2])
    if tag == "I":
        return iter([_dec(v) for v in body])
    if tag == "K":
        return dict.fromkeys(_dec(v) for v in body).keys()
    if tag == "V":
        return dict(enumerate(_dec(v) for v in body)).values()
    if tag == "E":
        pairs = [_dec(v) for v in body]
        if not all(type(p) is list and len(p) == 2 for p in pairs):
            raise ValueError("malformed dict items")
        return dict(pairs).items()
    if tag == "D":
        out = {}
        for item in body:
            if type(item) is not list or len(item) != 2:
                raise ValueError("malformed dict item")
            out[_dec(item[0])] = _dec(item[1])
        return out
    raise ValueError("unknown plain-data tag %r" % (tag[:20],))

def _dumps(value):
    return _json.dumps(value, separators=(",", ":")).encode("utf-8", "surrogatepass")

def _send(fd, payload):
    data = b"%d\n" % len(payload) + payload
    view = memoryview(data)
    while view:
        view = view[_os.write(fd, view):]

def _recv(fd):
    head = b""
    while not head.endswith(b"\n"):
        c = _os.read(fd, 1)
        if not c:
            raise EOFError("the other side closed the channel")
        head += c
        if len(head) > 12:
            raise ValueError("malformed message header")
    n = int(head)
    if not 0 <= n <= MAX_MESSAGE:
        raise ValueError("message of %d bytes exceeds the %d-byte cap" % (n, MAX_MESSAGE))
    chunks, got = [], 0
    while got < n:
        c = _os.read(fd, min(1 << 20, n - got))
        if not c:
            raise EOFError("the other side closed the channel mid-message")
        chunks.append(c)
        got += len(c)
    return _json.loads(b"".join(chunks).decode("utf-8", "surrogatepass"))
'''

#: The candidate process's program: run ``main.py`` as ``__main__``, report its top-level functions
#: and classes, then serve ``["call", name, args, kwargs]`` requests on fd 3 with replies on fd 4.
#: It is trusted code, but it shares its process with the candidate, so nothing it does is believed:
#: the judge checks every reply.
RUNNER = CODEC + r'''
import os as _os, sys as _sys

def _hide(etype, value, tb):
    import traceback  # only on a failure: ~10 ms of start-up saved on every run
    while tb is not None and tb.tb_frame.f_code.co_filename == "<string>":
        tb = tb.tb_next
    traceback.print_exception(etype, value, tb)

def _flush():
    for f in (_sys.stdout, _sys.stderr):
        try:
            f.flush()
        except Exception:
            pass

def _exit_like(e):
    # sys.exit() ends the program as it would outside the judge: with its status, and nothing more
    code = e.code
    _flush()
    _os._exit(0 if code is None else code & 0xFF if type(code) is int else 1)

def _serve():
    path = _sys.argv[1]
    _sys.argv = [path]
    _sys.path.insert(0, _os.getcwd())
    _sys.dont_write_bytecode = True
    _sys.excepthook = _hide
    mod = type(_sys)("__main__")
    mod.__file__ = path
    mod.__builtins__ = __builtins__
    mod.__cached__ = None
    _sys.modules["__main__"] = mod
    with open(path, "rb") as fh:
        src = fh.read()
    try:
        exec(compile(src, "/tmp/" + path, "exec"), mod.__dict__)
    except SystemExit as e:
        _exit_like(e)
    except BaseException as e:
        _hide(type(e), e, e.__traceback__)
        _flush()
        _send(4, _dumps(["load_error", "%s: %s" % (type(e).__name__, str(e)[:2000])]))
        _os._exit(1)
    names, modules = [], []
    for k, v in list(mod.__dict__.items()):
        if type(k) is not str or k.startswith("__"):
            continue
        if type(v) is type(_sys):
            modules.append([k, str(getattr(v, "__name__", ""))])
        elif callable(v):
            names.append(k)
    _flush()
    _send(4, _dumps(["loaded", names, modules]))
    shown = 0
    while True:
        try:
            request = _recv(3)
        except EOFError:  # the judge is done
            _flush()
            _os._exit(86)
        _, name, args, kwargs = request
        try:
            args = [_dec(a) for a in args]
            kwargs = {k: _dec(v) for k, v in kwargs}
            before = [_dumps(_enc(a)) if type(a) in (list, dict, set) else None for a in args]
            fn = mod.__dict__.get(name)
            if fn is None:
                raise NameError("name %r is not defined" % name)
            result = fn(*args, **kwargs)
            after = []
            for a, b in zip(args, before):
                if b is None:
                    after.append(None)
                else:
                    e = _enc(a)
                    after.append(e if _dumps(e) != b else None)
            reply = _dumps(["ok", _enc(result), after])
        except SystemExit as e:
            _exit_like(e)
        except BaseException as e:
            if shown < 3:
                shown += 1
                _hide(type(e), e, e.__traceback__)
            reply = _dumps(["raise", type(e).__name__, str(e)[:2000]])
        _flush()
        _send(4, reply)

_serve()
'''

#: The judge process's program (``__judge__`` globals ``JUDGE_IN``/``JUDGE_OUT``/``JUDGE_REPORT``
#: come from the sandbox; ``_CONFIG`` from :func:`judge_source`).
JUDGE = CODEC + r'''
import builtins as _builtins, os as _os, sys as _sys

class CandidateError(Exception):
    """An exception of the candidate whose type is not a built-in exception."""

class CandidateGone(Exception):
    """The candidate's process ended or broke the protocol."""

CandidateError.__module__ = CandidateGone.__module__ = "__main__"  # tracebacks print the bare name

_SAFE_MODULES = set(getattr(_sys, "stdlib_module_names", ())) - {"antigravity", "this", "idlelib", "turtle",
                                                                  "turtledemo", "tkinter", "webbrowser"}

import threading as _threading
_LOCK = _threading.Lock()  # one call at a time on the channel, should a test use threads

def _call(name, args, kwargs):
    with _LOCK:
        return _call_locked(name, args, kwargs)

def _call_locked(name, args, kwargs):
    try:
        request = _dumps(["call", name, [_enc(a) for a in args], [[str(k), _enc(v)] for k, v in kwargs.items()]])
    except TypeError as e:
        raise TypeError("argument of %s(): %s" % (name, e)) from None
    try:
        _send(JUDGE_OUT, request)
        reply = _recv(JUDGE_IN)
    except (OSError, EOFError, ValueError) as e:
        raise CandidateGone("the candidate's process ended or broke the protocol during %s(): %s" % (name, e)) from None
    if type(reply) is not list or not reply:
        raise CandidateGone("malformed reply from %s()" % name)
    if reply[0] == "ok" and len(reply) == 3 and type(reply[2]) is list and len(reply[2]) == len(args):
        try:
            result = _dec(reply[1])
            for arg, state in zip(args, reply[2]):
                if state is None:
                    continue
                new = _dec(state)
                if type(arg) is list and type(new) is list:
                    arg[:] = new
                elif type(arg) in (dict, set) and type(new) is type(arg):
                    arg.clear()
                    arg.update(new)
        except (ValueError, TypeError, RecursionError) as e:
            raise TypeError("the value returned by %s() is not plain data: %s" % (name, e)) from None
        return result
    if reply[0] == "raise" and len(reply) == 3 and type(reply[1]) is str and type(reply[2]) is str:
        kind = getattr(_builtins, reply[1], None)
        # StopIteration would silently end a loop of the tests (map(), a for over a generator)
        if (isinstance(kind, type) and issubclass(kind, Exception) and kind.__module__ == "builtins"
                and not issubclass(kind, (StopIteration, StopAsyncIteration))):
            try:
                exc = kind(reply[2])
            except Exception:
                exc = CandidateError("%s: %s" % (reply[1][:100], reply[2]))
        else:
            exc = CandidateError("%s: %s" % (reply[1][:100], reply[2]))
        raise exc
    raise CandidateGone("malformed reply from %s()" % name)

def _proxy(name):
    def proxy(*args, **kwargs):
        return _call(name, args, kwargs)
    proxy.__name__ = proxy.__qualname__ = name
    return proxy

def _format(e):
    import linecache, traceback as _tb  # only on a failure
    for name, text in (("tests.py", _CONFIG["tests"]), ("prompt.py", _CONFIG["prompt"])):
        linecache.cache[name] = (len(text), None, text.splitlines(True), name)
    # only the task's own frames: the judge's machinery is noise to a reader
    frames = [f for f in _tb.extract_tb(e.__traceback__) if f.filename in ("tests.py", "prompt.py")]
    head = "Traceback (most recent call last):\n" + "".join(_tb.format_list(frames)) if frames else ""
    return head + "".join(_tb.format_exception_only(type(e), e))

def _judge():
    report = {"passed": False, "stage": "load", "error": "", "token": None}
    try:
        hello = _recv(JUDGE_IN)
        if type(hello) is list and hello and hello[0] == "load_error":
            report["error"] = "the program failed before the tests ran: %s" % str(hello[-1])[:2000]
            return report
        if type(hello) is not list or len(hello) != 3 or hello[0] != "loaded":
            raise CandidateGone("the candidate did not report its functions")
        ns = {"__name__": "__main__", "__builtins__": _builtins, "CandidateError": CandidateError}
        if _CONFIG["prompt"]:
            exec(compile(_CONFIG["prompt"], "prompt.py", "exec"), ns)
        trusted = set(ns)
        for item in hello[2][:1000] if type(hello[2]) is list else ():
            if type(item) is list and len(item) == 2 and all(type(v) is str for v in item):
                alias, module = item
                if (alias.isidentifier() and alias not in ns and not hasattr(_builtins, alias)
                        and module.split(".")[0] in _SAFE_MODULES):
                    try:
                        ns[alias] = __import__("importlib").import_module(module)
                    except Exception:
                        pass
        # the program's functions, except those that would shadow a name the tests take from the
        # task (the prompt's helpers) or from Python (a candidate's `abs` must not judge its answers)
        for name in hello[1][:10000] if type(hello[1]) is list else ():
            if (type(name) is str and name.isidentifier() and name not in trusted
                    and not hasattr(_builtins, name)):
                ns[name] = _proxy(name)
        if _CONFIG["entry_point"]:
            ns[_CONFIG["entry_point"]] = _proxy(_CONFIG["entry_point"])
        report["stage"] = "test"
        exec(compile(_CONFIG["tests"], "tests.py", "exec"), ns)
        report["passed"] = True
        report["token"] = _CONFIG["token"]
    except BaseException as e:
        report["error"] = _format(e)[-8000:]
        if report["stage"] == "test":  # where and how a test failed, for feedback that quotes no hidden test
            import traceback as _tb
            lines = [f.lineno for f in _tb.extract_tb(e.__traceback__) if f.filename == "tests.py"]
            report["test_line"] = lines[-1] if lines else None
            report["exception"] = type(e).__name__
            report["exception_text"] = "".join(_tb.format_exception_only(type(e), e))[-500:]
    return report

_report = _judge()
_data = _json.dumps(_report).encode("utf-8", "replace")
while len(_data) > 16000 and _report["error"]:  # whole JSON, never a cut one: keep the error's tail
    _report["error"] = _report["error"][len(_report["error"]) // 2 + 1:]
    _data = _json.dumps(_report).encode("utf-8", "replace")
try:
    _os.write(JUDGE_REPORT, _data[:16000])
finally:
    _os._exit(0 if _report["passed"] else 1)
'''


def judge_source(tests: str, *, prompt: str = "", entry_point: str | None = None, token: str) -> str:
    """The judge program of one run: :data:`JUDGE` with the task's trusted code, tests and secret.

    Example:
        >>> from llmgym.envs.code.code_judge import judge_source
        >>> "assert add(1, 2) == 3" in judge_source("assert add(1, 2) == 3", entry_point="add", token="t")
        True
    """
    config = {"prompt": prompt, "tests": tests, "entry_point": entry_point or "", "token": token}
    return f"_CONFIG = {config!r}\n" + JUDGE


_namespace: dict[str, Any] = {"_os": None}
exec(compile(CODEC, "<codec>", "exec"), _namespace)


def encode_plain(value: Any) -> Any:
    """``value`` as tagged JSON-able data, or ``TypeError`` when it is not plain data."""
    return _namespace["_enc"](value)


def decode_plain(data: Any) -> Any:
    """The value :func:`encode_plain` encoded (``ValueError`` on anything malformed)."""
    return _namespace["_dec"](data)

