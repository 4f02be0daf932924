"""The Gymnasium kernel: tasks and scores, the verifier protocol, spaces, sequence / multi-turn / token-level envs, vector helpers, the registry, task sources.

Example:
    >>> from llmgym.env.core import SequenceEnv
    >>> from llmgym.env.types import Task
    >>> env = SequenceEnv([Task("1+1=", answer="2")], lambda task, text: text == task.answer)
    >>> env.reset(seed=0)[0]["prompt"], env.step("2")[1]
    ('1+1=', 1.0)
"""

__all__: list[str] = []
