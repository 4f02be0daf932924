"""The fleet: rollout servers and the learner's side of them.

* ``llmgym serve`` (:mod:`llmgym.fleet.serve`) runs vLLM's own OpenAI-compatible server behind a door
  (:mod:`llmgym.fleet.guard`: only the routes a fleet uses; the control routes behind a secret), with
  llmgym's weight-transfer backend (:mod:`llmgym.fleet.vllm_plugin`, loaded by vLLM in each of its
  processes) so that a learner can push its weights into it;
* :class:`FleetEngine` (:mod:`llmgym.fleet.fleet_engine`) is the learner's engine over N such
  servers: rows spread over them, the weights pushed to all after every update
  (:mod:`llmgym.fleet.weight_transfer`), every completion tagged with the policy version that sampled
  it, and no server's word taken (a probe after each sync, each batch's log-probs checked).

Imported on first use: the fleet needs vLLM (``llmgym serve``) or an HTTP client (the learner's side).

Example:
    >>> from llmgym.fleet import FleetEngine, FleetError
    >>> FleetEngine.__module__, issubclass(FleetError, ConnectionError)
    ('llmgym.fleet.fleet_engine', True)
"""

__all__ = ["FleetEngine", "FleetError", "NotARolloutServerError", "ServerLostWarning", "UntrustedServerWarning"]


def __getattr__(name):
    if name in __all__:
        from llmgym.fleet import fleet_engine

        return getattr(fleet_engine, name)
    raise AttributeError(f"module 'llmgym.fleet' has no attribute {name!r}")
