"""The run: :class:`Trainer` (checkpoints, exact resume, interrupts, evaluation, logging, trackers).

``llmgym train``, ``quickstart`` and ``compare`` build their objects from names and hand them to a
:class:`Trainer`; a Python user hands it objects directly and gets the same run directory.

Example:
    >>> from llmgym.train import Trainer, TrainResult, save_checkpoint
    >>> Trainer.resume.__doc__.split(".")[0]
    'A trainer that continues the run in ``out_dir`` from its ``checkpoints/last``'
"""

from llmgym.train.checkpoint import CheckpointError, checkpoint_step, load_checkpoint, save_checkpoint
from llmgym.train.trainer import (
    EVAL_SEED,
    RolloutsLost,
    RunExistsError,
    StopOnSignals,
    Trainer,
    TrainResult,
    reward_progress,
    samples_per_step,
)

__all__ = ["EVAL_SEED", "CheckpointError", "RolloutsLost", "RunExistsError", "StopOnSignals", "TrainResult",
           "Trainer", "checkpoint_step", "load_checkpoint", "reward_progress", "samples_per_step", "save_checkpoint"]
