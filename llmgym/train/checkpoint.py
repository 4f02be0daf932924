"""An agent's checkpoint: the model through ``save_pretrained``, the rest of its state in ``agent.pt``.

``save_checkpoint`` writes a directory atomically (a crash leaves the previous one whole); ``load_checkpoint``
restores an agent built with the same settings exactly (optimiser, counters, RNG, extras), reading no
pickled code (``weights_only=True``). A pipelined run stopped between drain points also saves the batches it
had sampled ahead (``pipeline.pt``). :class:`llmgym.train.Trainer` (and so ``llmgym train --resume``) is built
on these. They use only the agent's public interface (``state_dict``, ``load_state_dict``, ``model``,
``step_count``), so they live with the run, not with the algorithms.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> from llmgym.runtime.models import load_model
    >>> from llmgym.agents import GRPO
    >>> from llmgym.train.checkpoint import checkpoint_step, load_checkpoint, save_checkpoint
    >>> model, tok = load_model("tiny")
    >>> agent = GRPO(model, tok, tasks_per_step=2, group_size=2, max_new_tokens=4, kl_coef=0.0)
    >>> folder = save_checkpoint(agent, tok, Path(tempfile.mkdtemp()) / "last")
    >>> checkpoint_step(folder), load_checkpoint(agent, folder)
    (0, None)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from llmgym.errors import LLMGymError
from llmgym.runtime.display import quiet_hf_progress

__all__ = ["CHECKPOINT_FORMAT", "PIPELINE_STATE", "CheckpointError", "checkpoint_step", "load_checkpoint",
           "load_pipeline_state", "save_checkpoint"]


class CheckpointError(LLMGymError, ValueError):
    """A checkpoint that cannot be read (a damaged or foreign ``agent.pt`` / ``pipeline.pt``)."""


CHECKPOINT_FORMAT = 2
"""``agent.pt`` format: 2 = the agent's state without the model weights (they are ``model.safetensors``)."""


def _merged_lora_model(peft_model):
    """A plain ``transformers`` model with the LoRA adapters folded into the weights (W + s·BA), built
    on a copy: the training model keeps its adapters, and its weights are not rounded by merge/unmerge."""
    import copy

    return copy.deepcopy(peft_model).merge_and_unload()


PIPELINE_STATE = "pipeline.pt"
"""A checkpoint's file for a pipelined run stopped between drain points: the batches sampled ahead
(the ``state_dict()`` of :attr:`Agent.pipeline_state <llmgym.agents.base.Agent.pipeline_state>`), so a
resumed run continues exactly."""


def save_checkpoint(agent, tokenizer, directory: Path, pipeline_state: Any = None) -> Path:
    """Model + tokenizer via ``save_pretrained``, and ``agent.pt``: the rest of the agent's state
    (optimiser, counters, RNG, config, extras) without a second copy of the weights; atomically.

    With LoRA (``lora_r > 0``) the directory holds the merged model (base + adapters, loadable as a
    plain model by ``--model``), the adapters alone in ``adapter/`` (``peft``'s ``save_pretrained``:
    ``PeftModel.from_pretrained(base, DIR/adapter)``), and ``agent.pt`` keeps the adapter weights, so
    ``--resume`` rebuilds the base model, injects the adapters and continues exactly."""
    import torch

    from llmgym.runtime.models import save_pretrained

    quiet_hf_progress()
    tmp = directory.with_name(directory.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    peft_model = getattr(getattr(agent, "learner", None), "peft_model", None)
    state = agent.state_dict()
    if peft_model is not None:
        save_pretrained(_merged_lora_model(peft_model), tokenizer, tmp)
        peft_model.save_pretrained(tmp / "adapter")
        trainable = {name for name, p in agent.model.named_parameters() if p.requires_grad}
        state["model"] = {k: v for k, v in state["model"].items() if k in trainable}  # the adapters only
        state["model_part"] = "lora-adapters"
    else:
        save_pretrained(agent.model, tokenizer, tmp)
        state.pop("model")  # model.safetensors holds the weights
    torch.save({**state, "format": CHECKPOINT_FORMAT}, tmp / "agent.pt")
    if pipeline_state is not None:
        torch.save(pipeline_state.state_dict(), tmp / PIPELINE_STATE)
    (tmp / "step.txt").write_text(f"{agent.step_count}\n")
    old = directory.with_name(directory.name + ".old")
    shutil.rmtree(old, ignore_errors=True)
    if directory.exists():
        directory.rename(old)
    tmp.rename(directory)
    shutil.rmtree(old, ignore_errors=True)
    return directory


def load_checkpoint(agent, directory: Path) -> None:
    """Restore ``agent`` from a checkpoint written by :func:`save_checkpoint` (``weights_only=True``:
    loading a checkpoint runs no pickled code). The weights come from the checkpoint's
    ``model.safetensors`` (read through ``from_pretrained``), the rest from ``agent.pt``."""
    import pickle

    import torch

    from llmgym.runtime.models import load_model

    path = Path(directory) / "agent.pt"
    try:
        state = torch.load(path, map_location=agent.device, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckpointError(f"cannot read the checkpoint {path} ({first})") from None
    if state.pop("model_part", None) == "lora-adapters":  # the frozen base weights are the run's base model's
        full = agent.model.state_dict()
        full.update(state["model"])
        state["model"] = full
    elif "model" not in state:
        from llmgym.runtime.models import ModelFileError

        quiet_hf_progress()
        try:
            weights, _ = load_model(directory)
        except ModelFileError as exc:
            raise CheckpointError(f"cannot read the checkpoint {exc.path} ({exc.reason})") from None
        state["model"] = weights.state_dict()
    state.pop("format", None)
    agent.load_state_dict(state)


def load_pipeline_state(directory: Path) -> dict[str, Any] | None:
    """The pipelined learner's saved state in a checkpoint (``weights_only``), or ``None`` if it has none.

    Returned as the plain ``state_dict()`` it was saved from: ``agent.learn(..., pipeline_state=...)``
    takes it as it is."""
    import pickle

    import torch

    path = Path(directory) / PIPELINE_STATE
    if not path.is_file():
        return None
    try:
        state = torch.load(path, weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise CheckpointError(f"cannot read {path} ({first})") from None
    if not (isinstance(state, dict) and isinstance(state.get("pending"), dict) and "schedule_start" in state):
        raise CheckpointError(f"cannot read {path} (not a pipelined run's saved state)")
    return state


def checkpoint_step(directory: Path) -> int | None:
    """The step a checkpoint holds (its ``step.txt``), or ``None`` if there is none. A ``step.txt`` that is a link
    raises :class:`~llmgym.runtime.files.RunFileError` (a checkpoint's files are never followed through links)."""
    from llmgym.runtime.files import check_run_folder, read_bytes_bounded

    check_run_folder(directory, ("step.txt",))
    try:
        return int(read_bytes_bounded(Path(directory) / "step.txt", 64).decode("ascii").strip())
    except (OSError, ValueError):  # none, not a file, too long, not a number
        return None
