"""Bradley–Terry reward models: a scalar head on a language model, trained on preference pairs.

The model is a ``transformers`` sequence classifier with one label (``AutoModelForSequenceClassification``,
``num_labels=1``): a causal-LM backbone whose last hidden state at the final token goes through a
linear head to one number, ``r(x, y)``. Under the Bradley–Terry model a human prefers ``y⁺`` to
``y⁻`` with probability ``σ(r(x, y⁺) − r(x, y⁻))``, so training minimises

    L = −log σ(r(x, y⁺) − r(x, y⁻))          (mean over pairs)

and the held-out *pairwise accuracy*, the share of pairs with ``r(x, y⁺) > r(x, y⁻)``, says how well
it ranks. As in TRL's ``RewardTrainer``, a pair may carry a ``margin`` m (the loss becomes
``−log σ(r⁺ − r⁻ − m)``, Llama 2's graded preferences) and ``center_rewards_coefficient`` c adds
``c·mean((r⁺ + r⁻)²)``, which pulls the rewards towards mean zero (Eisenstein et al., 2023, Eq. 2).
:class:`RewardModelVerifier` makes a trained model a :class:`~llmgym.Verifier`, so
``SequenceEnv(tasks, RewardModelVerifier(rm, tok))`` is an RLHF env that any agent can train against.

Sequences are ``prompt (as the env renders it) + completion + EOS``, left-padded, and the reward is
read where ``transformers`` reads it — the model's own forward pools the last token that is not
``config.pad_token_id`` — so a reward model scores the same in llmgym, through
``AutoModelForSequenceClassification`` and in TRL, with padding on either side. That token is the
EOS when the tokenizer has its own pad token, and the last completion token when pad = EOS (a
tokenizer without a pad token, as TRL trains such reward models too). The model's
``config.pad_token_id`` must be the tokenizer's pad token (:func:`reward_model_from_causal_lm` and
:func:`load_reward_model` set it, as TRL does).
"""

from __future__ import annotations

import math
import os
import threading
from typing import Any, Callable, Sequence

import torch

from llmgym.rlhf.preferences import PreferenceSource, encode_pair, load_preferences
from llmgym.env.types import Prompt, Score, Task
from llmgym.env.verifiers import Verifier, VerifierUnavailableError, escape_special_tokens, keep_last_tokens

__all__ = [
    "bradley_terry_loss",
    "reward_model_from_causal_lm",
    "load_reward_model",
    "reward_scores",
    "pairwise_accuracy",
    "train_reward_model",
    "fit_reward_model",
    "RewardModelVerifier",
]


def bradley_terry_loss(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor,
                       margin: torch.Tensor | None = None, center_rewards_coefficient: float = 0.0) -> torch.Tensor:
    """``mean(−log σ(r⁺ − r⁻ − m)) + c·mean((r⁺ + r⁻)²)`` over pairs (TRL's ``RewardTrainer`` loss).

    Args:
        chosen_rewards, rejected_rewards: ``[B]``.
        margin: ``[B]`` required reward gaps ``m`` (Llama 2's graded preferences); ``None`` = 0.
        center_rewards_coefficient: ``c`` of the centring term (Eisenstein et al., 2023; TRL suggests 0.01).

    Example:
        >>> import torch
        >>> from llmgym.rlhf.reward_models import bradley_terry_loss
        >>> round(float(bradley_terry_loss(torch.tensor([0.0]), torch.tensor([0.0]))), 4)  # log 2
        0.6931
        >>> bradley_terry_loss(torch.tensor([5.0]), torch.tensor([-5.0])) < 1e-4
        tensor(True)
        >>> round(float(bradley_terry_loss(torch.tensor([1.0]), torch.tensor([0.0]), margin=torch.tensor([1.0]))), 4)
        0.6931
        >>> tie = bradley_terry_loss(torch.tensor([3.0]), torch.tensor([3.0]), center_rewards_coefficient=0.01)
        >>> round(float(tie), 4)  # log 2 + 0.01·(3 + 3)²
        1.0531
    """
    gap = chosen_rewards - rejected_rewards
    if margin is not None:
        gap = gap - margin
    loss = -torch.nn.functional.logsigmoid(gap).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * ((chosen_rewards + rejected_rewards) ** 2).mean()
    return loss


def reward_model_from_causal_lm(lm, tokenizer=None):
    """A one-label sequence classifier whose backbone is a copy of causal LM ``lm``'s; the head is new.

    Works for any architecture ``transformers`` has a ``...ForSequenceClassification`` for. With
    ``tokenizer``, its pad token becomes the model's ``config.pad_token_id`` (where ``transformers``
    looks for the end of each row; TRL sets it the same way); without, ``lm``'s config keeps its own.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.rlhf.reward_models import reward_model_from_causal_lm
        >>> tok = build_tokenizer()
        >>> lm = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> rm = reward_model_from_causal_lm(lm)
        >>> type(rm).__name__, rm.config.num_labels
        ('LlamaForSequenceClassification', 1)
    """
    from transformers import AutoModelForSequenceClassification

    config = lm.config.__class__.from_dict(lm.config.to_dict())
    config.num_labels = 1
    if tokenizer is not None:
        config.pad_token_id = tokenizer.pad_token_id
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)  # the new head's init does not depend on the caller's RNG state
        rm = AutoModelForSequenceClassification.from_config(config)
    backbone = getattr(lm, lm.base_model_prefix)
    getattr(rm, rm.base_model_prefix).load_state_dict(backbone.state_dict())
    torch.nn.init.zeros_(_head(rm).weight)  # r ≡ 0 at the start: no pair is preferred before training
    return rm.to(next(lm.parameters()).device)


def load_reward_model(name_or_path: str | os.PathLike, *, device: str | None = None):
    """``(model, tokenizer)`` of a reward model saved with ``save_pretrained`` (see :func:`llmgym.runtime.models.save_pretrained`).

    Example:
        >>> import tempfile
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, save_pretrained, TinyModelConfig
        >>> from llmgym.rlhf.reward_models import reward_model_from_causal_lm, load_reward_model
        >>> tok = build_tokenizer()
        >>> rm = reward_model_from_causal_lm(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = save_pretrained(rm, tok, d)
        ...     loaded, _ = load_reward_model(d)
        >>> type(loaded).__name__
        'LlamaForSequenceClassification'
    """
    from transformers import AutoModelForSequenceClassification

    from llmgym.runtime.models import load_tokenizer

    tokenizer = load_tokenizer(name_or_path)
    model = AutoModelForSequenceClassification.from_pretrained(str(name_or_path), num_labels=1, dtype=torch.float32)
    if model.config.num_labels != 1:
        raise ValueError(f"{name_or_path} has {model.config.num_labels} labels; a reward model has one")
    if model.config.pad_token_id is None:  # the tokenizer loader's pad token (EOS when it had none), as TRL
        model.config.pad_token_id = tokenizer.pad_token_id
    if device is not None:
        model.to(device)
    return model, tokenizer


def _head(model) -> torch.nn.Module:
    for name in ("score", "classifier"):
        head = getattr(model, name, None)
        if isinstance(head, torch.nn.Linear):
            return head
    raise TypeError(f"{type(model).__name__} has no linear 'score' or 'classifier' head: a reward model must be an "
                    f"AutoModelForSequenceClassification with num_labels=1 (see reward_model_from_causal_lm)")


def reward_scores(model, tokenizer, prompts: Sequence[Prompt], completions: Sequence[str]) -> torch.Tensor:
    """``[B]`` rewards ``r(prompt_i, completion_i)`` in one forward pass (differentiable; no batching limit).

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.rlhf.reward_models import reward_model_from_causal_lm, reward_scores
        >>> tok = build_tokenizer()
        >>> rm = reward_model_from_causal_lm(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)))
        >>> reward_scores(rm, tok, ["q", "q"], ["a", "bb"]).tolist()  # a fresh head scores 0
        [0.0, 0.0]
    """
    from llmgym.engines.model_inputs import pad_left

    if len(prompts) != len(completions):
        raise ValueError(f"reward_scores got {len(prompts)} prompts but {len(completions)} completions")
    rows = [p + c for p, c in (encode_pair(tokenizer, p, c) for p, c in zip(prompts, completions))]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    _check_pad_token(model, pad)
    device = next(model.parameters()).device
    ids, attn = pad_left(rows, pad, device)
    positions = (attn.cumsum(-1) - 1).clamp(min=0)
    # the model's own pooling (the last token that is not config.pad_token_id), so the score is the
    # one transformers and TRL compute; position ids make left padding exact for any architecture
    return model(input_ids=ids, attention_mask=attn, position_ids=positions).logits.squeeze(-1).float()


def _check_pad_token(model, pad: int) -> None:
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    if config.pad_token_id != pad:
        raise ValueError(
            f"the reward model's config.pad_token_id is {config.pad_token_id} but its tokenizer pads with {pad}: "
            f"transformers reads the score at the last token that is not config.pad_token_id, so they must agree. "
            f"Build it with reward_model_from_causal_lm(lm, tokenizer), load it with load_reward_model, or set "
            f"model.config.pad_token_id = tokenizer.pad_token_id")


@torch.no_grad()
def _scores_no_grad(model, tokenizer, prompts, completions, batch_size: int) -> torch.Tensor:
    was_training = model.training
    model.eval()
    try:
        parts = [reward_scores(model, tokenizer, prompts[s:s + batch_size], completions[s:s + batch_size])
                 for s in range(0, len(prompts), batch_size)]
    finally:
        model.train(was_training)
    return torch.cat(parts) if parts else torch.zeros(0)


def pairwise_accuracy(model, tokenizer, pairs: PreferenceSource, batch_size: int = 64) -> dict[str, float]:
    """Share of pairs ranked right (``r⁺ > r⁻``; a tie counts half), mean margin and BT loss.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.rlhf.reward_models import reward_model_from_causal_lm, pairwise_accuracy
        >>> tok = build_tokenizer()
        >>> rm = reward_model_from_causal_lm(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)))
        >>> pairwise_accuracy(rm, tok, [("q", "a", "b")])  # untrained: every pair a tie
        {'accuracy': 0.5, 'margin': 0.0, 'loss': 0.6931471824645996, 'pairs': 1.0}
    """
    pairs = load_preferences(pairs)
    prompts = [p.prompt for p in pairs]
    chosen = _scores_no_grad(model, tokenizer, prompts + prompts, [p.chosen for p in pairs] + [p.rejected for p in pairs],
                             batch_size)
    chosen, rejected = chosen[:len(pairs)], chosen[len(pairs):]
    right = (chosen > rejected).float() + 0.5 * (chosen == rejected).float()
    return {"accuracy": float(right.mean()), "margin": float((chosen - rejected).mean()),
            "loss": float(bradley_terry_loss(chosen, rejected)), "pairs": float(len(pairs))}


def train_reward_model(
    model,
    tokenizer,
    pairs: PreferenceSource,
    *,
    eval_pairs: PreferenceSource | None = None,
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    max_grad_norm: float | None = 1.0,
    seed: int = 0,
    eval_every: int = 0,
    center_rewards_coefficient: float = 0.0,
    callback: Callable[[dict[str, float]], Any] | None = None,
) -> list[dict[str, float]]:
    """Fit ``model`` (a one-label classifier; see :func:`reward_model_from_causal_lm`) to ``pairs``.

    Each step draws ``batch_size`` pairs (seeded, without replacement within an epoch) and takes an
    AdamW step on the Bradley–Terry loss (:func:`bradley_terry_loss`: each pair's ``margin``, 0
    where it has none, and the ``center_rewards_coefficient`` term, as TRL's ``RewardTrainer``).
    Returns one row per step: ``step``, ``loss``, ``accuracy`` and ``margin`` on that batch, plus
    ``eval_accuracy`` / ``eval_margin`` / ``eval_loss`` every ``eval_every`` steps and at the last
    step when ``eval_pairs`` are given. A ``callback`` returning ``False`` stops early.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.rlhf.reward_models import reward_model_from_causal_lm, train_reward_model
        >>> tok = build_tokenizer()
        >>> rm = reward_model_from_causal_lm(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)))
        >>> pairs = [("q", "1234", "abcd"), ("q", "98", "xy")]
        >>> history = train_reward_model(rm, tok, pairs, eval_pairs=pairs, steps=30, batch_size=2, lr=1e-2)
        >>> history[-1]["eval_accuracy"]
        1.0
    """
    from llmgym.runtime.models import flush_denormals

    pairs = load_preferences(pairs)
    eval_set = load_preferences(eval_pairs) if eval_pairs is not None else None
    if steps < 1 or batch_size < 1:
        raise ValueError(f"steps and batch_size must be >= 1, got {steps}, {batch_size}")
    if not center_rewards_coefficient >= 0:
        raise ValueError(f"center_rewards_coefficient must be >= 0 (TRL suggests 0.01), "
                         f"got {center_rewards_coefficient}")
    with_margins = any(p.margin is not None for p in pairs)
    if next(model.parameters()).device.type == "cpu":
        flush_denormals()
    _head(model)  # a clear error now rather than mid-training
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay)
    for module in model.modules():  # dropout would make r(x, y⁺) and r(x, y⁻) two different functions
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    order: list[int] = []
    history = []
    model.train()
    for step in range(1, steps + 1):
        if len(order) < batch_size:
            order += torch.randperm(len(pairs), generator=generator).tolist()
        batch, order = [pairs[i] for i in order[:batch_size]], order[batch_size:]
        prompts = [p.prompt for p in batch]
        rewards = reward_scores(model, tokenizer, prompts + prompts,
                                [p.chosen for p in batch] + [p.rejected for p in batch])
        chosen, rejected = rewards[:len(batch)], rewards[len(batch):]
        margin = torch.tensor([p.margin or 0.0 for p in batch], device=rewards.device) if with_margins else None
        loss = bradley_terry_loss(chosen, rejected, margin, center_rewards_coefficient)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
        row = {"step": step, "loss": float(loss.detach()),
               "accuracy": float((chosen > rejected).float().mean()),
               "margin": float((chosen - rejected).detach().mean())}
        if eval_set is not None and (step == steps or (eval_every and step % eval_every == 0)):
            row.update({f"eval_{k}": v for k, v in pairwise_accuracy(model, tokenizer, eval_set).items() if k != "pairs"})
            model.train()
        history.append(row)
        if callback is not None and callback(row) is False:
            break
    model.eval()
    return history


def fit_reward_model(
    model: str | os.PathLike,
    pairs: PreferenceSource,
    out_dir: str | os.PathLike,
    *,
    eval_pairs: PreferenceSource | None = None,
    held_out: float = 0.1,
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 1e-3,
    weight_decay: float = 0.0,
    seed: int = 0,
    eval_every: int = 50,
    center_rewards_coefficient: float = 0.0,
    callback: Callable[[dict[str, float]], Any] | None = None,
) -> dict[str, Any]:
    """The whole job of ``llmgym rm``: load, train on pairs, evaluate held out, save.

    ``model`` is a causal LM (a directory, a hub id, or ``"tiny"``: a new scalar head goes on its
    backbone) or a reward model saved earlier (training continues). Without ``eval_pairs`` a seeded
    ``held_out`` share of ``pairs`` is held out. Writes the reward model and tokenizer
    (``save_pretrained``) and ``metrics.jsonl`` (one row per step) to ``out_dir``; returns
    ``{"out_dir", "train_pairs", "eval_pairs", "history", "eval"}`` (``eval``: the final
    :func:`pairwise_accuracy` on the held-out pairs).

    Example:
        >>> import tempfile
        >>> from llmgym.rlhf.reward_models import fit_reward_model, RewardModelVerifier
        >>> pairs = [("q", "1234", "abcd"), ("q", "98", "xy"), ("q", "7", "z"), ("q", "55", "ab")]
        >>> with tempfile.TemporaryDirectory() as d:
        ...     report = fit_reward_model("tiny", pairs, d, eval_pairs=pairs, steps=20, batch_size=4, lr=1e-2)
        ...     verifier = RewardModelVerifier(d)
        >>> report["eval"]["accuracy"], report["train_pairs"]
        (1.0, 4)
    """
    from llmgym.runtime.logging import MetricsLogger
    from llmgym.runtime.models import load_model, save_pretrained
    from llmgym.rlhf.preferences import split_preferences

    pairs = load_preferences(pairs)
    if eval_pairs is not None:
        train, test = pairs, load_preferences(eval_pairs)
    elif len(pairs) < 2:
        raise ValueError(f"need at least 2 pairs to hold some out (got {len(pairs)}); or pass eval_pairs")
    else:
        train, test = split_preferences(pairs, held_out=held_out, seed=seed)
    config_path = os.path.join(str(model), "config.json")
    architectures = []
    if os.path.isfile(config_path):
        import json

        with open(config_path, encoding="utf-8") as f:
            architectures = json.load(f).get("architectures") or []
    if any(a.endswith("ForSequenceClassification") for a in architectures):
        rm, tokenizer = load_reward_model(model)
    else:
        lm, tokenizer = load_model(model)
        rm = reward_model_from_causal_lm(lm, tokenizer)
    logger = MetricsLogger(out_dir)

    def log(row: dict[str, float]):
        logger.log(row)
        return callback(row) if callback is not None else None

    try:
        history = train_reward_model(rm, tokenizer, train, eval_pairs=test, steps=steps, batch_size=batch_size, lr=lr,
                                     weight_decay=weight_decay, seed=seed, eval_every=eval_every,
                                     center_rewards_coefficient=center_rewards_coefficient, callback=log)
    finally:
        logger.close()
    save_pretrained(rm, tokenizer, out_dir)
    return {"out_dir": str(out_dir), "train_pairs": len(train), "eval_pairs": len(test), "history": history,
            "eval": pairwise_accuracy(rm, tokenizer, test)}


class RewardModelVerifier(Verifier):
    """A trained reward model as a verifier: ``reward = scale · r(prompt, completion) + shift``.

    Args:
        model: a one-label sequence classifier, or a directory saved with ``save_pretrained``.
        tokenizer: the reward model's tokenizer (loaded with the model when ``model`` is a path).
        batch_size: rows per forward pass in :meth:`verify_batch`.
        scale, shift: an affine map of the raw score (e.g. to centre rewards for the KL leash).
        max_completion_tokens: the most tokens of a completion the model reads: its last ones (the end,
            where the answer sits; the prompt is kept whole). Bounded in tokens, not characters: a
            forward pass grows with tokens, and four-byte text is four byte-level tokens a character.

    ``info`` carries the raw score. Scoring holds no gradient and keeps the model in eval mode.

    Example:
        >>> from llmgym import SequenceEnv, Task
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> from llmgym.rlhf.reward_models import reward_model_from_causal_lm, RewardModelVerifier
        >>> tok = build_tokenizer()
        >>> rm = reward_model_from_causal_lm(build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1)))
        >>> verifier = RewardModelVerifier(rm, tok, shift=0.5)
        >>> env = SequenceEnv([Task("say something:")], verifier)
        >>> _ = env.reset(seed=0)
        >>> env.step("hello")[1]  # a fresh head scores 0; plus the shift
        0.5
        >>> [s.reward for s in verifier.verify_batch([Task("q")] * 2, ["a", "b"])]
        [0.5, 0.5]
    """

    def __init__(self, model, tokenizer=None, *, batch_size: int = 32, scale: float = 1.0, shift: float = 0.0,
                 max_completion_tokens: int = 2048, time_limit: float | None = None):
        super().__init__(time_limit)
        if isinstance(model, (str, os.PathLike)):
            model, loaded_tokenizer = load_reward_model(model)
            tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
        if tokenizer is None:
            raise ValueError("RewardModelVerifier needs the reward model's tokenizer (tokenizer=...)")
        _head(model)
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.model, self.tokenizer = model.eval(), tokenizer
        self.batch_size, self.scale, self.shift = batch_size, float(scale), float(shift)
        if max_completion_tokens < 1:
            raise ValueError(f"max_completion_tokens must be >= 1, got {max_completion_tokens}")
        self.max_completion_tokens = max_completion_tokens
        self._lock = threading.Lock()  # one forward at a time when a thread pool calls in
        self._prefetched: dict[tuple[int, str], Score] = {}

    def raw_scores(self, tasks: Sequence[Task], completions: Sequence[str]) -> torch.Tensor:
        """``[B]`` raw rewards ``r(x, y)``, in batches of ``batch_size``."""
        completions = [keep_last_tokens(self.tokenizer, escape_special_tokens(self.tokenizer, c), self.max_completion_tokens)
                       for c in completions]  # its last tokens, with no special token written as text
        with self._lock:
            return _scores_no_grad(self.model, self.tokenizer, [t.prompt for t in tasks], completions, self.batch_size)

    def _score(self, raw: float) -> Score:
        return Score(self.scale * raw + self.shift, {"reward_model": raw})

    def prefetch(self, tasks: Sequence[Task], completions: Sequence[str]) -> None:
        """Score a rollout turn's completions in batched forward passes; the envs' calls then read them."""
        scores = self.verify_batch(tasks, completions)
        self._prefetched = {(id(t), c): s for t, c, s in zip(tasks, completions, scores)}

    def verify(self, task: Task, completion: str) -> Score:
        prefetched = self._prefetched.pop((id(task), completion), None)
        if prefetched is not None:
            return prefetched
        return self._score(self._raw([task], [completion])[0])

    def _raw(self, tasks: Sequence[Task], completions: Sequence[str]) -> list[float]:
        try:
            return [float(v) for v in self.raw_scores(tasks, completions).tolist()]
        except Exception as exc:  # the model failed: no completion makes a bounded input fail
            raise VerifierUnavailableError(
                f"the reward model failed ({type(exc).__name__}: {exc}): it cannot score, and a 0 would train "
                f"the policy on a lie; check the model (memory, device, max_completion_tokens against its "
                f"context length)") from exc

    def verify_batch(self, tasks: Sequence[Task], completions: Sequence[str],
                     max_workers: int | None = None) -> list[Score]:
        """One batched forward pass per ``batch_size`` rows (``max_workers`` is not needed)."""
        if len(tasks) != len(completions):
            raise ValueError(f"verify_batch got {len(tasks)} tasks but {len(completions)} completions")
        raw = self._raw(tasks, completions)
        scores = []
        for value in raw:
            score = self._score(value)
            scores.append(score if math.isfinite(score.reward) else
                          Score(0.0, {**score.info, "error": f"non-finite reward {score.reward} (scored 0)"}))
        return scores

    def __repr__(self) -> str:
        return f"RewardModelVerifier({type(self.model).__name__}, scale={self.scale}, shift={self.shift})"
