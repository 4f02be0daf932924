"""Data-parallel RL under torchrun: each process rolls out its share of the tasks, gradients are averaged.

CPU (gloo), two processes::

    torchrun --nproc_per_node 2 examples/train_ddp.py --steps 3

One node with 8 GPUs (NCCL; one process per GPU)::

    torchrun --nproc_per_node 8 examples/train_ddp.py --model /path/to/checkpoint --steps 100

Two nodes (run on each; ``--node_rank`` 0 and 1; ``MASTER`` is node 0's address)::

    torchrun --nnodes 2 --node_rank 0 --nproc_per_node 8 --rdzv_backend c10d \\
        --rdzv_endpoint MASTER:29500 examples/train_ddp.py --model /path/to/checkpoint

Rollouts from a fleet of rollout servers (``llmgym serve --model DIR`` on other machines, started
for the same checkpoint): every rank samples from all of them, and rank 0 pushes the weights after
each update (docs/scale.md, "A fleet of rollout servers")::

    torchrun --nnodes 2 ... examples/train_ddp.py --model DIR --server http://HOST1:8000 --server http://HOST2:8000

``--fsdp`` shards the model with FSDP2 (``torch.distributed.fsdp.fully_shard``) instead of DDP, for
models whose weights + optimiser state do not fit one GPU. It also runs as a plain ``python
examples/train_ddp.py`` (one process). The update is the single-process update of the global batch
(``tasks_per_step × group_size`` episodes), whatever the number of processes.
"""

from __future__ import annotations

import argparse
import os

import gymnasium
import torch

import llmgym  # noqa: F401  (registers the envs)
from llmgym.agents import AGENTS
from llmgym.runtime import distributed
from llmgym.runtime.models import load_model


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--agent", default="grpo", choices=sorted(AGENTS))
    parser.add_argument("--env", default="llmgym/Addition-v0")
    parser.add_argument("--model", default="tiny", help="'tiny' (built locally) or a checkpoint directory")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tasks-per-step", type=int, default=4, help="global, shared by all processes")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--fsdp", action="store_true", help="shard the model with FSDP2 instead of DDP")
    parser.add_argument("--server", action="append", metavar="URL",
                        help="a rollout server (llmgym serve) to sample from; repeatable (default: HFEngine in process)")
    args = parser.parse_args(argv)

    parallel = distributed.init_distributed()
    cuda = torch.cuda.is_available()
    if not cuda:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // distributed.world_size()))
    device = f"cuda:{distributed.local_rank()}" if cuda else "cpu"
    model, tokenizer = load_model(args.model, device=device)
    if args.fsdp:
        if not parallel:
            raise SystemExit("--fsdp needs several processes: launch with torchrun --nproc_per_node N")
        distributed.apply_fsdp(model)
    engine = None
    if args.server:
        from llmgym.fleet.fleet_engine import FleetEngine

        engine = FleetEngine(args.server, tokenizer, model)  # rank 0 pushes version 0; every rank samples
    agent = AGENTS[args.agent](model, tokenizer, tasks_per_step=args.tasks_per_step, group_size=args.group_size,
                               max_new_tokens=args.max_new_tokens, lr=args.lr, kl_coef=0.0, seed=0, engine=engine)
    env = gymnasium.make(args.env, tokenizer=tokenizer)
    if distributed.is_main_process():
        print(f"{distributed.world_size()} process(es), {'FSDP' if args.fsdp else 'DDP' if parallel else 'single'}"
              f", device {device}; {args.tasks_per_step} tasks x {args.group_size} samples per step")
    for row in agent.learn(env, args.steps):
        if distributed.is_main_process():
            print(f"step {row['step']}: loss {row['loss']:+.4f}  reward (rank 0) {row['reward_mean']:.3f}  "
                  f"grad_norm {row.get('grad_norm', float('nan')):.3f}  {row['wall_s']:.2f}s")
    # a fingerprint of the final weights (FSDP: of the gathered full tensors)
    full = [p.full_tensor() if hasattr(p, "full_tensor") else p for p in model.parameters()]
    checksum = sum(float((p.detach().double() * (1 + i % 7)).sum()) for i, p in enumerate(full))
    if parallel and not args.fsdp:  # every rank must hold the same weights after the updates
        spread = distributed.all_reduce_sum(torch.tensor([checksum, checksum**2], dtype=torch.float64))
        variance = float(spread[1] / distributed.world_size() - (spread[0] / distributed.world_size()) ** 2)
        if distributed.is_main_process():
            print(f"weights identical on all ranks: {abs(variance) < 1e-6 * max(1.0, checksum**2)}")
    if distributed.is_main_process():
        print(f"weights checksum: {checksum:.6f}")
    if engine is not None:
        if distributed.is_main_process():
            print(f"rollout servers: policy version {engine.policy_version} on {engine.server_versions()}; rows sampled "
                  f"by this rank per server {engine.rows_served()}")
        engine.close()
    distributed.destroy()


if __name__ == "__main__":
    main()
