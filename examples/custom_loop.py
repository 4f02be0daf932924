"""Drive an llmgym env with your own loop: reset, generate, step — at sequence and token level."""

import gymnasium as gym

import llmgym  # noqa: F401  (registers the llmgym/... ids)
from llmgym.engines import HFEngine, SamplingParams, TokenStepper
from llmgym.runtime.models import load_model
from llmgym.runtime.threads import set_torch_threads

model, tokenizer = load_model("tiny")  # a tiny random-init model built locally; or a path to a checkpoint
set_torch_threads(model)  # 1 CPU thread for a tiny model (OMP_NUM_THREADS=N in the environment picks N)
engine = HFEngine(model, tokenizer)

# sequence level: one action = one whole completion (token ids or text)
env = gym.make("llmgym/Addition-v0", tokenizer=tokenizer)
for episode in range(3):
    obs, info = env.reset(seed=episode)
    completion = engine.generate([obs["prompt_ids"]], SamplingParams(max_new_tokens=8, seed=episode))[0][0]
    obs, reward, terminated, truncated, info = env.step(completion.token_ids)
    print(f"{info['task'].prompt!r} -> {completion.text!r}  reward={reward:.2f}")

# token level: one action = one token id; the reward arrives at EOS or at the token limit
env = gym.make("llmgym/Addition-v0", tokenizer=tokenizer, level="token", max_new_tokens=8)
stepper = TokenStepper(engine)  # keeps the KV cache along the episode: one new token per model call
obs, info = env.reset(seed=0)
done = False
while not done:
    logits = stepper.next_token_logits([obs["prompt_ids"]])
    obs, reward, terminated, truncated, info = env.step(int(logits[0].argmax()))
    done = terminated or truncated
print(f"token level: {obs['prompt']!r} reward={reward:.2f} ({info['finish_reason']})")
