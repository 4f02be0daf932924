r"""GSM8K- and MATH-format task files: local JSONL / JSON / Parquet, or a cached Hugging Face dataset.

Formats (one record per problem):

* **GSM8K**: ``{"question": ..., "answer": "...worked solution... #### 18"}``. The task's ``answer``
  is the text after ``####`` (commas dropped); the full solution stays in ``metadata["solution"]``.
* **MATH**: ``{"problem": ..., "solution": "...\boxed{...}...", "level": ..., "type"/"subject": ...}``,
  optionally ``"answer"`` (as in MATH-500) and ``"unique_id"``. The task's ``answer`` is ``answer``
  when present, else the content of the solution's last ``\boxed{}`` (bare LaTeX, no ``$``).

No hub access happens unless ``path`` is left out: then the loader asks ``datasets.load_dataset``,
which works offline only when the user has the dataset in the Hugging Face cache.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from llmgym import SequenceEnv, Task

__all__ = [
    "load_records",
    "load_gsm8k",
    "load_math",
    "gsm8k_env",
    "math_env",
    "BOXED_PROMPT",
]

BOXED_PROMPT = "{question}\n\nPlease reason step by step, and put your final answer within \\boxed{{}}."


def load_records(path: str | Path) -> list[dict[str, Any]]:
    """Records from ``.jsonl`` / ``.jsonl.gz`` (one JSON object a line), ``.json`` (a list) or ``.parquet``.

    Example:
        >>> import json, tempfile, os
        >>> from llmgym.envs.math.loaders import load_records
        >>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
        >>> _ = open(path, "w").write(json.dumps({"question": "1+1?", "answer": "#### 2"}) + "\\n")
        >>> load_records(path)
        [{'question': '1+1?', 'answer': '#### 2'}]
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no such task file: {path}")
    name = path.name.lower()
    if name.endswith(".parquet"):
        return _read_parquet(path)
    opener = gzip.open if name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as f:
        if name.endswith((".json", ".json.gz")):
            data = json.load(f)
            if isinstance(data, dict):  # {"data": [...]} or {"rows": [...]}
                data = next((v for v in data.values() if isinstance(v, list)), None)
            if not isinstance(data, list):
                raise ValueError(f"{path}: a .json task file must hold a list of records")
            return [dict(r) for r in data]
        records = []
        for line_no, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{line_no}: not a JSON object ({exc.msg})") from None
        return records


def _read_parquet(path: Path) -> list[dict[str, Any]]:
    try:
        import pyarrow.parquet as pq
    except ModuleNotFoundError:
        try:
            import pandas as pd
        except ModuleNotFoundError:
            raise ModuleNotFoundError(
                f"reading {path.name} needs 'pyarrow' (or 'pandas' with a parquet engine): "
                "pip install pyarrow — or convert the file to JSONL"
            ) from None
        return pd.read_parquet(path).to_dict(orient="records")
    return pq.read_table(path).to_pylist()


def _from_hub(loader: str, hf_name: str, hf_config: str | None, split: str) -> list[dict[str, Any]]:
    try:
        import datasets
    except ModuleNotFoundError:
        raise ModuleNotFoundError(
            f"{loader}() without a path reads the Hugging Face dataset {hf_name!r}, which needs the "
            f"'datasets' package (pip install datasets) and the dataset in its cache; or pass "
            f"path='file.jsonl' (JSONL/JSON/Parquet in that format)"
        ) from None
    offline = datasets.config.HF_HUB_OFFLINE
    if not offline:
        from huggingface_hub import dataset_info

        try:  # one short request: when the hub is unreachable, read the cache only (load_dataset would
            dataset_info(hf_name, timeout=5)  # spend ~30 s in retries before the same error)
        except Exception:
            offline = True
    previous = datasets.config.HF_HUB_OFFLINE
    datasets.config.HF_HUB_OFFLINE = offline
    try:
        rows = datasets.load_dataset(hf_name, hf_config, split=split)
    except Exception as exc:  # offline and not cached, unknown split, ...
        raise RuntimeError(
            f"{loader}(): could not load {hf_name!r} (config {hf_config!r}, split {split!r}) with "
            f"datasets.load_dataset: {type(exc).__name__}: {exc}. Without network access it must be in "
            f"the Hugging Face cache; otherwise pass path='file.jsonl'."
        ) from exc
    finally:
        datasets.config.HF_HUB_OFFLINE = previous
    return [dict(r) for r in rows]


def _gsm8k_final(answer: str) -> str:
    if "####" not in answer:
        raise ValueError(f"a GSM8K answer ends with '#### <number>', got {answer[-80:]!r}")
    return answer.rsplit("####", 1)[1].strip().replace(",", "")


def _last_boxed(text: str) -> str | None:
    from llmgym.envs.math.answer_extraction import last_boxed

    return last_boxed(text)


def _field(record: Mapping[str, Any], keys: Iterable[str], what: str, where: str) -> Any:
    for key in keys:
        if key in record and record[key] is not None:
            return record[key]
    raise KeyError(f"{where}: the record has no {what} field (looked for {', '.join(keys)}); it has {sorted(record)}")


def load_gsm8k(
    path: str | Path | None = None,
    *,
    prompt: str = BOXED_PROMPT,
    limit: int | None = None,
    split: str = "test",
    hf_name: str = "openai/gsm8k",
    hf_config: str | None = "main",
) -> list[Task]:
    """GSM8K-format problems as tasks: from ``path``, else from the Hugging Face cache.

    ``prompt`` is a template with ``{question}``; ``limit`` keeps the first records.

    Example:
        >>> from llmgym.envs.math import load_gsm8k
        >>> tasks = load_gsm8k("tests/data/gsm8k_sample.jsonl")
        >>> tasks[0].answer, tasks[0].id
        ('18', 'gsm8k/0')
    """
    records = load_records(path) if path is not None else _from_hub("load_gsm8k", hf_name, hf_config, split)
    where = str(path or hf_name)
    tasks = []
    for i, record in enumerate(records[:limit] if limit is not None else records):
        question = _field(record, ("question", "problem"), "question", f"{where} record {i}")
        solution = str(_field(record, ("answer", "solution"), "answer", f"{where} record {i}"))
        tasks.append(Task(
            prompt.format(question=question),
            answer=_gsm8k_final(solution),
            metadata={"question": question, "solution": solution, "source": where},
            id=str(record.get("id", f"gsm8k/{i}")),
        ))
    return tasks


def load_math(
    path: str | Path | None = None,
    *,
    prompt: str = BOXED_PROMPT,
    limit: int | None = None,
    split: str = "test",
    hf_name: str = "HuggingFaceH4/MATH-500",
    hf_config: str | None = None,
) -> list[Task]:
    r"""MATH-format problems as tasks: from ``path``, else from the Hugging Face cache.

    Example:
        >>> from llmgym.envs.math import load_math
        >>> tasks = load_math("tests/data/math_sample.jsonl")
        >>> tasks[0].answer, tasks[0].metadata["level"]
        ('\\frac{1}{2}', 'Level 2')
    """
    records = load_records(path) if path is not None else _from_hub("load_math", hf_name, hf_config, split)
    where = str(path or hf_name)
    tasks = []
    for i, record in enumerate(records[:limit] if limit is not None else records):
        problem = _field(record, ("problem", "question"), "problem", f"{where} record {i}")
        solution = record.get("solution")
        answer = record.get("answer")
        if answer is None:
            answer = _last_boxed(str(solution or ""))
            if answer is None:
                raise ValueError(f"{where} record {i}: no 'answer' field and no \\boxed{{}} in its solution")
        meta = {k: record[k] for k in ("level", "type", "subject") if k in record}
        tasks.append(Task(
            prompt.format(question=problem),
            answer=str(answer).strip(),
            metadata={"problem": problem, "solution": solution, "source": where, **meta},
            id=str(record.get("unique_id", record.get("id", f"math/{i}"))),
        ))
    return tasks


def _dataset_env(loader, name, tokenizer, render_mode, path, verifier, time_limit, **load_kwargs) -> SequenceEnv:
    from llmgym.envs.math.math_verifier import MathVerifier

    if verifier is None:  # first: without math-verify the env fails here, naming the install
        verifier = MathVerifier(time_limit=time_limit)
    try:
        tasks = loader(path, **load_kwargs)
    except (ModuleNotFoundError, RuntimeError) as exc:
        if path is not None:
            raise
        # Without a file and without a cached dataset the env is missing its one required input.
        raise TypeError(
            f"llmgym/{name}-v0 needs its problems: pass path= (gymnasium.make('llmgym/{name}-v0', "
            f"path='file.jsonl'), a local JSONL/JSON/Parquet file), or have the Hugging Face dataset "
            f"in the cache. ({exc})"
        ) from exc
    if not tasks:
        raise ValueError(f"llmgym/{name}-v0: {path or 'the dataset'} holds no problems")
    return SequenceEnv(tasks, verifier, tokenizer, render_mode=render_mode)


def gsm8k_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    path: str | Path | None = None,
    verifier: Any = None,
    time_limit: float | None = 5.0,
    **load_kwargs: Any,
) -> SequenceEnv:
    """``llmgym/GSM8K-v0``: GSM8K problems from ``path`` (or the HF cache), checked by MathVerifier.

    Other keywords go to :func:`load_gsm8k` (``prompt``, ``limit``, ``split``...).

    Example:
        >>> import gymnasium, llmgym
        >>> env = gymnasium.make("llmgym/GSM8K-v0", path="tests/data/gsm8k_sample.jsonl")
        >>> obs, info = env.reset(seed=0)
        >>> env.step("... so the answer is " + info["task"].answer)[1]
        1.0
    """
    return _dataset_env(load_gsm8k, "GSM8K", tokenizer, render_mode, path, verifier, time_limit, **load_kwargs)


def math_env(
    tokenizer: Any = None,
    render_mode: str | None = None,
    *,
    path: str | Path | None = None,
    verifier: Any = None,
    time_limit: float | None = 5.0,
    **load_kwargs: Any,
) -> SequenceEnv:
    r"""``llmgym/MATH-v0``: MATH problems from ``path`` (or the HF cache), checked by MathVerifier.

    Example:
        >>> import gymnasium, llmgym
        >>> env = gymnasium.make("llmgym/MATH-v0", path="tests/data/math_sample.jsonl")
        >>> obs, info = env.reset(seed=0)
        >>> env.step("\\boxed{" + info["task"].answer + "}")[1]
        1.0
    """
    return _dataset_env(load_math, "MATH", tokenizer, render_mode, path, verifier, time_limit, **load_kwargs)
