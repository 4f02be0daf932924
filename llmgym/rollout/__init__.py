"""The rollout: an env and an engine make :class:`Episode`\ s; episodes make a :class:`Batch`; one evaluator.

* :func:`collect_episodes` (:mod:`llmgym.rollout.episodes`) resets ``num_tasks × group_size`` env copies,
  asks the engine for completions (a whole one at sequence level, one token at a time at token level,
  turn after turn in multi-turn envs), steps the envs and records every token with its log-prob, mask,
  reward and policy version;
* :class:`Batch`, in the same module, pads episodes into the tensors every agent trains on;
* :func:`evaluate` and :func:`distinct_tasks` (:mod:`llmgym.rollout.evaluate`): the reward on fixed
  tasks, in the metrics' own words (``reward_mean``, ``exact_match``).

It imports the env kernel and the engines' contract; agents import it; it imports no agent.

Example:
    >>> import gymnasium, llmgym
    >>> from llmgym.engines import HFEngine, SamplingParams
    >>> from llmgym.rollout import Batch, collect_episodes
    >>> from llmgym.runtime.models import load_model
    >>> model, tok = load_model("tiny")
    >>> env = gymnasium.make("llmgym/Copy-v0", tokenizer=tok)
    >>> episodes, _ = collect_episodes(env, HFEngine(model, tok), num_tasks=2, group_size=2,
    ...                                sampling=SamplingParams(max_new_tokens=4, seed=0), seed=0)
    >>> len(episodes), Batch.from_episodes(episodes, pad_id=tok.pad_token_id).input_ids.shape[0]
    (4, 4)
"""

from llmgym.rollout.episodes import Batch, Episode, collect_episodes, draw_tasks, is_token_level
from llmgym.rollout.evaluate import distinct_tasks, evaluate

__all__ = ["Episode", "collect_episodes", "draw_tasks", "is_token_level", "Batch", "evaluate", "distinct_tasks"]
