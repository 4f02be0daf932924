"""Benchmark a model on HumanEval: sample n programs per problem, run them in the sandbox, report pass@k.

    python examples/benchmark_code.py                        # tiny random model, 4 problems, n=4
    python examples/benchmark_code.py --model path/to/ckpt --problems 164 --samples 20 --k 1 10

The tiny random-init model scores 0 (it has never seen code); the point is the pipeline:
engine.generate -> llmgym.envs.code.evaluate_pass_at_k (CodeVerifier + Sandbox.run_many + llmgym.runtime.metrics.pass_at_k).
"""

import argparse

from rich.console import Console
from rich.table import Table

from llmgym.envs.code import HUMANEVAL_STOP_SEQUENCES, evaluate_pass_at_k, load_humaneval
from llmgym.engines import HFEngine, SamplingParams
from llmgym.runtime.models import load_model
from llmgym.runtime.threads import set_torch_threads

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--model", default="tiny", help="'tiny' (built locally) or a checkpoint directory")
parser.add_argument("--problems", type=int, default=4, help="the first N HumanEval problems")
parser.add_argument("--samples", type=int, default=4, help="programs sampled per problem (n)")
parser.add_argument("--k", type=int, nargs="+", default=[1, 2])
parser.add_argument("--max-new-tokens", type=int, default=32)
parser.add_argument("--temperature", type=float, default=0.8)
parser.add_argument("--workers", type=int, default=2, help="concurrent sandboxes")
args = parser.parse_args()

model, tokenizer = load_model(args.model)
set_torch_threads(model)  # 1 CPU thread for a tiny model (OMP_NUM_THREADS=N in the environment picks N)
engine = HFEngine(model, tokenizer)
tasks = load_humaneval()[: args.problems]

# HumanEval's convention: the completion continues the prompt with the function body
sampling = SamplingParams(n=args.samples, temperature=args.temperature, max_new_tokens=args.max_new_tokens,
                          stop=HUMANEVAL_STOP_SEQUENCES, seed=0)
groups = engine.generate([tokenizer.encode(task.prompt) for task in tasks], sampling)
samples = [[completion.text for completion in group] for group in groups]

result = evaluate_pass_at_k(tasks, samples, ks=args.k, max_workers=args.workers)

table = Table(title=f"HumanEval ({args.model})")
table.add_column("task")
table.add_column("passed / n", justify="right")
for task_id, n in result.num_samples.items():
    table.add_row(task_id, f"{result.num_correct[task_id]} / {n}")
for k, value in result.pass_at.items():
    table.add_row(f"[bold]pass@{k}", f"[bold]{value:.3f}")
Console().print(table)
print(result)
