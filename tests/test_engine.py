"""The continuous-batching engine against naive decoding, and its serving guarantees."""

import asyncio

import jax
import jax.monitoring
import numpy as np
import pytest
from flax import nnx

from asyncrl.model import build_model
from asyncrl.sampling.engine import Engine
from asyncrl.sampling.protocol import EngineClosed, PromptTooLong
from asyncrl.testing.configs import micro_config
from asyncrl.testing.decoding import full_logprobs, naive_greedy
from asyncrl.types import FinishReason, GenerateRequest, SamplingParams

# Log-probs computed by the engine (cached, batched) vs a full forward: float32 op-order noise.
LOGPROB_TOL = 1e-4
MAX_LEN = 256
VOCAB = 272  # the byte tokenizer's ids; the micro model has 320 rows


@pytest.fixture(scope="module")
def cfg():
    return micro_config(
        "rollout.engine_slots=4",
        "rollout.engine_queue=64",
        "rollout.prefill_buckets=[16,64,128]",  # several shapes: bucketing is under test here
        "rollout.attention_windows=[64,128,256]",
    )


@pytest.fixture(scope="module")
def model(cfg):
    return build_model(cfg.model, seed=7)


@pytest.fixture
def engine(cfg, model):
    eng = Engine(model, cfg.rollout, max_len=MAX_LEN, vocab_limit=VOCAB)
    yield eng
    eng.close()


def _prompt(i, n=None):
    rng = np.random.default_rng(i)
    return tuple(int(x) for x in rng.integers(1, 250, n or 3 + 7 * (i % 5)))


def _greedy(n=12, **kw):
    return SamplingParams(max_tokens=n, temperature=0.0, **kw)


def run(coro):
    return asyncio.run(coro)


def test_continuous_batching_equals_one_at_a_time_equals_naive(engine, model):
    prompts = [_prompt(i) for i in range(10)]  # more requests than the 4 slots

    async def batched():
        reqs = [GenerateRequest(prompt=p, params=_greedy()) for p in prompts]
        return await asyncio.gather(*[engine.generate(r) for r in reqs])

    async def sequential():
        return [await engine.generate(GenerateRequest(prompt=p, params=_greedy())) for p in prompts]

    together, alone = run(batched()), run(sequential())
    for p, a, b in zip(prompts, together, alone, strict=True):
        assert a.tokens == b.tokens == tuple(naive_greedy(model, p, 12, vocab_limit=VOCAB))
        assert a.finish_reason == FinishReason.LENGTH


def test_logprobs_equal_full_forward_log_softmax(engine, model):
    prompt = _prompt(3)
    params = SamplingParams(max_tokens=16, temperature=1.0, seed=11)
    out = run(engine.generate(GenerateRequest(prompt=prompt, params=params)))
    ref = full_logprobs(model, [*prompt, *out.tokens], VOCAB)
    expected = [ref[len(prompt) - 1 + i, t] for i, t in enumerate(out.tokens)]
    np.testing.assert_allclose(out.logprobs, expected, atol=LOGPROB_TOL)
    np.testing.assert_allclose(out.raw_logprobs, expected, atol=LOGPROB_TOL)


def test_filtered_sampling_reports_sampled_and_raw_logprobs_separately(engine, model):
    prompt = _prompt(4)
    params = SamplingParams(max_tokens=10, temperature=0.7, top_k=5, seed=2)
    out = run(engine.generate(GenerateRequest(prompt=prompt, params=params)))
    ref = full_logprobs(model, [*prompt, *out.tokens], VOCAB)
    raw = [ref[len(prompt) - 1 + i, t] for i, t in enumerate(out.tokens)]
    np.testing.assert_allclose(out.raw_logprobs, raw, atol=LOGPROB_TOL)
    # Sampled from a sharper, truncated distribution: each token is more likely there.
    assert all(s > r for s, r in zip(out.logprobs, out.raw_logprobs, strict=True))


def test_same_seed_same_tokens_different_seeds_differ(engine):
    prompt = _prompt(5)

    async def go(seeds):
        reqs = [
            GenerateRequest(prompt=prompt, params=SamplingParams(max_tokens=24, seed=s))
            for s in seeds
        ]
        return [c.tokens for c in await asyncio.gather(*[engine.generate(r) for r in reqs])]

    a, b = run(go([1, 2])), run(go([1, 2]))
    assert a == b
    assert a[0] != a[1]


def test_group_members_without_seeds_never_share_a_stream(engine):
    """A group of G identical prompts must not come out identical (zero advantages otherwise)."""
    prompt = _prompt(6)

    async def group():
        reqs = [GenerateRequest(prompt=prompt, params=SamplingParams(max_tokens=24))] * 8
        return [c.tokens for c in await asyncio.gather(*[engine.generate(r) for r in reqs])]

    members = run(group())
    assert len(set(members)) == len(members)


def test_prefix_reuse_gives_identical_tokens_to_reprefill(cfg, model):
    first, tool_output = _prompt(7, 20), _prompt(8, 9)

    async def episode(eng, session):
        a = await eng.generate(GenerateRequest(prompt=first, params=_greedy(), session=session))
        turn2 = (*first, *a.tokens, *tool_output)
        b = await eng.generate(GenerateRequest(prompt=turn2, params=_greedy(), session=session))
        return a, b

    eng = Engine(model, cfg.rollout, max_len=MAX_LEN)
    try:
        reused = run(episode(eng, "ep-1"))
        fresh = run(episode(eng, ""))  # no session: every turn re-prefills
    finally:
        eng.close()
    assert reused[1].cached_tokens == len(first) + len(reused[0].tokens) - 1
    assert fresh[1].cached_tokens == 0
    assert reused[0].tokens == fresh[0].tokens
    assert reused[1].tokens == fresh[1].tokens


@pytest.mark.slow  # warms every bucket of a fresh engine (~50 s)
def test_no_compilation_while_serving_after_warmup(cfg, model):
    eng = Engine(model, cfg.rollout, max_len=MAX_LEN)
    compiles = []

    def listener(name, secs, **kw):
        if name == "/jax/core/compile/backend_compile_duration":
            compiles.append(secs)

    try:
        eng.warmup()
        jax.monitoring.register_event_duration_secs_listener(listener)

        async def serve():
            reqs = []
            for i in range(24):  # lengths over every bucket, sorting and non-sorting params
                params = SamplingParams(
                    max_tokens=8 + i % 9,
                    temperature=0.8,
                    top_p=0.9 if i % 2 else 1.0,
                    top_k=3 * (i % 3),
                    seed=i,
                )
                reqs.append(
                    GenerateRequest(
                        prompt=_prompt(i, 2 + 9 * i), params=params, session=f"s{i % 5}"
                    )
                )
            return await asyncio.gather(*[eng.generate(r) for r in reqs])

        outs = run(serve())
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
        eng.close()
    assert len(outs) == 24
    assert compiles == []


def test_publish_mid_generation_records_both_versions(cfg, model):
    eng = Engine(model, cfg.rollout, max_len=MAX_LEN)
    new_params = nnx.state(build_model(cfg.model, seed=99), nnx.Param)

    async def go():
        task = asyncio.create_task(
            eng.generate(
                GenerateRequest(prompt=_prompt(9), params=SamplingParams(max_tokens=200, seed=1))
            )
        )
        while eng.stats.steps < 5:
            await asyncio.sleep(0.001)
        eng.publish(new_params, version=1)
        return await task

    try:
        out = run(go())
    finally:
        eng.close()
    assert out.versions[0] == 0 and out.versions[-1] == 1
    assert list(out.versions) == sorted(out.versions)
    assert eng.version == 1


@pytest.mark.parametrize("policy", ["continue", "recompute"])
def test_publish_policies_finish_with_the_new_weights(cfg, policy):
    """After a publish, `recompute` equals decoding the whole sequence with the new weights."""
    old, new = build_model(cfg.model, seed=1), build_model(cfg.model, seed=2)
    from dataclasses import replace

    rollout = replace(cfg.rollout, in_flight_policy=policy)
    eng = Engine(old, rollout, max_len=MAX_LEN)
    prompt = _prompt(10, 12)

    async def go():
        task = asyncio.create_task(eng.generate(GenerateRequest(prompt=prompt, params=_greedy(60))))
        while eng.stats.steps < 3:
            await asyncio.sleep(0.001)
        eng.publish(nnx.state(new, nnx.Param), version=1)
        return await task

    try:
        out = run(go())
    finally:
        eng.close()
    k = out.versions.index(1)
    assert 0 < k < len(out.tokens)
    if policy == "recompute":
        prefix = [*prompt, *out.tokens[:k]]
        assert list(out.tokens[k:]) == naive_greedy(new, prefix, len(out.tokens) - k)


def test_cancellation_frees_the_slot(cfg, model):
    eng = Engine(model, cfg.rollout, max_len=MAX_LEN)  # 4 slots

    async def go():
        hogs = [
            asyncio.create_task(
                eng.generate(
                    GenerateRequest(
                        prompt=_prompt(i), params=SamplingParams(max_tokens=10_000, seed=i)
                    )
                )
            )
            for i in range(4)
        ]
        while eng.stats.steps < 2:
            await asyncio.sleep(0.001)
        for h in hogs:
            h.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)
        # All four slots must come back: four more requests complete.
        reqs = [GenerateRequest(prompt=_prompt(i), params=_greedy(4)) for i in range(4)]
        return await asyncio.wait_for(asyncio.gather(*[eng.generate(r) for r in reqs]), 60)

    try:
        outs = run(go())
    finally:
        eng.close()
    assert [len(o.tokens) for o in outs] == [4] * 4
    assert eng._slots.free_count() == 4


def test_oversized_prompt_is_refused_and_others_are_served(engine):
    async def go():
        good = asyncio.create_task(
            engine.generate(GenerateRequest(prompt=_prompt(1), params=_greedy(5)))
        )
        with pytest.raises(PromptTooLong, match="context window of 256 tokens"):
            await engine.generate(GenerateRequest(prompt=(1,) * MAX_LEN, params=_greedy()))
        return await good

    assert len(run(go()).tokens) == 5


def test_stop_tokens_strings_context_and_timeout(engine, model):
    prompt = _prompt(2)
    ref = naive_greedy(model, prompt, 12, vocab_limit=VOCAB)
    stop_at = ref[5]
    out = run(
        engine.generate(GenerateRequest(prompt=prompt, params=_greedy(stop_tokens=(stop_at,))))
    )
    assert out.finish_reason == FinishReason.STOP and out.tokens[-1] == stop_at
    assert out.tokens == tuple(ref[: ref.index(stop_at) + 1])

    long_prompt = _prompt(3, MAX_LEN - 3)
    out = run(engine.generate(GenerateRequest(prompt=long_prompt, params=_greedy(50))))
    assert out.finish_reason == FinishReason.CONTEXT and len(out.tokens) == 3

    req = GenerateRequest(prompt=prompt, params=SamplingParams(max_tokens=100_000), timeout_s=0.2)
    out = run(engine.generate(req))
    assert out.finish_reason == FinishReason.TIMEOUT and 0 < len(out.tokens) < 100_000


def test_stop_strings_use_the_decoder(cfg, model):
    from asyncrl.tokenize import ByteTokenizer

    tok = ByteTokenizer()
    ref = naive_greedy(model, _prompt(2), 12, vocab_limit=256)
    target = tok.decode(ref[3:5])
    eng = Engine(model, cfg.rollout, max_len=MAX_LEN, vocab_limit=256, decode_text=tok.decode)
    try:
        params = _greedy(12, stop_strings=(target,))
        out = run(eng.generate(GenerateRequest(prompt=_prompt(2), params=params)))
    finally:
        eng.close()
    assert out.finish_reason == FinishReason.STOP
    assert target in tok.decode(out.tokens)
    assert len(out.tokens) <= 5


def test_close_fails_pending_requests_cleanly(cfg, model):
    eng = Engine(model, cfg.rollout, max_len=MAX_LEN)

    async def go():
        tasks = [
            asyncio.create_task(
                eng.generate(
                    GenerateRequest(
                        prompt=_prompt(i), params=SamplingParams(max_tokens=100_000, seed=i)
                    )
                )
            )
            for i in range(8)
        ]  # 4 decoding, 4 waiting
        while eng.stats.steps < 2:
            await asyncio.sleep(0.001)
        await asyncio.get_running_loop().run_in_executor(None, eng.close)
        return await asyncio.gather(*tasks, return_exceptions=True)

    results = run(go())
    assert all(isinstance(r, EngineClosed) for r in results)
    with pytest.raises(EngineClosed):
        run(eng.generate(GenerateRequest(prompt=(1, 2), params=_greedy())))


def test_admission_queue_is_bounded(cfg, model):
    from dataclasses import replace

    eng = Engine(model, replace(cfg.rollout, engine_queue=2), max_len=MAX_LEN)

    async def go():
        tasks = [
            asyncio.create_task(eng.generate(GenerateRequest(prompt=_prompt(i), params=_greedy(3))))
            for i in range(12)
        ]
        outs = await asyncio.gather(*tasks)
        return outs

    try:
        outs = run(go())
    finally:
        eng.close()
    assert len(outs) == 12
