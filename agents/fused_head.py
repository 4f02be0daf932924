"""The LM head, the log-softmax and the entropy in one autograd function: token chunks in, per-token
``log π`` and ``H`` out, and a backward that recomputes each chunk's logits instead of storing them.

For ``K`` tokens with final hidden states ``h`` (``[K, H]``), head weights ``W`` (``[V, H]``) and
targets ``x``: ``z = s · W h (+ b)`` (``s`` the model's logit scale), soft-capped as the model's own
forward does (``c · tanh(z / c)``), divided by the temperature ``T``; then

* ``log π_k = z_k[x_k] − logsumexp(z_k)``,
* ``H_k = −Σ_v p_kv log p_kv`` with ``p_k = softmax(z_k)``.

The backward needs only ``∂/∂z``, per token and vocabulary entry:

* ``∂ log π_k / ∂z_kv = 1[v = x_k] − p_kv``,
* ``∂ H_k / ∂z_kv = −p_kv (log p_kv + H_k)``,

so each chunk's logits are recomputed, turned into ``g = ∂L/∂z`` in place, and multiplied out:
``∂L/∂h = g W``, ``∂L/∂W = gᵀ h`` (accumulated in float32 across chunks), ``∂L/∂b = Σ_k g``. What
autograd keeps between forward and backward is ``h``, the targets and ``H`` (``K`` floats): nothing of
the ``[K, V]`` logits' size, whatever the loss reads. A loss that reads no entropy gets no entropy
term in its backward (the gradient autograd passes is ``None``). This is the computation of
liger-kernel's fused linear losses and TRL's chunked log-prob kernel, in plain torch ops on every
device (the logits of one chunk are the only ``[chunk, V]`` tensors: at most two alive at once).

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

import torch

__all__ = ["HeadLogProbs", "head_logprobs_and_entropy", "compute_dtype"]


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


def _chunk_logits(h: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, scale: float,
                  softcap: float | None, temperature: float) -> torch.Tensor:
    """float32 (or float64) ``[k, V]`` tempered logits of one chunk (``h``, ``w``, ``b`` in the compute dtype)."""
    z = torch.mm(h, w.t()) if b is None else torch.addmm(b, h, w.t())
    z = z.to(torch.promote_types(z.dtype, torch.float32))
    if scale != 1.0:
        z.mul_(scale)
    if softcap:
        z.div_(softcap).tanh_().mul_(softcap)
    if temperature != 1.0:
        z.div_(temperature)
    return z


class HeadLogProbs(torch.autograd.Function):
    """``(log π, H)`` of ``K`` tokens, chunk by chunk; see the module docstring for the formulas.

    ``forward(ctx, hidden [K, H], weight [V, H], bias [V] | None, targets [K], temperature, scale,
    softcap, chunk_size) -> (logprobs [K], entropy [K])``, both float32 (float64 for float64 weights)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature, scale, softcap, chunk_size):
        ctx.set_materialize_grads(False)  # an unused entropy sends None: its backward term is skipped
        dtype = compute_dtype(weight)
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        n = hidden.shape[0]
        out_dtype = torch.promote_types(dtype, torch.float32)
        logprobs = torch.empty(n, dtype=out_dtype, device=hidden.device)
        entropy = torch.empty(n, dtype=out_dtype, device=hidden.device)
        for s in range(0, n, chunk_size):  # (autograd records nothing inside a Function's forward)
            e = min(s + chunk_size, n)
            logp = torch.log_softmax(_chunk_logits(hidden[s:e].to(dtype), w, b, scale, softcap, temperature), -1)
            logprobs[s:e] = logp.gather(-1, targets[s:e, None]).squeeze(-1)
            entropy[s:e] = logp.exp().mul_(logp).sum(-1).neg_()
            del logp
        ctx.save_for_backward(hidden, weight, bias, targets, entropy)
        ctx.options = (dtype, temperature, scale, softcap, chunk_size)
        return logprobs, entropy

    @staticmethod
    def backward(ctx, grad_logprobs, grad_entropy):
        hidden, weight, bias, targets, entropy = ctx.saved_tensors
        dtype, temperature, scale, softcap, chunk_size = ctx.options
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n = hidden.shape[0]
        grad_h = torch.zeros_like(hidden) if need_h else None
        acc = torch.promote_types(dtype, torch.float32)  # float32 accumulation (float64 stays float64)
        grad_w = torch.zeros(weight.shape, dtype=acc, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=acc, device=bias.device) if need_b else None
        if grad_logprobs is None and grad_entropy is None:
            return grad_h, grad_w, grad_b, None, None, None, None, None
        w = weight.to(dtype)
        b = bias.to(dtype) if bias is not None else None
        # z = s·c·tanh(raw/c)/T: the chain rule's scalar part folds into the incoming gradients
        # (g is linear in them), the soft-cap's per-entry factor 1 − tanh² multiplies g below
        outer = scale / temperature
        for s in range(0, n, chunk_size):
            e = min(s + chunk_size, n)
            h = hidden[s:e].to(dtype)
            z = _chunk_logits(h, w, b, scale, softcap, temperature)
            capped = None
            if softcap:  # tanh = z·T / c
                capped = (z * (temperature / softcap)).square_().neg_().add_(1)
            logp = torch.log_softmax(z, -1)
            del z
            a = (grad_logprobs[s:e].to(acc) if grad_logprobs is not None
                 else torch.zeros(e - s, dtype=acc, device=hidden.device)) * outer
            if grad_entropy is not None:
                # g = −p ⊙ (a + c (log p + H)) + a·onehot, with c = ∂L/∂H (scaled like a)
                c = grad_entropy[s:e].to(acc) * outer
                g = logp.exp()
                logp.add_(entropy[s:e, None]).mul_(c[:, None]).add_(a[:, None])
                g.mul_(logp).neg_()
            else:
                g = logp.exp_().mul_(-a[:, None])  # g = −p ⊙ a + a·onehot
            del logp
            g.scatter_add_(-1, targets[s:e, None], a[:, None])
            if capped is not None:
                g.mul_(capped)
                del capped
            if need_h:
                grad_h[s:e] = torch.mm(g.to(dtype), w).to(hidden.dtype)
            if need_w:  # accumulated in float32 across chunks, whatever the compute dtype
                grad_w.addmm_(g.t(), h.to(acc))
            if need_b:
                grad_b.add_(g.sum(0))
            del g
        return (grad_h, grad_w.to(weight.dtype) if need_w else None, grad_b.to(bias.dtype) if need_b else None,
                None, None, None, None, None)


def head_logprobs_and_entropy(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                              targets: torch.Tensor, *, temperature: float = 1.0, scale: float = 1.0,
                              softcap: float | None = None, chunk_size: int = 1024) -> tuple[torch.Tensor, torch.Tensor]:
    """``(log π [K], H [K])`` of the tempered softmax of ``scale · weight @ hidden (+ bias)``, soft-capped.

    Args:
        hidden: ``[K, H]`` final hidden states (the LM head's input), one row per scored token.
        weight, bias: the LM head's ``[V, H]`` weight and ``[V]`` bias (or ``None``).
        targets: ``[K]`` token ids whose log-probabilities are returned.
        temperature: ``T`` the logits are divided by (after the soft-cap, as sampling does).
        scale: the model's logit multiplier (1 for most models).
        softcap: ``c`` of ``c · tanh(z / c)`` (Gemma-2's ``final_logit_softcapping``), or ``None``.
        chunk_size: tokens per chunk: at most two float32 ``[chunk_size, V]`` tensors exist at once.

    Example:
        >>> import torch
        >>> from llmgym.agents.fused_head import head_logprobs_and_entropy
        >>> lp, ent = head_logprobs_and_entropy(torch.zeros(2, 3), torch.zeros(4, 3), None, torch.tensor([0, 1]))
        >>> lp.tolist(), [round(x, 4) for x in ent.tolist()]  # uniform over 4: log(1/4), log 4
        ([-1.3862943649291992, -1.3862943649291992], [1.3863, 1.3863])
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    return HeadLogProbs.apply(hidden, weight, bias, targets.long(), float(temperature), float(scale),
                              float(softcap) if softcap else None, int(chunk_size))
