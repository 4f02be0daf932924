"""A reasoning-gym dataset's own ``score_answer(answer, entry)``, as the sandboxed worker that runs it.

:mod:`llmgym.envs.math.scorer_pools` hands this file's text to a :class:`~llmgym.sandbox.worker.SandboxWorker`.
The dataset object is built in the zygote (``prepare``) from trusted data -- name, configuration, seed --
and kept: scorers read only its configuration and loaded data, never its seed. ``handle`` runs in each
check's child, on model text. Importing it on the host runs nothing but these definitions.
"""

__all__ = ["setup", "prepare", "handle"]

reasoning_gym = None
_datasets = {}

def setup():
    global reasoning_gym
    import reasoning_gym
    import sympy
    sympy.simplify(sympy.parse_expr("x**2 - x*x"))  # import SymPy's lazy parts now, not per check

def prepare(context):  # in the zygote, on trusted data
    name, config, seed = context
    key = (name, repr(sorted(config.items())))
    if key not in _datasets:
        if len(_datasets) >= 64:
            _datasets.clear()
        _datasets[key] = reasoning_gym.create_dataset(name, size=1, seed=seed, **config)
    return _datasets[key]

def handle(dataset, request):  # in the check's child: model text
    answer, entry = request
    return float(dataset.score_answer(answer, entry) or 0.0)
