"""A Wordle-like game: guess a secret five-letter word in six tries, with per-letter feedback.

After each guess the env replies with one symbol per letter: ``G`` right letter in the right place,
``Y`` in the word but elsewhere, ``.`` not in the word (repeated letters are marked only as often
as the secret holds them, greens first, as in Wordle). The guess is the **last five-letter word**
in the completion ("Let me try CRANE." → ``crane``); any five letters are accepted as a guess (the
built-in list is only where secrets come from). A completion with no five-letter word uses up the turn and
gets a reply saying what is expected. Win: reward 1.0, terminated; out of guesses: reward 0.0,
terminated.
"""

from __future__ import annotations

import collections
import functools
import re
from collections.abc import Sequence
from typing import Any

import numpy as np

from llmgym import MultiTurnEnv, Task, Turn

__all__ = ["WORDS", "letter_feedback", "parse_word", "wordle_task", "WordleEnv", "wordle_env"]

WORDS: tuple[str, ...] = tuple("""
about above actor adult after again agent agree ahead alarm album alert alike alive allow alone
along alter among angle angry apple apply arena argue arise array aside asset audio avoid award
aware badge basic beach begin being below bench birth black blade blame blank blind block blood
board boost bound brain brand brave bread break brick bride brief bring broad brown brush build
buyer cabin cable carry catch cause chain chair chalk charm chart cheap check chest chief child
chose civil claim class clean clear climb clock close cloud coach coast count court cover craft
crane cream crime crowd crown curve cycle daily dance dealt delay depth dirty doubt dozen draft
drama drawn dream dress drink drive eager early earth eight elder empty enemy enjoy enter entry
equal error event exact exist extra faith false fault fence field fifty fight final first flame
fleet floor fluid focus force forth frame fresh front fruit giant given glass globe grace grade
grain grand grant grape grass great green gross group guard guess guest guide happy heart heavy
honey horse hotel house human ideal image index inner input issue joint judge juice knife label
large laser later laugh layer learn lemon level light limit local lucky lunch magic major maple
march match metal minor model money month moral motor mount mouse mouth music night noise north
novel nurse ocean offer often olive order other owner paint panel paper party peace phone photo
piano piece pilot pitch place plain plane plant plate point pound power press price pride prime
print prize proof proud quiet quick radio raise range rapid reach ready river robot round route
royal rural salad scale scene scope score sense serve seven shape share sharp sheep shelf shell
shift shirt shock shore short sight skill sleep slice smile smoke snake solid solve sound south
space spare speak speed spend spice sport staff stage stand start state steam steel stick stone
store storm story sugar suite sweet table taste teach thank theme thick thing think third tiger
title toast today topic total touch tower track trade train treat trend trial truck trust truth
twice uncle under union unity upper upset urban usual valid value video visit vital voice waste
watch water wheel white whole woman world worry write wrong young youth zebra
""".split())


def letter_feedback(guess: str, secret: str) -> str:
    """One symbol per letter: ``G`` right place, ``Y`` elsewhere in the word, ``.`` absent.

    Example:
        >>> from llmgym.envs.games.wordle import letter_feedback
        >>> letter_feedback("crane", "crane"), letter_feedback("trace", "crane"), letter_feedback("eerie", "crane")
        ('GGGGG', '.GGYG', '..Y.G')
    """
    guess, secret = guess.lower(), secret.lower()
    if len(guess) != len(secret):
        raise ValueError(f"guess {guess!r} and secret {secret!r} differ in length")
    marks = ["."] * len(guess)
    unmatched = collections.Counter(s for g, s in zip(guess, secret) if g != s)
    for i, (g, s) in enumerate(zip(guess, secret)):
        if g == s:
            marks[i] = "G"
        elif unmatched[g] > 0:  # a repeated letter is yellow only as often as the secret still has it
            marks[i] = "Y"
            unmatched[g] -= 1
    return "".join(marks)


def parse_word(completion: str, length: int = 5) -> str | None:
    """The last word of ``length`` letters (lower-cased), or ``None`` when there is none.

    Example:
        >>> from llmgym.envs.games.wordle import parse_word
        >>> parse_word("Let me start with TRACE."), parse_word("hm, 12345 or abcdef")
        ('trace', None)
    """
    found = re.findall(rf"(?<![A-Za-z])[A-Za-z]{{{length}}}(?![A-Za-z])", completion)
    return found[-1].lower() if found else None


def wordle_task(rng: np.random.Generator, words: Sequence[str] = WORDS, max_guesses: int = 6) -> Task:
    """A secret word drawn from ``words``; the prompt explains the rules.

    Example:
        >>> import numpy as np
        >>> from llmgym.envs.games.wordle import wordle_task, WORDS
        >>> wordle_task(np.random.default_rng(0)).answer in WORDS
        True
    """
    secret = str(words[int(rng.integers(len(words)))]).lower()
    prompt = (
        f"Let's play Wordle. Guess my secret 5-letter English word in {max_guesses} tries. After each "
        f"guess I reply with one symbol per letter: G = right letter in the right place, Y = the letter "
        f"is in the word but elsewhere, . = not in the word. Reply with one 5-letter word."
    )
    return Task(prompt, answer=secret, id=f"wordle-{secret}")


class WordleEnv(MultiTurnEnv):
    """The Wordle-like game; ``max_turns`` is the number of guesses; ``task.answer`` is the secret word.

    ``self.state``: ``guesses`` and ``feedback`` so far. ``info["outcome"]``: ``"won"``, ``"lost"``
    or ``"playing"``; ``info["feedback"]`` the marks of this guess.

    Example:
        >>> from llmgym import Task
        >>> from llmgym.envs.games import WordleEnv
        >>> env = WordleEnv([Task("Wordle!", answer="crane")], max_turns=6)
        >>> _ = env.reset(seed=0)
        >>> env.step("Let me start with TRACE")[4]["reply"]
        'TRACE .GGYG (5 guesses left)'
        >>> obs, reward, terminated, truncated, info = env.step("crane")
        >>> info["outcome"], reward, terminated
        ('won', 1.0, True)
    """

    def start(self, task: Task) -> None:
        secret = str(task.answer)
        if not secret.isalpha():
            raise ValueError(f"a Wordle task's answer must be a word of letters, got {task.answer!r}")
        self.state = {"guesses": [], "feedback": []}

    def respond(self, completion: str) -> Turn:
        secret = str(self.task.answer).lower()
        guess = parse_word(completion, len(secret))
        self.state["guesses"].append(guess)
        left = self.max_turns - len(self.state["guesses"])
        marks = letter_feedback(guess, secret) if guess is not None else None
        self.state["feedback"].append(marks)
        info: dict[str, Any] = {"guess": guess, "feedback": marks, "outcome": "playing"}
        if guess == secret:
            return Turn(1.0, None, True, {**info, "outcome": "won", "secret": secret})
        if left <= 0:  # out of guesses: the game is lost (terminated, not truncated)
            return Turn(0.0, None, True, {**info, "outcome": "lost", "secret": secret})
        plural = "guess" if left == 1 else "guesses"
        if guess is None:
            n = len(secret)
            reply = f"I found no {n}-letter word in your reply. Answer with one {n}-letter English word. ({left} {plural} left)"
        else:
            reply = f"{guess.upper()} {marks} ({left} {plural} left)"
        return Turn(0.0, reply, False, info)


def wordle_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    tasks: Any = None,
    words: Sequence[str] = WORDS,
    max_guesses: int = 6,
) -> WordleEnv:
    """``llmgym/Wordle-v0``: a secret word from ``words`` (five letters each), ``max_guesses`` tries.

    Example:
        >>> import gymnasium, llmgym
        >>> env = gymnasium.make("llmgym/Wordle-v0")
        >>> obs, info = env.reset(seed=0)
        >>> env.step(info["task"].answer.upper())[1:3]
        (1.0, True)
    """
    bad = [w for w in words if len(w) != 5 or not w.isalpha()]
    if bad or not words:
        raise ValueError(f"words must be non-empty and all five letters, got {bad[:3] or 'an empty list'}")
    if tasks is None:
        tasks = functools.partial(wordle_task, words=words, max_guesses=max_guesses)  # picklable, unlike a closure
    return WordleEnv(tasks, None, tokenizer, max_turns=max_guesses, render_mode=render_mode)
