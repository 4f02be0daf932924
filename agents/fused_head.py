"""The LM head, the log-softmax and the entropy in one autograd function: hidden states in, per-token
``log π`` and ``H`` out, in tiles of tokens × vocabulary entries, and a backward that recomputes each
tile's logits instead of storing them.

For ``K`` tokens with final hidden states ``h`` (``[K, H]``), head weights ``W`` (``[V, H]``) and
targets ``x``: ``z = s · W h (+ b)`` (``s`` the model's logit scale), soft-capped as the model's own
forward does (``c · tanh(z / c)``), divided by the temperature ``T``; then

* ``log π_k = z_k[x_k] − log Z_k`` with ``log Z_k = logsumexp(z_k)``,
* ``H_k = −Σ_v p_kv log p_kv = log Z_k − Σ_v p_kv z_kv`` with ``p_k = softmax(z_k)``.

The forward runs over the vocabulary in tiles with running statistics (online softmax: the max, the
sum of ``e^{z−m}`` and of ``e^{z−m} (z − m)``, the target's logit). The backward needs only ``∂/∂z``,
per token and vocabulary entry, and ``log Z`` and ``H`` make every tile self-contained:

* ``∂ log π_k / ∂z_kv = 1[v = x_k] − p_kv``,
* ``∂ H_k / ∂z_kv = −p_kv (log p_kv + H_k)``,

so each tile's logits are recomputed, turned into ``g = ∂L/∂z`` in place, and multiplied out:
``∂L/∂h = g W``, ``∂L/∂W = gᵀ h`` (accumulated in float32), ``∂L/∂b = Σ_k g``. What autograd keeps
between forward and backward is ``h``, the targets, ``log Z`` and ``H``: nothing of the logits' size,
whatever the loss reads. A loss that reads no entropy gets no entropy term in its backward (the
gradient autograd passes is ``None``). This is the computation of liger-kernel's fused linear losses
and TRL's chunked log-prob kernel, in plain torch ops on every device: one tile's logits (at most two
float32 ``[chunk, tile]`` tensors) and one tile of the weights in the compute dtype exist at a time.

Under ``torch.autocast`` the matrix products run in the autocast dtype (as ``nn.Linear`` would), the
softmax and every accumulation in float32.

Example:
    >>> import torch
    >>> from llmgym.agents.fused_head import head_logprobs_and_entropy
    >>> g = torch.Generator().manual_seed(0)
    >>> h, W = torch.randn(5, 4, generator=g, requires_grad=True), torch.randn(7, 4, generator=g, requires_grad=True)
    >>> x = torch.tensor([0, 3, 6, 1, 1])
    >>> lp, ent = head_logprobs_and_entropy(h, W, None, x, chunk_size=2)
    >>> ref = torch.log_softmax(h @ W.T, -1)
    >>> torch.allclose(lp, ref.gather(-1, x[:, None]).squeeze(-1)), torch.allclose(ent, -(ref.exp() * ref).sum(-1))
    (True, True)
    >>> (lp.sum() + ent.sum()).backward()
    >>> W.grad.shape
    torch.Size([7, 4])
"""

from __future__ import annotations

import warnings
import weakref

import torch

__all__ = ["HeadLogProbs", "head_logprobs_and_entropy", "compute_dtype", "TILE_ELEMENTS", "logit_transform"]

TILE_ELEMENTS = 2**24
"""Logits per tile by default (64 MiB in float32): ``chunk_size`` tokens × ``TILE_ELEMENTS // chunk_size``
vocabulary entries."""


def compute_dtype(weight: torch.Tensor) -> torch.dtype:
    """The dtype the head's matrix products run in: the autocast dtype of ``weight``'s device when
    autocast is on there and ``weight`` is float32 (as ``nn.Linear`` under autocast), else ``weight``'s.

    Example:
        >>> import torch
        >>> from llmgym.agents.fused_head import compute_dtype
        >>> w = torch.zeros(3, 2)
        >>> compute_dtype(w), compute_dtype(w.bfloat16())
        (torch.float32, torch.bfloat16)
        >>> with torch.autocast("cpu", dtype=torch.bfloat16):
        ...     compute_dtype(w)
        torch.bfloat16
    """
    kind = weight.device.type
    if weight.dtype == torch.float32 and torch.is_autocast_enabled(kind):
        return torch.get_autocast_dtype(kind)
    return weight.dtype


def _tile_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, scale: float,
                 softcap: float | None, temperature: float, dtype: torch.dtype) -> torch.Tensor:
    """float32 (float64 for float64 weights) ``[k, v]`` tempered logits of one tile; ``h`` is already in
    the compute ``dtype``, the weight and bias slices are cast here (one tile's worth)."""
    w = w.to(dtype)
    z = torch.mm(h, w.t()) if b is None else torch.addmm(b.to(dtype), h, w.t())
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    if scale != 1.0:
        z.mul_(scale)
    if softcap:
        z.div_(softcap).tanh_().mul_(softcap)
    if temperature != 1.0:
        z.div_(temperature)
    return z


def _tiles(n: int, chunk_size: int, vocab: int, vocab_tile: int):
    """``(token slice, [vocab slices])`` pairs covering ``[n, vocab]``."""
    for s in range(0, n, chunk_size):
        yield slice(s, min(s + chunk_size, n)), [slice(a, min(a + vocab_tile, vocab)) for a in range(0, vocab, vocab_tile)]


class HeadLogProbs(torch.autograd.Function):
    """``(log π, H)`` of ``K`` tokens, in tiles of ``chunk_size`` tokens × ``vocab_tile`` entries; see
    the module docstring for the formulas.

    ``forward(ctx, hidden [K, H], weight [V, H], bias [V] | None, targets [K], temperature, scale,
    softcap, chunk_size, vocab_tile) -> (logprobs [K], entropy [K])``, both float32 (float64 for
    float64 weights). Over the vocabulary tiles of a chunk the forward keeps running statistics
    (max ``m``, ``Σ e^{z−m}``, ``Σ e^{z−m} (z − m)``, the target's logit), so only one tile's logits
    and one tile of the weights in the compute dtype exist at a time."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, scale, softcap, chunk_size, vocab_tile):
        ctx.set_materialize_grads(False)  # an unused entropy sends None: its backward term is skipped
        dtype = compute_dtype(weight)
        acc = torch.promote_types(dtype, torch.float32)
        n, vocab = hidden.shape[0], weight.shape[0]
        log_z = torch.empty(n, dtype=acc, device=hidden.device)
        logprobs = torch.empty(n, dtype=acc, device=hidden.device)
        entropy = torch.empty(n, dtype=acc, device=hidden.device)
        for rows, columns in _tiles(n, chunk_size, vocab, vocab_tile):
            h, x = hidden[rows].to(dtype), targets[rows]
            m = sum_e = sum_ez = target = None
            for cols in columns:
                z = _tile_logits(h, weight[cols], None if bias is None else bias[cols], scale, softcap, temperature, dtype)
                inside = (x >= cols.start) & (x < cols.stop)
                picked = z.gather(-1, (x - cols.start).clamp(0, z.shape[1] - 1)[:, None]).squeeze(-1)
                target = torch.where(inside, picked, target if target is not None else torch.zeros_like(picked))
                tile_max = z.amax(-1)
                if m is None:  # first tile: statistics relative to its max
                    m, rescale = tile_max, None
                else:
                    new_m = torch.maximum(m, tile_max)
                    rescale, shift = torch.exp(m - new_m), m - new_m
                    # Σ e^{z−m}(z−m) re-based to the new max: r·(Σ e(z−m) + (m − m')·Σ e)
                    sum_ez = rescale * (sum_ez + shift * sum_e)
                    sum_e = rescale * sum_e
                    m = new_m
                z.sub_(m[:, None])  # z − m
                e = z.exp()
                tile_e = e.sum(-1)
                tile_ez = e.mul_(z).sum(-1)
                del z, e
                sum_e = tile_e if rescale is None else sum_e + tile_e
                sum_ez = tile_ez if rescale is None else sum_ez + tile_ez
            log_z[rows] = m + sum_e.log()
            logprobs[rows] = target - log_z[rows]
            # H = log Z − Σ p z = log Σe − Σ e(z−m) / Σe
            entropy[rows] = sum_e.log() - sum_ez / sum_e
        ctx.save_for_backward(hidden, weight, bias, targets, log_z, entropy)
        ctx.options = (dtype, temperature, scale, softcap, chunk_size, vocab_tile)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, log_z, entropy = ctx.saved_tensors
        dtype, temperature, scale, softcap, chunk_size, vocab_tile = ctx.options
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        acc = torch.promote_types(dtype, torch.float32)  # float32 accumulation (float64 stays float64)
        n, vocab = hidden.shape[0], weight.shape[0]
        grad_h = torch.zeros_like(hidden) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        if grad_logprobs is None and grad_entropy is None:
            return grad_h, grad_w, grad_b, None, None, None, None, None, None
        # z = s·c·tanh(raw/c)/T: the scalar part of the chain rule folds into the incoming gradients
        # (g is linear in them); the soft-cap's per-entry factor 1 − tanh² multiplies g below
        outer = scale / temperature
        for rows, columns in _tiles(n, chunk_size, vocab, vocab_tile):
            h, x = hidden[rows].to(dtype), targets[rows]
            h_acc = h.to(acc) if need_w else None
            a = (grad_logprobs[rows].to(acc) if grad_logprobs is not None
                 else torch.zeros(h.shape[0], dtype=acc, device=h.device)) * outer
            c = grad_entropy[rows].to(acc) * outer if grad_entropy is not None else None
            gh = torch.zeros(h.shape, dtype=acc, device=h.device) if need_h else None
            for cols in columns:
                w = weight[cols]
                z = _tile_logits(h, w, None if bias is None else bias[cols], scale, softcap, temperature, dtype)
                capped = (z * (temperature / softcap)).square_().neg_().add_(1) if softcap else None  # 1 − tanh²
                logp = z.sub_(log_z[rows, None])
                if c is not None:
                    # g = −p ⊙ (a + c (log p + H)) + a·onehot
                    g = logp.exp()
                    logp.add_(entropy[rows, None]).mul_(c[:, None]).add_(a[:, None])
                    g.mul_(logp).neg_()
                else:
                    g = logp.exp_().mul_(-a[:, None])  # g = −p ⊙ a + a·onehot
                del z, logp
                inside = (x >= cols.start) & (x < cols.stop)
                g.scatter_add_(-1, (x - cols.start).clamp(0, g.shape[1] - 1)[:, None], torch.where(inside, a, 0.0)[:, None])
                if capped is not None:
                    g.mul_(capped)
                    del capped
                if need_h:
                    gh.add_(torch.mm(g.to(dtype), w.to(dtype)))
                if need_w:  # accumulated in float32 across token chunks, whatever the compute dtype
                    grad_w[cols].addmm_(g.t(), h_acc)
                if need_b:
                    grad_b[cols].add_(g.sum(0))
                del g
            if need_h:
                grad_h[rows] = gh.to(hidden.dtype)
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None, None, None, None, None)


def head_logprobs_and_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                              targets: torch.Tensor, *, temperature: float = 1.0, scale: float = 1.0,
                              softcap: float | None = None, chunk_size: int = 1024,
                              vocab_tile: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log π [K], H [K])`` of the tempered softmax of ``scale · weight @ hidden (+ bias)``, soft-capped.

    Args:
        hidden: ``[K, H]`` final hidden states (the LM head's input), one row per scored token.
        weight, bias: the LM head's ``[V, H]`` weight and ``[V]`` bias (or ``None``).
        targets: ``[K]`` token ids whose log-probabilities are returned.
        temperature: ``T`` the logits are divided by (after the soft-cap, as sampling does).
        scale: the model's logit multiplier (1 for most models).
        softcap: ``c`` of ``c · tanh(z / c)`` (Gemma-2's ``final_logit_softcapping``), or ``None``.
        chunk_size: tokens per chunk.
        vocab_tile: vocabulary entries per tile (default: :data:`TILE_ELEMENTS` ``// chunk_size``): at most
            two float32 ``[chunk_size, vocab_tile]`` tensors and one ``[vocab_tile, H]`` slice of the
            weights in the compute dtype exist at once.

    Example:
        >>> import torch
        >>> from llmgym.agents.fused_head import head_logprobs_and_entropy
        >>> lp, ent = head_logprobs_and_entropy(torch.zeros(2, 3), torch.zeros(4, 3), None, torch.tensor([0, 1]))
        >>> lp.tolist(), [round(x, 4) for x in ent.tolist()]  # uniform over 4: log(1/4), log 4
        ([-1.3862943649291992, -1.3862943649291992], [1.3863, 1.3863])
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    tile = max(1, TILE_ELEMENTS // chunk_size) if vocab_tile is None else vocab_tile
    if tile < 1:
        raise ValueError(f"vocab_tile must be >= 1, got {vocab_tile}")
    return HeadLogProbs.apply(hidden, weight, bias, targets.long(), float(temperature), float(scale),
                              float(softcap) if softcap else None, int(chunk_size), int(tile))


_TRANSFORMS: "weakref.WeakKeyDictionary[torch.nn.Module, tuple[float, float | None] | None]" = weakref.WeakKeyDictionary()


def logit_transform(model: torch.nn.Module) -> tuple[float, float | None] | None:
    """``(scale, softcap)`` a causal LM applies to its head's output (``z = softcap·tanh(scale·Wh / softcap)``),
    read from its config and checked once against the model's own logits; ``None`` when the head's
    output transformed so does not reproduce them (a transform this function does not know: the caller
    falls back to the model's full logits, and a warning says so).

    Known: Cohere's ``logit_scale`` (×), Granite's ``logits_scaling`` (÷; HyperCLOVA X ×), Muse
    Glimmer's ``output_multiplier`` (×), Gemma's ``final_logit_softcapping``. ``model`` is the
    ``transformers`` model itself (not a DDP or peft wrapper).

    Example:
        >>> import torch, transformers
        >>> from llmgym.agents.fused_head import logit_transform
        >>> cfg = transformers.GraniteConfig(vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
        ...                                  num_key_value_heads=2, intermediate_size=16, logits_scaling=4.0)
        >>> logit_transform(transformers.GraniteForCausalLM(cfg))
        (0.25, None)
    """
    if model in _TRANSFORMS:
        return _TRANSFORMS[model]
    cfg = model.config.get_text_config()
    scale = 1.0
    for name in ("logit_scale", "output_multiplier"):
        if getattr(cfg, name, None) is not None:
            scale *= float(getattr(cfg, name))
    if getattr(cfg, "logits_scaling", None) is not None:
        multiplies = str(getattr(cfg, "model_type", "")).startswith("hyperclovax")
        scale = scale * float(cfg.logits_scaling) if multiplies else scale / float(cfg.logits_scaling)
    softcap = getattr(cfg, "final_logit_softcapping", None) or None
    head, base = model.get_output_embeddings(), getattr(model, "base_model", None)
    result: tuple[float, float | None] | None = (scale, softcap)
    if head is not None and base is not None and base is not model:
        device = next(model.parameters()).device
        ids = torch.arange(1, 6, device=device).clamp(max=cfg.vocab_size - 1)[None]
        modes = {m: m.training for m in model.modules()}
        model.eval()  # no dropout: both computations see the same function
        try:
            with torch.no_grad(), torch.autocast(device.type, enabled=False):
                want = model(input_ids=ids, use_cache=False).logits[0].float()
                z = head(base(input_ids=ids, use_cache=False).last_hidden_state)[0].float() * scale
                if softcap:
                    z = torch.tanh(z / softcap) * softcap
        finally:
            for m, training in modes.items():
                m.training = training
        if not torch.allclose(z, want, rtol=2e-2, atol=1e-3 * float(want.abs().max()) + 1e-6):
            warnings.warn(f"llmgym: the chunked log-prob head does not reproduce {type(model).__name__}'s logits (a "
                          f"transform of the head's output it does not know): the learner uses the model's full "
                          f"[N, L, V] logits for it (memory grows with tokens × vocabulary)", stacklevel=3)
            result = None
    _TRANSFORMS[model] = result
    return result
