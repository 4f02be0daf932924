"""A multi-turn verifiers environment for llmgym's interop tests: guess a number in 0..99.

The env's ``run()`` answers each guess with "higher"/"lower"; a ``@vf.stop`` ends the exchange on
the right guess; the task's reward ``solved`` is 1.0 when some guess was right. Loaded by id
(``verifiers:llmgym_test_vf_guess``) with this folder on ``sys.path``.
"""

import verifiers.v1 as vf


class GuessData(vf.TaskData):
    secret: int


class GuessTask(vf.Task[GuessData]):
    @vf.reward
    async def solved(self, trace: vf.Trace) -> float:
        return float(any((m.content or "").strip() == str(self.data.secret) for m in trace.assistant_messages))

    @vf.stop
    async def guessed(self, trace: vf.Trace) -> bool:
        return trace.last_reply == str(self.data.secret)


class GuessTaskset(vf.Taskset[GuessTask, vf.TasksetConfig]):
    def load(self):
        return [GuessTask(GuessData(idx=i, name=f"guess-{s}", prompt="Guess my number (0-99).", secret=s),
                          self.config.task) for i, s in enumerate((7, 42, 63, 90))]


class GuessEnvConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class GuessEnv(vf.Env[GuessEnvConfig]):
    async def run(self, task, agents):
        async with agents.player.interaction(task) as interaction:
            segment = await interaction.turn()
            while not segment.terminated:
                try:
                    guess = int(segment.last_reply)
                except ValueError:
                    segment = await interaction.turn("a number, please")
                    continue
                segment = await interaction.turn("higher" if guess < task.data.secret else "lower")
        interaction.trace.record_metric("turns", interaction.trace.num_turns)


__all__ = ["GuessTaskset", "GuessEnv"]
