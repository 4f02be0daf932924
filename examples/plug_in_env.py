"""Plug in a new verifiable env: a task source and a verifier function (user code: under 20 lines)."""

import gymnasium as gym
from gymnasium.utils.env_checker import check_env

from llmgym import SequenceEnv, Task, register_env


def make_tasks(rng):  # a procedural, seeded task source
    a, b = rng.integers(1, 10, size=2)
    return Task(f"What is {a} times {b}?", answer=str(a * b))


def verify(task, completion):  # reward 1.0 when the answer appears as the last word
    words = completion.strip().split()
    return float(bool(words) and words[-1].strip(".") == task.answer)


def make_times_env(tokenizer=None, **kw):  # module level, not a lambda: the env pickles (async vector envs)
    return SequenceEnv(make_tasks, verify, tokenizer, **kw)


register_env("Times", make_times_env, description="a times-table question, answer as the last word")
env = gym.make("llmgym/Times-v0")
obs, info = env.reset(seed=0)
print(obs["prompt"], env.step(f"It is {info['task'].answer}.")[1])
check_env(env.unwrapped)
