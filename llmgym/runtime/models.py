"""Tiny causal language models built locally, and the ordinary loading path for real ones.

No hub downloads happen in tests or in the default run: :func:`build_tiny_model` makes a random-init
``LlamaConfig`` model and :func:`build_tokenizer` a byte-level tokenizer (every byte is one token, so
any text round-trips exactly and digits are single tokens). Both are saved and loaded through
``from_pretrained``, the same code path :func:`load_model` uses for a real checkpoint, given by a
local path or (with the user's network) a hub id.

:func:`supervised_warmup` runs a short teacher-forced fine-tune on ``(prompt, answer)`` pairs, so a
tiny model starts imperfect but not hopeless before RL.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
from pathlib import Path
from typing import Iterable, Sequence

import torch

from llmgym.errors import LLMGymError

__all__ = [
    "ModelFileError",
    "TinyModelConfig",
    "build_tokenizer",
    "build_tiny_model",
    "save_pretrained",
    "load_model",
    "load_tokenizer",
    "supervised_warmup",
    "cache_dir",
    "flush_denormals",
    "looks_like_hub_id",
]



class ModelFileError(LLMGymError, OSError):
    """A model directory whose weights file, or another of its files (``config.json``, the tokenizer's), cannot be
    read (damaged, cut short, or not a model's).

    Attributes: ``path`` (the file) and ``reason`` (the reader's first line)."""

    def __init__(self, message: str, path: str = "", reason: str = ""):
        super().__init__(message)
        self.path, self.reason = path, reason


PAD, BOS, EOS = "<pad>", "<s>", "</s>"
# A minimal chat template, so chat-message prompts render with the tiny tokenizer too: one line per
# turn, ``<|role|>content``. It has tool roles, compactly (tests and tool envs run on it): ``tools=``
# become one ``<|tools|>name(arg, ...)`` line, an assistant's ``tool_calls`` are written in the Hermes
# format ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, a tool result is a ``<|tool|>`` turn.
CHAT_TEMPLATE = (
    "{% if tools %}<|tools|>{% for t in tools %}{% set f = t.function if t.function is defined else t %}"
    "{{ f.name }}({{ (f.parameters.properties if f.parameters is defined and f.parameters.properties is defined "
    "else {}) | join(', ') }}){% if not loop.last %} {% endif %}{% endfor %}{{ '\\n' }}{% endif %}"
    "{% for m in messages %}<|{{ m['role'] }}|>{% if m['content'] is string %}{{ m['content'] }}{% endif %}"
    "{% for c in m['tool_calls'] or [] %}{% set f = c.function if c.function is defined else c %}"
    "<tool_call>{{ {'name': f.name, 'arguments': f.arguments} | tojson }}</tool_call>{% endfor %}"
    "{{ '\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def cache_dir() -> Path:
    """Where built models are cached: ``$LLMGYM_CACHE`` or ``~/.cache/llmgym``.

    Example:
        >>> from llmgym.runtime.models import cache_dir
        >>> cache_dir().name in ("llmgym",) or "LLMGYM_CACHE" in __import__("os").environ
        True
    """
    return Path(os.environ.get("LLMGYM_CACHE", Path.home() / ".cache" / "llmgym"))


def build_tokenizer():
    """A byte-level tokenizer: 256 byte tokens plus ``<pad>``, ``<s>`` (BOS), ``</s>`` (EOS).

    Encoding prepends BOS; padding is on the left (what batched generation needs).

    Example:
        >>> from llmgym.runtime.models import build_tokenizer
        >>> tok = build_tokenizer()
        >>> len(tok), tok.eos_token, tok.padding_side
        (259, '</s>', 'left')
        >>> ids = tok.encode("12+3=")
        >>> ids[0] == tok.bos_token_id, tok.decode(ids, skip_special_tokens=True)
        (True, '12+3=')
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {tok: i for i, tok in enumerate([PAD, BOS, EOS] + sorted(alphabet))}
    core = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=None))
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    core.decoder = decoders.ByteLevel()
    core.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, 1)]
    )
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


@dataclasses.dataclass(frozen=True)
class TinyModelConfig:
    """Shape of a tiny Llama-style model (defaults: ~0.8M parameters, fast on 2 CPU cores).

    Example:
        >>> from llmgym.runtime.models import TinyModelConfig
        >>> TinyModelConfig(hidden_size=64).hidden_size
        64
    """

    hidden_size: int = 128
    num_layers: int = 4
    num_heads: int = 4
    intermediate_size: int = 512
    max_position_embeddings: int = 512
    seed: int = 0


def build_tiny_model(tokenizer=None, config: TinyModelConfig | None = None):
    """A random-init ``LlamaForCausalLM`` sized by ``config``, matching ``tokenizer``'s vocabulary.

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, TinyModelConfig
        >>> tok = build_tokenizer()
        >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> model.config.vocab_size == len(tok), model.config.eos_token_id == tok.eos_token_id
        (True, True)
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = tokenizer if tokenizer is not None else build_tokenizer()
    config = config or TinyModelConfig()
    llama = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        max_position_embeddings=config.max_position_embeddings,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)
        model = LlamaForCausalLM(llama)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model


def save_pretrained(model, tokenizer, path: str | os.PathLike) -> Path:
    """Save model and tokenizer with ``save_pretrained`` so :func:`load_model` reads them back.

    Example:
        >>> import tempfile
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, save_pretrained, load_model, TinyModelConfig
        >>> tok = build_tokenizer()
        >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> with tempfile.TemporaryDirectory() as d:
        ...     _ = save_pretrained(model, tok, d)
        ...     loaded, tok2 = load_model(d)
        >>> type(loaded).__name__, tok2.decode(tok2.encode("hi"), skip_special_tokens=True)
        ('LlamaForCausalLM', 'hi')
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def load_tokenizer(name_or_path: str | os.PathLike):
    """Load a tokenizer by local path or hub id; set left padding and a pad token for generation.

    Example:
        >>> from llmgym.runtime.models import load_tokenizer
        >>> load_tokenizer("/no/such/model")
        Traceback (most recent call last):
        ...
        FileNotFoundError: no model at '/no/such/model': ...
    """
    from transformers import AutoTokenizer

    _check_exists(name_or_path)
    tokenizer = AutoTokenizer.from_pretrained(str(name_or_path))
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(name_or_path: str | os.PathLike, *, dtype: torch.dtype | None = None, device: str | None = None):
    """Load ``(model, tokenizer)``: a Hugging Face causal LM by local path, or by hub id.

    A local directory needs no network; a hub id needs the user's network (or a filled HF cache).
    The string ``"tiny"`` builds (and caches) the default tiny model instead. A damaged weights file raises
    :class:`ModelFileError` (one line naming the file).

    Example:
        >>> from llmgym.runtime.models import load_model
        >>> model, tok = load_model("tiny")
        >>> model.config.model_type
        'llama'
    """
    from transformers import AutoModelForCausalLM

    tiny = str(name_or_path) == "tiny"
    if tiny:
        name_or_path = tiny_model_path()
    from safetensors import SafetensorError

    local = Path(name_or_path).is_dir()
    try:
        tokenizer = load_tokenizer(name_or_path)
        with _no_loading_bar(tiny):  # a bar for a megabyte of local weights is noise; a real model keeps it
            model = AutoModelForCausalLM.from_pretrained(str(name_or_path), **_dtype_kwarg(dtype or torch.float32))
    except SafetensorError as exc:  # a damaged or foreign weights file: one line, not safetensors' traceback
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        where = Path(name_or_path) / "model.safetensors" if local else name_or_path
        raise ModelFileError(f"cannot read the model weights {str(where)!r} ({first}): the file is damaged or "
                             f"not a model's; save the model again, or use another checkpoint",
                             str(where), first) from None
    except (ValueError, OSError) as exc:
        if not local or isinstance(exc, ModelFileError):
            raise
        # any other file of a local model directory (config.json, tokenizer.json, ...) that does not read: one line
        first = " ".join(((str(exc).strip().splitlines() or [""])[0] or type(exc).__name__).split())[:200]
        raise ModelFileError(f"cannot read the model directory {str(name_or_path)!r} ({first}): a file of it is "
                             f"damaged or not a model's; save the model again, or use another checkpoint",
                             str(name_or_path), first) from None
    if device is not None:
        model.to(device)
    if model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


@contextlib.contextmanager
def _no_loading_bar(quiet: bool = True):
    """Within the block, no ``transformers`` progress bar ("Loading weights ..."); the setting is
    restored after, and warnings and log messages are untouched."""
    from transformers.utils import logging as hf_logging

    was_enabled = quiet and hf_logging.is_progress_bar_enabled()
    if was_enabled:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            hf_logging.enable_progress_bar()


def _transformers_version() -> tuple[int, int]:
    import transformers

    major, minor = transformers.__version__.split(".")[:2]
    return int(major), int("".join(ch for ch in minor if ch.isdigit()) or 0)


def _dtype_kwarg(dtype: torch.dtype) -> dict[str, torch.dtype]:
    """``from_pretrained``'s dtype keyword: ``dtype`` since transformers 4.56, ``torch_dtype`` before."""
    return {"dtype": dtype} if _transformers_version() >= (4, 56) else {"torch_dtype": dtype}


def tiny_model_path(config: TinyModelConfig | None = None) -> Path:
    """Build the random-init tiny model once and return its cached directory.

    The cache is per transformers major version: a tokenizer saved by transformers 5 names a class
    (``TokenizersBackend``) that transformers 4 cannot load."""
    config = config or TinyModelConfig()
    key = {**dataclasses.asdict(config), "transformers_major": _transformers_version()[0],
           "chat_template": hashlib.sha1(CHAT_TEMPLATE.encode()).hexdigest()[:10]}  # a new template, a new cache
    digest = hashlib.sha1(json.dumps(key, sort_keys=True).encode()).hexdigest()[:10]
    path = cache_dir() / f"tiny-{digest}"
    if not (path / "config.json").exists():
        tokenizer = build_tokenizer()
        tmp = path.with_name(path.name + f".tmp{os.getpid()}")
        save_pretrained(build_tiny_model(tokenizer, config), tokenizer, tmp)
        try:
            tmp.rename(path)
        except OSError:  # another process built it first
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return path


def _check_exists(name_or_path) -> None:
    text = str(name_or_path)
    looks_local = text.startswith((".", "/", "~")) or os.sep in text and not looks_like_hub_id(text)
    if looks_local and not Path(text).expanduser().exists():
        raise FileNotFoundError(
            f"no model at {text!r}: give a directory saved with save_pretrained(), a hub id "
            f"(needs network or a filled HF cache), or 'tiny' for the built-in tiny model"
        )


def looks_like_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a Hugging Face hub id (``owner/name``) rather than a local path.

    Example:
        >>> from llmgym.runtime.models import looks_like_hub_id
        >>> looks_like_hub_id("Qwen/Qwen2.5-0.5B"), looks_like_hub_id("./runs/x"), looks_like_hub_id("tiny")
        (True, False, False)
    """
    parts = text.split("/")
    return len(parts) == 2 and all(parts) and not text.startswith(("/", "."))


def flush_denormals() -> None:
    """Treat denormal floats as zero on CPU (a process-wide setting).

    Adam's second-moment estimates of a small model decay into denormals, and x86 CPUs run those
    10-100x slower: measured here, a 100-step warm-up took 48 s with denormals and 3 s without.

    Example:
        >>> from llmgym.runtime.models import flush_denormals
        >>> flush_denormals()
    """
    import numpy as np

    for dtype in (np.float16, np.float32, np.float64):  # numpy caches its float limits on first use:
        np.finfo(dtype).smallest_subnormal  # computed after the flag they read as 0, with a UserWarning
    torch.set_flush_denormal(True)


def supervised_warmup(
    model,
    tokenizer,
    pairs: Iterable[tuple[str | Sequence[int], str]] | Sequence[tuple[str | Sequence[int], str]],
    *,
    steps: int = 200,
    batch_size: int = 32,
    lr: float = 3e-3,
    seed: int = 0,
) -> list[float]:
    """Teacher-forced fine-tuning on ``(prompt, answer)`` pairs; the loss covers answer + EOS only.

    ``pairs`` is a sequence (sampled with replacement) or an endless iterator. A prompt is text
    (encoded with the tokenizer's special tokens, BOS) or a list of token ids, used as they are: an
    env observation's ``prompt_ids``, e.g. a multi-turn context after a tool's reply. Returns the loss
    per step. This is the warm-up that lets a tiny model start RL "imperfect but not hopeless".

    Example:
        >>> from llmgym.runtime.models import build_tiny_model, build_tokenizer, supervised_warmup, TinyModelConfig
        >>> tok = build_tokenizer()
        >>> model = build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, intermediate_size=64))
        >>> losses = supervised_warmup(model, tok, [("1+1=", "2")], steps=20, batch_size=4)
        >>> losses[-1] < losses[0]
        True
    """
    flush_denormals()
    generator = torch.Generator().manual_seed(seed)
    pool = list(pairs) if isinstance(pairs, Sequence) else None
    stream = None if pool is not None else iter(pairs)
    if pool is not None and not pool:
        raise ValueError("supervised_warmup needs at least one (prompt, answer) pair")
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    device = next(model.parameters()).device
    was_training = model.training
    model.train()
    losses = []
    for _ in range(steps):
        if pool is not None:
            idx = torch.randint(len(pool), (batch_size,), generator=generator).tolist()
            batch = [pool[i] for i in idx]
        else:
            batch = [next(stream) for _ in range(batch_size)]
        seqs, label_masks = [], []
        for prompt, answer in batch:
            p = tokenizer.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
            a = tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]
            seqs.append(p + a)
            label_masks.append([0] * len(p) + [1] * len(a))
        width = max(map(len, seqs))
        ids = torch.full((len(seqs), width), tokenizer.pad_token_id, dtype=torch.long)
        attn = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, (s, m) in enumerate(zip(seqs, label_masks)):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
            labels[i, : len(s)] = torch.where(torch.tensor(m) == 1, torch.tensor(s), -100)
        out = model(input_ids=ids.to(device), attention_mask=attn.to(device), labels=labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(out.loss.detach()))
    model.train(was_training)
    return losses
