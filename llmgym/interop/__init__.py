"""Interop: other ecosystems' envs in, llmgym's envs out — one env, every trainer.

In: :func:`from_verifiers` (PrimeIntellect ``verifiers`` environments, single- and multi-turn) and
:func:`from_textarena` (TextArena games) give Gymnasium envs like every llmgym env — sequence or
multi-turn, token level through :class:`llmgym.TokenLevel`, trainable by every agent. Out:
:func:`trl_reward_funcs` scores TRL ``GRPOTrainer`` completions through an llmgym env's verifier
(:func:`trl_dataset` gives it the prompts); :func:`to_verifiers` makes an llmgym env a verifiers
``Env``. The third-party packages are imported when an adapter is used, never by ``import llmgym``;
``llmgym list`` shows which adapters are installed. Their code that reads model text (reward functions, a
verifiers ``run()``, a game and its opponent) runs in llmgym's sandbox (:mod:`llmgym.interop.adapter_pools`). On the command line, ``--env
verifiers:<module>`` and ``--env textarena:<game id>`` (see :mod:`llmgym.interop.adapters`).

See ``docs/interop.md`` for worked examples and what does not map.

Example:
    >>> from llmgym.interop import ADAPTERS
    >>> sorted(ADAPTERS)
    ['textarena', 'verifiers']
"""

from llmgym.interop.adapters import ADAPTERS, Adapter, adapter_versions, make_adapted_env, parse_env_spec
from llmgym.interop.textarena_in import from_textarena, random_move_opponent
from llmgym.interop.trl_out import trl_dataset, trl_reward_funcs
from llmgym.interop.verifiers_in import from_verifiers
from llmgym.interop.verifiers_out import to_verifiers

__all__ = [
    "ADAPTERS",
    "Adapter",
    "adapter_versions",
    "make_adapted_env",
    "parse_env_spec",
    "from_verifiers",
    "from_textarena",
    "random_move_opponent",
    "to_verifiers",
    "trl_reward_funcs",
    "trl_dataset",
]
