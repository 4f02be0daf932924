"""A served teacher is checked as any reply is, and more: every field of its echo that says what it scored must
name the ids sent, position by position (not only as many), alternatives at one position are distinct tokens of
one distribution, and its scores feed distillation only if they can be a model's log-probs and are not the
student's own.

A loopback ``http.server`` plays the server (``test_openai_hostile.FakeServer``); its replies are built as vLLM
0.32 writes them (``echo_reply``), then one field is falsified.
"""

from __future__ import annotations

import copy

import gymnasium as gym
import pytest
import torch

pytest.importorskip("openai")

import llmgym  # noqa: E402, F401
from llmgym.agents import OnPolicyDistillation  # noqa: E402
from llmgym.agents.distill import TeacherScoreError  # noqa: E402
from llmgym.engines import HFEngine  # noqa: E402
from llmgym.engines.openai_api import OpenAIEngine, ServerError  # noqa: E402
from llmgym.runtime.models import TinyModelConfig, build_tiny_model, build_tokenizer  # noqa: E402
from test_openai_hostile import FakeServer, _json, echo_reply  # noqa: E402

SHAPE = TinyModelConfig(hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64)


@pytest.fixture()
def server():
    s = FakeServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


def _engine(server, tok):
    return OpenAIEngine(server.url, "tiny", tok, max_retries=0, timeout=5)


SENT = "copy: héllo"  # é is two byte tokens: the first alone decodes to U+FFFD, vLLM shows it as ""


def _falsify(reply: dict, change) -> dict:
    change(reply["choices"][0])
    return reply


def _swap_token(c):
    c["logprobs"]["tokens"][3] = "token_id:200"


def _swap_text_token(c):
    c["logprobs"]["tokens"][3] = "z"


FALSIFIED = {
    "token ids naming another id": (lambda c: c.update(token_ids=[1, 7] + [int(t[9:]) for t in c["logprobs"]["tokens"][2:]]),
                                    r"names token id 7 at position 1"),
    "prompt token ids naming another id": (lambda c: c.update(prompt_token_ids=[1, 7] + [
        int(t[9:]) for t in c["logprobs"]["tokens"][2:-1]]), r"names prompt token id 7 at position 1"),
    "a token_id:N string naming another id": (_swap_token, r"names token 'token_id:200' at position 3"),
    "a token string naming another token": (_swap_text_token, r"names token 'z' at position 3"),
    "text offsets that do not follow the tokens": (
        lambda c: c["logprobs"]["text_offset"].__setitem__(4, 999), r"text_offset at position 4 is 999"),
    "the scored token's alternative at another log-prob": (
        lambda c: c["logprobs"]["top_logprobs"][2].update({c["logprobs"]["tokens"][2]: -0.01}),
        r"top_logprobs gives the scored token at position 2 log-prob -0\.01"),
    "alternatives summing above 1": (
        lambda c: c["logprobs"]["top_logprobs"][2].update({"token_id:200": -0.01, "token_id:201": -0.02}),
        r"position 2 have probabilities summing to 2\.3 "),
    "prompt_logprobs naming another id": (
        lambda c: c["prompt_logprobs"].__setitem__(2, {"200": {"logprob": -1.0}}), r"does not name id \d+"),
    "prompt_logprobs at another log-prob": (
        lambda c: c["prompt_logprobs"][2].update({k: {"logprob": -0.001} for k in c["prompt_logprobs"][2]}),
        r"prompt_logprobs gives id \d+ at position 2 log-prob -0\.001"),
    "prompt_logprobs alternatives summing above 1": (
        lambda c: c["prompt_logprobs"][2].update({"200": {"logprob": 0.0}}), r"of prompt_logprobs have probabilities"),
    "an echoed text of other tokens": (lambda c: c.update(text="something else"), r"echoed text 'something else'"),
}


def _honest(tok, as_ids=True):
    sent = tok.encode(SENT)
    return sent, echo_reply(tok, sent, [-1.0 - 0.1 * i for i in range(len(sent) - 1)], as_ids=as_ids)


@pytest.mark.parametrize("as_ids", [True, False], ids=["token_id", "text"])
def test_an_honest_echo_passes_in_both_display_forms(server, tok, as_ids):
    sent, body = _honest(tok, as_ids)
    assert as_ids or "" in body["choices"][0]["logprobs"]["tokens"]  # é's unfinished first byte, shown as vLLM does
    server.answer = _json(body)
    assert _engine(server, tok).logprobs(sent[:1], sent[1:]) == pytest.approx(
        [-1.0 - 0.1 * i for i in range(len(sent) - 1)])


@pytest.mark.parametrize("case", sorted(FALSIFIED))
def test_an_echo_naming_other_tokens_than_were_sent_is_refused(server, tok, case):
    change, pattern = FALSIFIED[case]
    sent, body = _honest(tok, as_ids="text token" not in case)
    server.answer = _json(_falsify(body, change))
    with pytest.raises(ServerError, match=pattern) as err:
        _engine(server, tok).logprobs(sent[:1], sent[1:])
    assert "\n" not in str(err.value)


def test_vllm_is_asked_to_name_each_scored_token_by_its_id(server, tok):
    seen = []
    sent, body = _honest(tok)

    def respond(request):
        seen.append(request)
        return _json(body)

    server.respond = respond
    _engine(server, tok).logprobs(sent[:1], sent[1:])
    assert seen[-1]["echo"] is True and seen[-1]["return_tokens_as_token_ids"] is True


# -- a served teacher in distillation ---------------------------------------------------------------------------


def _serve_scores(server, tok, teacher_engine, forge=lambda s: s, tamper=None):
    """The server answers each echo request with ``forge(teacher's honest scores)``, as vLLM would write them."""

    def respond(request):
        sent = request["prompt"]
        scores = forge(teacher_engine.score_tokens([sent])[0])
        body = echo_reply(tok, sent, scores)
        if tamper is not None:
            tamper(body["choices"][0])
        return _json(body)

    server.respond = respond


def _distill_step(server, tok, student):
    agent = OnPolicyDistillation(student, tok, teacher=_engine(server, tok), tasks_per_step=2, group_size=4,
                                 max_new_tokens=4, seed=3)
    return agent.prepare(agent.collect(gym.make("llmgym/Copy-v0", tokenizer=tok)))


def _pair(tok):
    return build_tiny_model(tok, SHAPE), build_tiny_model(tok, TinyModelConfig(**{**SHAPE.__dict__, "seed": 7}))


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_an_honest_served_teacher_grades_the_student(server, tok):
    student, teacher = _pair(tok)
    _serve_scores(server, tok, HFEngine(teacher, tok))
    batch = _distill_step(server, tok, student)
    assert float(batch.teacher_logprobs.min()) > -20


@pytest.mark.parametrize("case,forge,pattern", [
    ("certain of everything", lambda s: [0.0] * len(s), r"different tokens whose probabilities sum to"),
    ("vllm's zero probability everywhere", lambda s: [-9999.0] * len(s), r"log-prob -9999, below"),
], ids=["zero", "-9999"])
def test_a_served_teacher_whose_scores_cannot_be_log_probs_is_refused(server, tok, case, forge, pattern):
    student, teacher = _pair(tok)
    _serve_scores(server, tok, HFEngine(teacher, tok), forge)
    with pytest.raises(TeacherScoreError, match=r"^the teacher's scores cannot be log-probs of one model \(the teacher "
                                                r"is hostile or broken.*" + pattern):
        _distill_step(server, tok, student)


def test_a_served_teacher_scoring_other_ids_is_refused(server, tok):
    student, teacher = _pair(tok)
    _serve_scores(server, tok, HFEngine(teacher, tok),
                  tamper=lambda c: c["logprobs"]["tokens"].__setitem__(1, "token_id:0"))
    with pytest.raises(ServerError, match=r"names token 'token_id:0' at position 1 .*scored other tokens"):
        _distill_step(server, tok, student)


def test_the_student_served_as_its_own_teacher_is_refused(server, tok):
    student, _ = _pair(tok)
    _serve_scores(server, tok, HFEngine(copy.deepcopy(student), tok))
    with pytest.raises(TeacherScoreError, match=r"^the teacher is the student: .*nothing would train"):
        _distill_step(server, tok, student)
