"""Data-parallel learning on CPU: 2 gloo processes (DDP, and FSDP2 where torch has it) reproduce the
single-process update.

A fixed global batch (built from fixed token ids, not sampled) is split between two ranks by
whole groups, with *different* token and row counts per rank, so a rank that divided by its own
counts (or forgot DDP's gradient averaging) would take a visibly different step.
"""

from __future__ import annotations

import os
import socket

import pytest
import torch

from llmgym.runtime import distributed

MODES = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")
FSDP_MODES = ("token-mean", "seq-mean-token-mean")


def _fsdp_available() -> bool:
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401  (torch >= 2.6)
    except ImportError:
        return False
    return True
GROUP = 2
WORLD = 2


def _tiny():
    from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer

    tok = build_tokenizer()
    return build_tiny_model(tok, TinyModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)), tok


def _global_batch(tok):
    """6 episodes, 3 groups of 2; completions of 1..7 tokens; rewards differ within each group."""
    from llmgym import Task
    from llmgym.rollout.episodes import Batch, Episode

    episodes = []
    lengths = [1, 7, 2, 2, 6, 4]  # rank 0: 2 groups, 4 rows, 12 tokens; rank 1: 1 group, 2 rows, 10 tokens
    for i, n in enumerate(lengths):
        prompt = tok.encode(f"p{i // GROUP}:")
        completion = [40 + (7 * i + 3 * t) % 50 for t in range(n)]
        ids = prompt + completion
        rewards = [0.0] * len(ids)
        rewards[-1] = float((i * 3) % 4) / 3.0
        episodes.append(Episode(Task(f"t{i // GROUP}"), i // GROUP, ids, [0] * len(prompt) + [1] * n,
                                [0.0] * len(ids), rewards, len(prompt), ["length"]))
    return Batch.from_episodes(episodes, tok.pad_token_id)


# agents whose advantages use batch-wide statistics (baseline, whitening): those must be global
AGENT_CASES = {"reinforce": "seq-mean-token-sum", "reinforce++": "token-mean", "ppo": "token-mean"}


def _update(batch, mode, fsdp=False, agent_name="grpo", **config):
    """One update from the fixed initial weights; returns the new parameters."""
    from llmgym.agents import AGENTS

    model, tok = _tiny()
    if fsdp:
        distributed.apply_fsdp(model)
    extra = {"group_size": GROUP} if agent_name == "grpo" else {}
    agent = AGENTS[agent_name](model, tok, kl_coef=0.0, loss_agg=mode, max_new_tokens=8,
                               max_grad_norm=1.0, entropy_coef=0.01, **extra, **config)
    # Plain SGD: Adam's first step is ≈ lr·sign(g), which turns float round-off on near-zero
    # gradients into full-size steps; SGD compares the gradients themselves.
    agent.optimizer = torch.optim.SGD(agent.parameters(), lr=0.5)
    metrics = agent.update(batch)
    full = {k: v.full_tensor() if hasattr(v, "full_tensor") else v for k, v in model.state_dict().items()}
    return {k: v.detach().clone() for k, v in full.items()}, metrics


def _worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD), LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    assert distributed.init_distributed(backend="gloo")
    try:
        _, tok = _tiny()
        full = _global_batch(tok)
        rows = list(distributed.shard_range(len(full) // GROUP))  # whole groups per rank
        local = full.select([g * GROUP + j for g in rows for j in range(GROUP)])
        results = {mode: _update(local, mode) for mode in MODES}
        # micro-batches of 1 row on each rank: accumulation and the data-parallel scaling compose
        results.update({f"micro/{mode}": _update(local, mode, micro_batch_size=1) for mode in MODES})
        results.update({f"agent/{name}": _update(local, mode, agent_name=name) for name, mode in AGENT_CASES.items()})
        results["dapo_groups"] = distributed.all_gather_ints(_dapo_kept_groups(tok))
        if _fsdp_available():
            results.update({f"fsdp/{mode}": _update(local, mode, fsdp=True) for mode in FSDP_MODES})
        if rank == 0:
            torch.save(results, os.path.join(out_dir, "ddp.pt"))
    finally:
        distributed.destroy()


def _dapo_kept_groups(tok) -> int:
    from llmgym.agents import DAPO
    from llmgym import SequenceEnv, Task

    # rewards that differ within most groups, so dynamic sampling fills its target quickly
    env = SequenceEnv(lambda rng: Task(f"q{rng.integers(100)}"), lambda t, c: float(len(c) % 2), tok)
    agent = DAPO(_tiny()[0], tok, tasks_per_step=4, group_size=4, max_new_tokens=4, max_extra_draws=8)
    return int(agent.collect(env).stats["kept_groups"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ddp_results(tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("ddp")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return torch.load(out / "ddp.pt")


@pytest.mark.parametrize("mode", MODES + tuple(f"fsdp/{m}" for m in FSDP_MODES))
def test_two_gloo_ranks_match_one_process(ddp_results, mode):
    if mode.startswith("fsdp/") and not _fsdp_available():
        pytest.skip("FSDP2 (torch.distributed.fsdp.fully_shard) needs torch >= 2.6")
    torch.set_num_threads(1)
    _, tok = _tiny()
    single, single_metrics = _update(_global_batch(tok), mode.removeprefix("fsdp/"))
    initial = _tiny()[0].state_dict()
    ddp, ddp_metrics = ddp_results[mode]
    moved = max(float((single[k] - initial[k]).abs().max()) for k in single)
    assert moved > 1e-3, "the update should move the parameters visibly"
    for k in single:
        assert torch.allclose(ddp[k], single[k], rtol=1e-5, atol=1e-6), \
            f"{mode}: {k} differs by {float((ddp[k] - single[k]).abs().max()):.3g}"
    # the rank-averaged diagnostics are the global ones (loss: exactly, by the loss scaling)
    assert abs(ddp_metrics["loss"] - single_metrics["loss"]) < 1e-5
    # the sampler-vs-learner mismatch is a mean over every rank's tokens (12 and 10 here), not of the ranks' means
    for key in ("mismatch_kl", "mismatch_prob_error"):
        assert ddp_metrics[key] == pytest.approx(single_metrics[key], rel=1e-5), key


@pytest.mark.parametrize("mode", MODES)
def test_micro_batches_under_data_parallel_match_one_process(ddp_results, mode):
    torch.set_num_threads(1)
    _, tok = _tiny()
    single, single_metrics = _update(_global_batch(tok), mode)
    ddp, ddp_metrics = ddp_results[f"micro/{mode}"]
    for k in single:
        assert torch.allclose(ddp[k], single[k], rtol=1e-5, atol=1e-6), \
            f"micro/{mode}: {k} differs by {float((ddp[k] - single[k]).abs().max()):.3g}"
    assert abs(ddp_metrics["loss"] - single_metrics["loss"]) < 1e-5


@pytest.mark.parametrize("name", sorted(AGENT_CASES))
def test_batch_statistics_are_global_under_data_parallel(ddp_results, name):
    torch.set_num_threads(1)
    _, tok = _tiny()
    single, _ = _update(_global_batch(tok), AGENT_CASES[name], agent_name=name)
    ddp, _ = ddp_results[f"agent/{name}"]
    for k in single:
        assert torch.allclose(ddp[k], single[k], rtol=1e-5, atol=1e-6), \
            f"{name}: {k} differs by {float((ddp[k] - single[k]).abs().max()):.3g}"


def test_dapo_fills_the_global_batch_not_one_per_rank(ddp_results):
    assert ddp_results["dapo_groups"] == [2, 2]  # each rank its share of the 4 groups, not 4 each


def test_ranks_hold_unequal_shares():
    """Sanity check of the test itself: per-rank token and row counts differ, so naive per-rank means
    would not reproduce the global means."""
    _, tok = _tiny()
    full = _global_batch(tok)
    shares = [[g * GROUP + j for g in distributed.shard_range(len(full) // GROUP, r, WORLD) for j in range(GROUP)]
              for r in range(WORLD)]
    assert len(shares[0]) != len(shares[1])
    assert float(full.select(shares[0]).action_mask.sum()) != float(full.select(shares[1]).action_mask.sum())


def test_helpers_single_process():
    assert not distributed.is_distributed()
    assert distributed.shard(list(range(7)), rank=2, world_size=3) == [5, 6]
    assert [len(distributed.shard_range(10, r, 4)) for r in range(4)] == [3, 3, 2, 2]
    assert distributed.all_reduce_mean({"a": 2.0}) == {"a": 2.0}
    assert distributed.all_gather_ints(3) == [3]
    with pytest.raises(ValueError):
        distributed.shard_range(3, rank=2, world_size=2)
