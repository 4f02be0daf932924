"""Tool-use task families (multi-turn): the policy calls functions, then answers.

* ``llmgym/Calculator-v0`` — multiply two large numbers with a ``calculator`` tool (a tiny model learns it on a CPU);
* ``llmgym/PythonMath-v0`` — exact-integer problems solved with the sandboxed ``python`` tool.

Both are :class:`llmgym.tools.ToolEnv`\\ s: only the final answer is scored; tool calls earn nothing.

Example:
    >>> import gymnasium, llmgym
    >>> env = gymnasium.make("llmgym/Calculator-v0")
    >>> obs, info = env.reset(seed=0)
    >>> env.step("12")[1:3]  # answering without the tool: a guess, scored like any answer
    (0.0, True)
"""

from llmgym.envs.tools.calculator import calculator, calculator_env, calculator_tool, integer_answer, multiplication_task
from llmgym.envs.tools.python_math import KINDS, python_math_env, python_math_task

__all__ = [
    "calculator", "calculator_tool", "calculator_env", "integer_answer", "multiplication_task",
    "python_math_env", "python_math_task", "KINDS",
]
