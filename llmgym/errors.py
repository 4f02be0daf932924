"""The one base of every llmgym error (and warning).

Every exception llmgym raises on purpose derives from :class:`LLMGymError` *and* keeps the built-in type
it always had (a :class:`~llmgym.sandbox.SandboxUnavailableError` is still a ``RuntimeError``, a fleet's
``FleetError`` still a ``ConnectionError``), so ``except LLMGymError`` catches what llmgym says went wrong
while code written against the built-in types keeps working. Warnings llmgym issues derive from
:class:`LLMGymWarning`, so ``warnings.filterwarnings("error", category=LLMGymWarning)`` turns them all
into errors in a test run.

This module imports nothing: every layer of the core may import it.

Example:
    >>> from llmgym.errors import LLMGymError
    >>> from llmgym.env.verifiers import VerifierUnavailableError
    >>> issubclass(VerifierUnavailableError, LLMGymError), issubclass(VerifierUnavailableError, RuntimeError)
    (True, True)
"""

from __future__ import annotations

__all__ = ["LLMGymError", "LLMGymWarning"]


class LLMGymError(Exception):
    """Base class of llmgym's errors: ``except LLMGymError`` catches any of them.

    Example:
        >>> from llmgym.errors import LLMGymError
        >>> class MyEnvError(LLMGymError, ValueError):
        ...     '''An env of mine was given something it cannot use.'''
        >>> isinstance(MyEnvError("bad"), (LLMGymError, ValueError))
        True
    """


class LLMGymWarning(UserWarning):
    """Base class of llmgym's warnings.

    Example:
        >>> import warnings
        >>> from llmgym.errors import LLMGymWarning
        >>> with warnings.catch_warnings(record=True) as seen:
        ...     warnings.simplefilter("always")
        ...     warnings.warn("something to know", LLMGymWarning)
        >>> seen[0].category.__name__
        'LLMGymWarning'
    """
