"""A small verifiers environment for llmgym's interop tests: echo a digit string (single-turn).

Two weighted rewards: ``exact`` (1.0) and ``digits`` (0.05: the share of positions right, a shaping
term too small to pay a content-free answer much). Loaded by id (``verifiers:llmgym_test_vf``) with
this folder on ``sys.path``.
"""

import verifiers.v1 as vf


class EchoData(vf.TaskData):
    answer: str


class EchoTask(vf.Task[EchoData]):
    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        return float(trace.last_reply == self.data.answer)

    @vf.reward(weight=0.05)
    async def digits(self, task: vf.TaskData, trace: vf.Trace) -> float:  # takes the data by name, as verifiers allows
        reply = trace.last_reply
        return sum(a == b for a, b in zip(reply, task.answer)) / len(task.answer)

    @vf.metric
    async def length(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class EchoConfig(vf.TasksetConfig):
    num_tasks: int = 12


class EchoTaskset(vf.Taskset[EchoTask, EchoConfig]):
    def load(self):
        for i in range(self.config.num_tasks):
            digits = str(1000 + 37 * i * i)[-4:]
            yield EchoTask(EchoData(idx=i, name=f"echo-{digits}", prompt=f"Echo {digits}", answer=digits),
                           self.config.task)


__all__ = ["EchoTaskset"]
