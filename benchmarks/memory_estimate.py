"""GPU memory of one GRPO update, llmgym's and TRL's, estimated without a GPU (fake tensors).

Each cell (side × model shape × completion tokens × mode) runs in a fresh process: the model, the
optimiser and the batch are built inside ``torch._subclasses.fake_tensor.FakeTensorMode`` (tensors with
shapes, dtypes and storages but no data), and a tracker of live storages (``LiveStorages``) records
every storage through one update — forward, loss, backward, gradient clipping, optimiser step — and
its peak, split into weights, gradients, optimiser state, activations and temporaries.

* llmgym: ``GRPO.update(batch)`` — the agent's own public update step — on a fixed batch of
  ``rows`` sequences of ``prompt + tokens`` (every completion full length, the worst case).
* TRL: ``GRPOTrainer.compute_loss`` on the same batch (``prompt_ids``/``completion_ids``…, as its
  ``_generate_and_score_completions`` hands them over), then ``accelerator.backward``, the trainer's
  gradient clipping and its optimiser's ``step`` — TRL's and accelerate's own code. The model is
  wrapped by ``accelerator.prepare_model`` (bf16: autocast around ``forward`` and its logits converted
  to fp32, as in ``Trainer.train``).

Settings follow the measured H100 runs (``benchmarks/gpu_run.sh``): fp32 weights, bf16 autocast
(``bf16-mixed`` / TRL ``bf16=True``), AdamW (fused), β = 0, 4 prompts × 8 samples, prompt 25 tokens,
gradient clipping at 1.0, AdamW's state already allocated (the measured step is the second one).

The estimate is the tracker's peak plus documented terms for what the tracker cannot see (see
``GPU_TERMS`` and ``benchmarks/README.md``). Calibration: ``--calibrate`` runs llmgym's side against a
checkout of the commit the H100 measured (``--llmgym-root``) and TRL's, and prints the error per cell.

    python benchmarks/memory_estimate.py --shapes qwen2-0.5b --tokens 128 --modes plain
    python benchmarks/memory_estimate.py --calibrate --llmgym-root /path/to/checkout-of-5cbf4e9
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MIB = 2**20

SHAPES = {  # Qwen2 configurations (random weights)
    "qwen2-0.5b": {"hidden_size": 896, "num_hidden_layers": 24, "num_attention_heads": 14, "num_key_value_heads": 2,
                   "intermediate_size": 4864, "vocab_size": 151936, "tie_word_embeddings": True},
    "qwen2-7b": {"hidden_size": 3584, "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                 "intermediate_size": 18944, "vocab_size": 152064, "tie_word_embeddings": False},
    # a CPU-sized shape for the CI test of the benchmark itself
    "tiny": {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
             "intermediate_size": 128, "vocab_size": 1024, "tie_word_embeddings": True},
}
MODES = ("plain", "ckpt", "lora")
LORA = {"r": 16, "alpha": 32, "target": "all-linear"}
PROMPT = 25  # "Write digits after 12+7=" in the byte tokenizer, with BOS: the measured runs' prompt length
ROWS = 32  # 4 prompts × 8 samples
COMPONENTS = ("weights", "grads", "optimizer", "activations", "temporaries")

# What fake tensors cannot see, as explicit terms added to the tracker's peak (MiB). Each is a property
# of the CUDA runtime measured on the H100 runs in /work/shared/gpu-results (README), not a fit:
# - "cuda_context_allocated": bytes torch.cuda.max_memory_allocated counts before the step that are
#   neither weights nor optimiser state (the `unaccounted` term of the measured runs' `kept` table:
#   86-90 MiB: cuBLAS workspaces — 32 MiB per stream/handle on Hopper — and small buffers).
GPU_TERMS = {"cuda_context_allocated_mib": 88.0}


# ---------------------------------------------------------------------------------------------
# one cell (in its own process)
# ---------------------------------------------------------------------------------------------


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    return FakeTensorMode(allow_non_fake_inputs=True, shape_env=ShapeEnv(allow_scalar_outputs=True))


def _values_read_as_one():
    """Metrics read out of fake tensors (``float(loss)``, ``.item()``) have no value: read them as 1.0.

    Only logging reads them in either update (checked: the step's control flow reads no tensor value
    on the GRPO path with β = 0 and one epoch)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    real_allclose = torch.allclose

    def allclose(a, b, *args, **kwargs):  # a check of values (llmgym's chunked head checks its transform once)
        if isinstance(a, FakeTensor) or isinstance(b, FakeTensor):
            return True
        return real_allclose(a, b, *args, **kwargs)

    torch.allclose = allclose
    FakeTensor.item = lambda self: 1.0  # 1, not 0: AdamW divides by 1 - beta ** step
    FakeTensor.__float__ = lambda self: 1.0
    FakeTensor.__int__ = lambda self: 1
    FakeTensor.tolist = lambda self: [1.0] * self.numel() if self.dim() else 1.0


def _model(shape: str):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(**SHAPES[shape], max_position_embeddings=4096, rope_theta=1_000_000.0,
                      bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    model = Qwen2ForCausalLM(cfg)
    # a fake module's parameters cannot be swapped (``Module.to``/``_apply``); every module here is already
    # fp32 on the one device (the trainer's move, peft's move of adapters to their base layer's device)
    torch.nn.Module.to = lambda self, *a, **k: self
    return model, torch


class LiveStorages:
    """Every live tensor storage through a block of code, its peak, and what held the peak.

    A ``TorchDispatchMode`` sees each op's outputs; each new storage is counted (its ``nbytes``) until
    the storage object dies (a weakref finaliser). Classes: ``weights`` and ``optimizer`` (the storages of
    the tracked parameters and optimiser state when tracking starts), ``grads`` (the parameters'
    ``.grad`` at the peak), ``activations`` (storages autograd saved for backward: a
    ``saved_tensors_hooks`` pack hook marks them) and ``temporaries`` (everything else: op outputs in
    flight, gradients of activations, logits copies…). Unlike ``MemTracker`` it needs no module hooks, so
    a module called twice in one step (a chunked head, a shared prompt) is fine."""

    def __init__(self, params, optimizer, unbacked_size: int | None = None):
        import weakref

        self.unbacked_size = unbacked_size
        self.unbacked_seen = set()
        self.adopted = 0
        self._weakref = weakref
        self.params = list(params)
        self.param_shapes = {(tuple(p.shape), p.dtype) for p in self.params}
        self.live: dict[int, list] = {}  # id(storage) -> [nbytes, class]
        self.total = 0
        self.by = {"weights": 0, "optimizer": 0, "activations": 0, "temporaries": 0}
        self.peak, self.at_peak, self.top = 0, {}, []
        for p in self.params:
            self._add(p, "weights")
        for state in optimizer.state.values():
            for v in state.values():
                if hasattr(v, "untyped_storage"):
                    self._add(v, "optimizer")
        self._update()

    def _add(self, t, cls: str, op: str = "") -> None:
        st = t.untyped_storage()
        key = id(st)
        if key in self.live:
            return
        n = int(st.nbytes())  # a pinned data-dependent size is a SymInt with a value
        self.live[key] = [n, cls, f"{op} {str(t.dtype).replace('torch.', '')}{list(map(int, t.shape))}"]
        self.total += n
        self.by[cls] += n
        self._weakref.finalize(st, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self.live.pop(key, None)
        if entry is None:  # handed over to the storage that adopted it (see _adopt)
            return
        n, cls, _ = entry
        self.total -= n
        self.by[cls] -= n

    def _pin_unbacked(self, t) -> None:
        """A data-dependent size (``hidden[select]``: the number of selected rows) is a symbol without a
        value on fake tensors; pin each new one to the value the real batch gives it."""
        import torch
        from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols

        for d in t.shape:
            if isinstance(d, torch.SymInt) and free_unbacked_symbols(d):
                if self.unbacked_size is None:
                    raise RuntimeError(f"memory_estimate: a data-dependent size {d} and no value for it")
                torch._check(d == self.unbacked_size)
                self.unbacked_seen.add(str(d.node.expr))

    def _adopt(self, out, acc) -> bool:
        """``out = acc + g`` summing two gradient flows into one parameter (a tied embedding's, from the
        head and from the lookup): the autograd engine's input buffer adds in place on the device
        (``acc.add_(g)``: ``acc`` is its only owner) but out of place here (a fake tensor has more owners).
        Count ``out`` as ``acc``'s storage: no new bytes."""
        entry = self.live.pop(id(acc.untyped_storage()), None)
        if entry is None:
            return False
        st = out.untyped_storage()
        self.live[id(st)] = entry
        self._weakref.finalize(st, self._drop, id(st))
        self.adopted += 1
        return True

    @staticmethod
    def _from_engine() -> bool:
        """Whether the op running now was issued by the autograd engine itself (its nearest Python frame
        is torch's own: ``_engine_run_backward`` or a wrapper), not by Python code such as a custom
        ``backward`` (whose ``a + b`` is out of place on the device too)."""
        import torch

        f = sys._getframe(2)
        while f is not None and f.f_code.co_filename == __file__:
            f = f.f_back
        return f is not None and f.f_code.co_filename.startswith(os.path.dirname(torch.__file__) + os.sep)

    def _saved(self, t) -> None:
        entry = self.live.get(id(t.untyped_storage())) if hasattr(t, "untyped_storage") else None
        if entry is not None and entry[1] == "temporaries":
            entry[1] = "activations"
            self.by["temporaries"] -= entry[0]
            self.by["activations"] += entry[0]

    def _update(self) -> None:
        if self.total <= self.peak:
            return
        self.peak = self.total
        self.top = sorted((e for e in self.live.values() if e[1] in ("activations", "temporaries")),
                          key=lambda e: -e[0])[:6]
        self.top = [f"{e[1][:4]} {e[0] / MIB:.0f} MiB {e[2]}" for e in self.top]
        snap = dict(self.by)
        seen = set()
        for p in self.params:  # gradients are op outputs (temporaries) until they land in .grad
            g = p.grad
            if g is None or id(g.untyped_storage()) in seen:
                continue
            seen.add(id(g.untyped_storage()))
            entry = self.live.get(id(g.untyped_storage()))
            if entry is not None:
                snap[entry[1]] -= entry[0]
                snap["grads"] = snap.get("grads", 0) + entry[0]
        self.at_peak = snap

    def __enter__(self):
        import torch
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                if (func is torch.ops.aten.add.Tensor and torch._C._current_graph_task_id() != -1
                        and tracker._from_engine() and isinstance(out, torch.Tensor) and (tuple(out.shape), out.dtype) in tracker.param_shapes
                        and all(isinstance(x, torch.Tensor) and x.shape == out.shape for x in args[:2])
                        and tracker._adopt(out, args[0])):
                    tracker._update()
                    return out
                for t in tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor) and t.device.type != "meta":
                        tracker._pin_unbacked(t)
                        tracker._add(t, "temporaries", str(func.__name__ if hasattr(func, "__name__") else func))
                tracker._update()
                return out

        def pack(t):
            tracker._saved(t)
            return t

        self._mode = _Mode()
        self._hooks = torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t)
        self._hooks.__enter__()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc):
        self._mode.__exit__(*exc)
        self._hooks.__exit__(*exc)

    def snapshot(self) -> dict:
        out = {k: self.at_peak.get(k, 0) / MIB for k in ("weights", "grads", "optimizer", "activations", "temporaries")}
        out["tracked_peak"] = self.peak / MIB
        return {**{k: round(v, 1) for k, v in out.items()}, "largest_at_peak": self.top,
                "gradient_sums_in_place": self.adopted}


def _warm_optimizer(optimizer, params) -> None:
    """AdamW's state exists before the measured step (the GPU runs measured step 2): allocate it."""
    import torch

    for p in params:
        p.grad = torch.zeros_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _episodes_batch(a):
    """llmgym's Batch of ``rows`` full-length episodes (imports work for today's layout and earlier ones)."""
    import importlib

    for batch_mod, episode_mod in (("llmgym.rollout.episodes", "llmgym.rollout.episodes"),  # the layouts over time
                                   ("llmgym.rollout.batch", "llmgym.rollout.episodes"),
                                   ("llmgym.engines.batch", "llmgym.engines.rollout"), ("llmgym.batch", "llmgym.rollout")):
        try:
            Batch = importlib.import_module(batch_mod).Batch
            Episode = importlib.import_module(episode_mod).Episode
            break
        except (ImportError, AttributeError):
            continue
    else:
        raise ImportError("memory_estimate: no llmgym Batch/Episode in this checkout's known layouts")
    from llmgym import Task

    n = a.prompt + a.tokens
    episodes = []
    for i in range(a.rows):
        # a group's samples share their prompt (as collected); completions differ per row
        ids = [3 + ((i // a.group if j < a.prompt else i) * 7919 + j * 104729) % (SHAPES[a.shape]["vocab_size"] - 3)
               for j in range(n)]
        rewards = [0.0] * n
        rewards[-1] = float(i % 3)
        episodes.append(Episode(Task(f"t{i // a.group}"), i // a.group, ids, [0] * a.prompt + [1] * a.tokens,
                                [0.0] * n, rewards, a.prompt, ["length"]))
    return Batch.from_episodes(episodes, 0)


def _shared_prefixes_from(real_batch, mode) -> None:
    """llmgym's shared-prompt forward plans its split from the batch's values (which rows share which
    prompt), which fake tensors do not have: plan it on the real batch, exactly as the learner would,
    and hand the learner fake copies. Its size test (``8 · saved tokens ≥ tokens``) is decided here on
    real values too: when it fails the learner gets ``None`` and takes the plain forward, as it would."""
    try:
        import llmgym.agents.learner as learner
        import llmgym.agents.shared_prefix as sp
    except ImportError:
        return
    if not hasattr(learner, "shared_prefixes"):  # code from before the shared-prompt forward
        return
    import dataclasses

    import torch
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    real = sp.shared_prefixes

    def planned(input_ids, attention_mask, select):
        if tuple(input_ids.shape) != tuple(real_batch.input_ids.shape):
            raise RuntimeError("memory_estimate: the learner split a batch the estimator did not build "
                               f"({tuple(input_ids.shape)} vs {tuple(real_batch.input_ids.shape)})")
        with unset_fake_temporarily():
            sel = real_batch.action_mask.bool()
            if tuple(sel.shape) != tuple(select.shape):
                raise RuntimeError(f"memory_estimate: select {tuple(select.shape)} is not the action mask's shape")
            split = real(real_batch.input_ids, real_batch.attention_mask, sel)
            if split is None or 8 * split.saved_tokens < int(real_batch.attention_mask.sum()):
                return None
        fake = {f.name: mode.from_tensor(getattr(split, f.name), static_shapes=True) if isinstance(getattr(split, f.name), torch.Tensor)
                else getattr(split, f.name) for f in dataclasses.fields(split)}
        return type(split)(**fake)

    learner.shared_prefixes = planned


def _position_ids_from(real_batch, mode) -> None:
    """The learner gives every row one shared row of positions when the batch is right-padded, a row of
    its own otherwise: a choice read from the mask's values, which fake tensors do not have. Make it on
    the real batch, as the learner would, and hand the learner a fake copy of its positions."""
    import llmgym.agents.learner as learner

    if not hasattr(learner, "_position_ids"):  # code from before: positions per row, computed without a test
        return
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    real = learner._position_ids

    def planned(attention_mask):
        if tuple(attention_mask.shape) != tuple(real_batch.attention_mask.shape):
            raise RuntimeError("memory_estimate: positions of a batch the estimator did not build "
                               f"({tuple(attention_mask.shape)} vs {tuple(real_batch.attention_mask.shape)})")
        with unset_fake_temporarily():
            positions = real(real_batch.attention_mask)
        return mode.from_tensor(positions, static_shapes=True)

    learner._position_ids = planned


def _plain_head_is_plain(mode) -> None:
    """The learner sends a plain ``nn.Linear`` head whose weight is an ``nn.Parameter`` to the fused
    vocabulary-tiled head; a fake parameter fails that ``type(...) is`` test, so it would take the
    module-head route instead (a different memory profile). Route a plain Linear head as on the GPU."""
    import llmgym.agents.learner as learner

    if not hasattr(learner, "_module_head_logprobs") or not hasattr(learner, "head_logprobs_and_entropy"):
        return
    import torch

    module_route = learner._module_head_logprobs

    def route(head, hidden, targets, temperature, scale, softcap, rows):
        if type(head) is torch.nn.Linear:  # what the learner does for it on real tensors
            chunk = learner.default_chunk_size(head.weight.shape[0])
            return learner.head_logprobs_and_entropy(hidden, head.weight, head.bias, targets, temperature=temperature,
                                                     scale=scale, softcap=softcap, chunk_size=chunk)
        return module_route(head, hidden, targets, temperature, scale, softcap, rows)

    learner._module_head_logprobs = route


def cell_llmgym(a) -> dict:
    import torch

    if a.llmgym_root:
        sys.path.insert(0, a.llmgym_root)
    import llmgym

    root = Path(a.llmgym_root) if a.llmgym_root else ROOT
    if str(root) not in [str(Path(p)) for p in llmgym.__path__]:
        llmgym.__path__.append(str(root))  # llmgym.agents -> agents/, llmgym.envs -> envs/
    from llmgym.agents import GRPO

    try:
        from llmgym.runtime.models import build_tokenizer
    except ImportError:
        from llmgym.models import build_tokenizer

    _values_read_as_one()
    real_batch = _episodes_batch(a)  # real tensors: the shared-prompt split reads their values
    sampled = int(real_batch.action_mask.sum())
    mode = _fake_mode()
    _shared_prefixes_from(real_batch, mode)
    _position_ids_from(real_batch, mode)
    _plain_head_is_plain(mode)
    with mode:
        model, _ = _model(a.shape)
        tok = build_tokenizer()
        kw = {"lora_r": LORA["r"], "lora_alpha": LORA["alpha"]} if a.mode == "lora" else {}
        agent = GRPO(model, tok, group_size=a.group, kl_coef=0.0, max_new_tokens=a.tokens, lr=1e-4, seed=0,
                     precision=a.precision, gradient_checkpointing=a.mode == "ckpt", loss_agg="seq-mean-token-mean",
                     max_grad_norm=1.0, **kw)
        params = [p for p in agent.parameters() if p.requires_grad]
        if not agent.optimizer.defaults.get("fused"):
            # make_optimizer picks the fused AdamW for plain CPU/CUDA tensors; its type check sees a
            # FakeTensor here: build what it builds on the GPU
            group = agent.optimizer.param_groups[0]
            agent.optimizer = torch.optim.AdamW(params, lr=group["lr"], weight_decay=group["weight_decay"], fused=True)
        _warm_optimizer(agent.optimizer, params)
        batch = agent.prepare(real_batch)
        # the only data-dependent size on this path: the sampled tokens picked out of the hidden states
        tracker = LiveStorages(agent.model.parameters(), agent.optimizer,
                               unbacked_size=sampled)
        t0 = time.perf_counter()
        with tracker:
            agent.update(batch)
        return {**tracker.snapshot(), "pinned_sizes": len(tracker.unbacked_seen),
                "code": str(Path(sys.modules[GRPO.__module__].__file__).parents[1]), "trained_params_m": round(sum(p.numel() for p in params) / 1e6, 2),
                "cell_s": round(time.perf_counter() - t0, 1)}


class _TritonLaunch:
    """A Triton kernel launch (``kernel[grid](...)``) as memory sees it: it writes into the buffers it is
    handed and allocates nothing."""

    def __getitem__(self, grid):
        return lambda *args, **kwargs: None


def _trl_cuda_head() -> bool:
    """TRL's chunked log-prob head takes its CUDA path: on a Triton device it scores only the completion
    positions (``hidden[mask]``) and folds each ``[4096, 32768]`` logits tile in a Triton kernel that
    writes into preallocated buffers; its CPU fallback (``_forward_tile``/``_backward_tile`` in torch)
    materialises several fp32 tiles (512 MiB each) that the GPU never allocates; the fp32 accumulation
    of the gradients differs the same way (below). Only the memory of the kernels is modelled (they allocate nothing); the matmuls into the tile buffer stay TRL's own."""
    try:
        import trl.kernels.chunked_logprob as ck
        import trl.trainer.utils as tu
    except ImportError:
        return False
    ck._use_triton = lambda device: True
    tu._use_triton = lambda device: True
    ck._forward_kernel = ck._backward_kernel = _TritonLaunch()
    # its fp32 accumulation ``acc += tile @ w``: on CUDA one ``addmm(out_dtype=float32, out=acc)`` that
    # writes into ``acc``; the CPU branch first makes fp32 copies of both operands (the tile: 512 MiB)
    ck._addmm_fp32 = lambda acc, a, b: None
    return True


def cell_trl(a) -> dict:
    import tempfile

    import torch

    import trl.trainer.grpo_trainer as gt
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    sys.path.insert(0, str(ROOT))
    try:
        from llmgym.runtime.models import build_tokenizer
    except ImportError:
        from llmgym.models import build_tokenizer

    _values_read_as_one()
    gt.nanmin = lambda t: torch.zeros((), device=t.device)  # logging-only, data-dependent
    gt.nanmax = lambda t: torch.zeros((), device=t.device)
    cuda_head = _trl_cuda_head()
    with _fake_mode():
        model, _ = _model(a.shape)
        tok = build_tokenizer()
        peft_config = None
        if a.mode == "lora":
            from peft import LoraConfig

            peft_config = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["target"],
                                     lora_dropout=0.0, task_type="CAUSAL_LM")
        config = GRPOConfig(
            output_dir=tempfile.mkdtemp(prefix="trl-mem-"), per_device_train_batch_size=a.rows,
            gradient_accumulation_steps=1, num_generations=a.group, max_completion_length=a.tokens, beta=0.0,
            learning_rate=1e-4, max_steps=1, logging_steps=10_000, save_strategy="no", report_to="none",
            use_cpu=True, bf16=a.precision == "bf16-mixed", gradient_checkpointing=a.mode == "ckpt",
            loss_type="grpo", temperature=1.0, seed=0, disable_dropout=True, dataloader_num_workers=0,
            max_grad_norm=1.0)
        data = Dataset.from_list([{"prompt": "x"}] * a.rows)
        trainer = GRPOTrainer(model=model, reward_funcs=[lambda completions, **kw: [0.0] * len(completions)],
                              args=config, train_dataset=data, processing_class=tok, peft_config=peft_config)
        trainer.current_gradient_accumulation_steps = 1  # set by the training loop
        trainer.create_optimizer_and_scheduler(num_training_steps=1)
        wrapped = trainer.accelerator.prepare_model(trainer.model)  # autocast + fp32 outputs, as train() does
        if a.mode == "ckpt":
            trainer.model.gradient_checkpointing_enable(
                gradient_checkpointing_kwargs=config.gradient_checkpointing_kwargs or {"use_reentrant": False})
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        _warm_optimizer(trainer.optimizer, params)
        dev = params[0].device
        g = torch.Generator().manual_seed(0)
        inputs = {
            "prompt_ids": torch.randint(3, SHAPES[a.shape]["vocab_size"], (a.rows, a.prompt), generator=g).to(dev),
            "prompt_mask": torch.ones(a.rows, a.prompt, dtype=torch.long, device=dev),
            "completion_ids": torch.randint(3, SHAPES[a.shape]["vocab_size"], (a.rows, a.tokens), generator=g).to(dev),
            "completion_mask": torch.ones(a.rows, a.tokens, dtype=torch.long, device=dev),
            "advantages": torch.randn(a.rows, generator=g).to(dev),
            "num_items_in_batch": torch.tensor(a.rows * a.tokens, device=dev),
            "old_per_token_logps": None,
        }
        trainer.model.train()
        # the CUDA head's hidden[mask]: every completion token is scored (all masks are ones)
        tracker = LiveStorages(trainer.model.parameters(), trainer.optimizer, unbacked_size=a.rows * a.tokens)
        t0 = time.perf_counter()
        with tracker:
            loss = trainer.compute_loss(wrapped, inputs, num_items_in_batch=inputs["num_items_in_batch"])
            trainer.accelerator.backward(loss)
            trainer.accelerator.clip_grad_norm_(trainer.model.parameters(), config.max_grad_norm)
            trainer.optimizer.step()
            trainer.model.zero_grad(set_to_none=True)
        return {**tracker.snapshot(), "trl_cuda_head": cuda_head, "pinned_sizes": len(tracker.unbacked_seen), "trained_params_m": round(sum(p.numel() for p in params) / 1e6, 2),
                "cell_s": round(time.perf_counter() - t0, 1)}


def run_cell(a) -> None:
    import torch

    torch.set_num_threads(1)
    torch.set_default_dtype(torch.float32)  # fp32 weights under bf16 autocast, as the measured runs
    # "both": the two sides one after the other in one process, for a quick check of the benchmark
    # itself (each side's adjustments touch only its own code); the grid runs each side alone
    for side in ("llmgym", "trl") if a.side == "both" else (a.side,):
        out = (cell_llmgym if side == "llmgym" else cell_trl)(a)
        out["estimate_mib"] = round(out["tracked_peak"] + GPU_TERMS["cuda_context_allocated_mib"], 1)
        print("RESULT " + json.dumps({"side": side, **out}), flush=True)


# ---------------------------------------------------------------------------------------------
# the driver
# ---------------------------------------------------------------------------------------------


def spawn(side: str, shape: str, tokens: int, mode: str, *, rows: int = ROWS, group: int = 8, prompt: int = PROMPT,
          llmgym_root: str | None = None, timeout: float = 1800) -> dict:
    """One cell in a fresh process; its result dict, or ``{"error": ...}``."""
    cmd = [sys.executable, __file__, "--cell", side, "--shape", shape, "--tokens", str(tokens), "--mode", mode,
           "--rows", str(rows), "--group", str(group), "--prompt", str(prompt)]
    if llmgym_root:
        cmd += ["--llmgym-root", llmgym_root]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    path = [llmgym_root] if (llmgym_root and side != "trl") else [str(ROOT)]
    env["PYTHONPATH"] = os.pathsep.join(path + [p for p in [os.environ.get("PYTHONPATH")] if p])
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    results = {}
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[len("RESULT "):])
            results[r.pop("side")] = r
    if results and (side != "both" or len(results) == 2):
        return results if side == "both" else results[side]
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-4:]
    return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}


# the H100 runs (gpu-results/h100-2026-11-26, commit 5cbf4e9): max allocated MiB over the measured step
MEASURED_H100 = {
    ("llmgym", 128, "plain"): 19943.16, ("llmgym", 128, "ckpt"): 12939.0, ("llmgym", 512, "plain"): 54282.0,
    ("trl", 128, "plain"): 15253.2, ("trl", 128, "ckpt"): 8183.0, ("trl", 512, "plain"): 35353.0,
}


def load_measured(folder: Path) -> dict:
    """The measured peaks from the H100 result files (the table above when the folder is absent)."""
    out = dict(MEASURED_H100)
    files = {("llmgym", 128, "plain"): "mem_llmgym_128_nock.json", ("llmgym", 128, "ckpt"): "mem_llmgym_128_ckpt.json",
             ("llmgym", 512, "plain"): "mem_llmgym_512_nock.json"}
    for key, name in files.items():
        p = folder / name
        if p.exists():
            out[key] = json.loads(p.read_text())["terms"]["step_peak_mib"]
    for key, name in {("trl", 128, "plain"): "a/memory_timeline_128.json",
                      ("trl", 128, "ckpt"): "a/memory_timeline_128_ckpt.json"}.items():
        p = folder / name
        if p.exists():
            out[key] = json.loads(p.read_text())["trl"]["terms"]["step_peak_mib"]
    return out


def _table(title: str, columns: list[str], rows: list[list]) -> None:
    try:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=title)
        for c in columns:
            t.add_column(c, justify="right" if c not in ("shape", "mode", "side") else "left")
        for r in rows:
            t.add_row(*[str(x) for x in r])
        Console(width=200).print(t)
    except ImportError:
        print(title)
        print(" | ".join(columns))
        for r in rows:
            print(" | ".join(str(x) for x in r))


def _comp(r: dict) -> str:
    if "error" in r:
        return "error"
    return " ".join(f"{k[:3]} {r[k]:.0f}" for k in COMPONENTS if r.get(k))


def grid(a) -> dict:
    cells = []
    for shape in a.shapes:
        for tokens in a.tokens_list:
            for mode in a.modes:
                row = {"shape": shape, "tokens": tokens, "mode": mode}
                for side in ("llmgym", "trl"):
                    row[side] = spawn(side, shape, tokens, mode, rows=a.rows, group=a.group, prompt=a.prompt,
                                      timeout=a.timeout)
                    print(f"{shape} {tokens} {mode} {side}: {row[side]}", file=sys.stderr, flush=True)
                ok = all("error" not in row[s] for s in ("llmgym", "trl"))
                row["ratio"] = round(row["llmgym"]["estimate_mib"] / row["trl"]["estimate_mib"], 3) if ok else None
                cells.append(row)
    _table("GRPO update peak, estimated (MiB; fake tensors + GPU terms)",
           ["shape", "tokens", "mode", "llmgym", "TRL", "ratio", "llmgym composition", "TRL composition"],
           [[c["shape"], c["tokens"], c["mode"], c["llmgym"].get("estimate_mib", "-"), c["trl"].get("estimate_mib", "-"),
             c["ratio"] or "-", _comp(c["llmgym"]), _comp(c["trl"])] for c in cells])
    return {"cells": cells}


def calibrate(a) -> dict:
    measured = load_measured(Path(a.measured))
    rows = []
    for (side, tokens, mode), peak in measured.items():
        r = spawn(side, "qwen2-0.5b", tokens, mode, rows=ROWS, group=8, prompt=PROMPT,
                  llmgym_root=a.llmgym_root if side == "llmgym" else None, timeout=a.timeout)
        print(f"calibrate {side} {tokens} {mode}: {r}", file=sys.stderr, flush=True)
        err = round(r["estimate_mib"] / peak - 1, 3) if "error" not in r else None
        rows.append({"side": side, "tokens": tokens, "mode": mode, "measured_mib": peak, "estimate": r, "error": err})
    _table("Calibration against the H100 (commit 5cbf4e9, Qwen2-0.5B shape, 32 rows, bf16 autocast)",
           ["side", "tokens", "mode", "measured", "estimate", "error", "composition"],
           [[r["side"], r["tokens"], r["mode"], r["measured_mib"], r["estimate"].get("estimate_mib", "-"),
             f"{r['error']:+.1%}" if r["error"] is not None else r["estimate"].get("error"), _comp(r["estimate"])]
            for r in rows])
    return {"calibration": rows, "llmgym_root": a.llmgym_root}


def meta() -> dict:
    """What produced the numbers: the date, the load, the libraries (fake tensors cost only CPU time)."""
    import importlib.metadata as md

    versions = {}
    for name in ("torch", "transformers", "trl", "peft", "accelerate"):
        try:
            versions[name] = md.version(name)
        except md.PackageNotFoundError:
            versions[name] = None
    return {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_avg_1_5_15": list(os.getloadavg()),
            "versions": versions, "rows": ROWS, "prompt": PROMPT, "precision": "bf16-mixed (fp32 weights)"}


def notes(report: dict) -> str:
    """``results/notes_memory_estimate.md``: the calibration and the grid as tables (docs/benchmarks.md
    includes ``notes_*.md`` as they are)."""
    m = report.get("meta", {})
    cm = report.get("calibration_meta", {})
    out = ["## GPU memory of one GRPO update, estimated without a GPU", "",
           "`benchmarks/memory_estimate.py` (method: `benchmarks/README.md`, \"GPU memory without a GPU\"): "
           "fake tensors, one process per cell; the number is `max_memory_allocated` of the update step. "
           "Qwen2 shapes with fp32 weights, bf16 autocast, 4 prompts × 8 samples, prompt 25 tokens, every "
           "completion full length, β = 0, AdamW, LoRA r 16 on all linear layers.", ""]
    if report.get("calibration"):
        out += [f"**Calibration** against the measured H100 runs of commit 5cbf4e9 (NVIDIA H100 80GB, "
                f"Qwen2-0.5B shape; estimator run {cm.get('date', '?')}, load {cm.get('load_avg_1_5_15', ['?'])[0]:.1f} "
                "on 2 shared cores — fake tensors cost CPU time only, the numbers do not depend on load):", "",
                "| side | tokens | mode | measured MiB | estimated MiB | error | estimate: weights / grads / optimiser / activations / temporaries (+ 88 CUDA context) |",
                "|---|---|---|---|---|---|---|"]
        for r in report["calibration"]:
            e = r["estimate"]
            comp = " / ".join(f"{e.get(k, 0):,.0f}" for k in COMPONENTS) if "error" not in e else e["error"]
            err = f"{r['error']:+.1%}" if r["error"] is not None else "—"
            out.append(f"| {r['side']} | {r['tokens']} | {r['mode']} | {r['measured_mib']:,.0f} | "
                       f"{e.get('estimate_mib', float('nan')):,.0f} | {err} | {comp} |")
        out.append("")
    if report.get("cells"):
        reused = m.get("trl_side_from_previous_run")
        out += [f"**Today's code**, llmgym vs TRL {m.get('versions', {}).get('trl', '?')} (run {m.get('date', '?')}); "
                "ratio = llmgym / TRL" + (f" (TRL's side of {', '.join(reused)} from the run of {m.get('trl_previous_run', '?')}: "
                                          "TRL's code and the estimator's TRL side unchanged since, and the TRL cells run again "
                                          "reproduced their peaks to 0.1 MiB)" if reused else "") + ":", "",
                "| shape | tokens | mode | llmgym MiB | TRL MiB | ratio | llmgym: grads / activations / temporaries | TRL: grads / activations / temporaries |",
                "|---|---|---|---|---|---|---|---|"]
        for c in report["cells"]:
            def part(r):
                return "error" if "error" in r else " / ".join(f"{r[k]:,.0f}" for k in ("grads", "activations", "temporaries"))
            est = [c[s].get("estimate_mib") for s in ("llmgym", "trl")]
            cells = [f"{v:,.0f}" if v is not None else "not run" for v in est]
            ratio = f"{c['ratio']:.2f}×" if c.get("ratio") else "—"
            out.append(f"| {c['shape']} | {c['tokens']:,} | {c['mode']} | {cells[0]} | {cells[1]} | {ratio} | "
                       f"{part(c['llmgym'])} | {part(c['trl'])} |")
        out.append("")
    return "\n".join(out)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cell", choices=["llmgym", "trl", "both"], dest="side", help=argparse.SUPPRESS)
    p.add_argument("--shape", default="qwen2-0.5b", help=argparse.SUPPRESS)
    p.add_argument("--mode", default="plain", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--tokens", type=int, default=128, help=argparse.SUPPRESS)
    p.add_argument("--shapes", default="qwen2-0.5b,qwen2-7b", type=lambda s: s.split(","))
    p.add_argument("--tokens-list", "--token-counts", dest="tokens_list", default="128,512,2048",
                   type=lambda s: [int(x) for x in s.split(",")])
    p.add_argument("--modes", default=",".join(MODES), type=lambda s: s.split(","))
    p.add_argument("--rows", type=int, default=ROWS)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--prompt", type=int, default=PROMPT)
    p.add_argument("--precision", default="bf16-mixed", choices=["bf16-mixed"], help=argparse.SUPPRESS)
    p.add_argument("--timeout", type=float, default=3600, help="seconds per cell")
    p.add_argument("--calibrate", action="store_true", help="compare with the measured H100 peaks")
    p.add_argument("--llmgym-root", default=None, help="a checkout whose llmgym side to run (calibration: 5cbf4e9's)")
    p.add_argument("--measured", default="/work/shared/gpu-results/h100-2026-11-26")
    p.add_argument("--notes", action="store_true",
                   help="write results/notes_memory_estimate.md from the JSON (no cells run)")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "memory_estimate.json"))
    return p


def main(argv=None) -> dict:
    a = parser().parse_args(argv)
    if a.side:
        run_cell(a)
        return {}
    for s in a.shapes:
        if s not in SHAPES:
            raise SystemExit(f"unknown shape {s!r}: choose from {', '.join(SHAPES)}")
    for m in a.modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}: choose from {', '.join(MODES)}")
    if a.notes:
        report = json.loads(Path(a.out).read_text())
        (Path(a.out).parent / "notes_memory_estimate.md").write_text(notes(report))
        return report
    if a.calibrate and not a.llmgym_root:
        raise SystemExit("--calibrate needs --llmgym-root: a checkout of the measured commit "
                         "(git worktree add ../at-5cbf4e9 5cbf4e9)")
    report = calibrate(a) if a.calibrate else grid(a)
    report["gpu_terms"] = GPU_TERMS
    report["meta" if not a.calibrate else "calibration_meta"] = meta()
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(out.read_text()) if out.exists() else {}
    old.update(report)
    out.write_text(json.dumps(old, indent=1))
    return report


if __name__ == "__main__":
    main()
