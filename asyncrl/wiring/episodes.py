"""Wiring shared by the stages: the chat format, environments, agents, limits and evaluation.

Stages build concrete objects only through these functions, so warm start, training, the gate
and the benchmarks run episodes exactly the same way.
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass

from asyncrl.agents import ModelAgent, ToolAgent
from asyncrl.config import RunConfig
from asyncrl.envs.latency import DelayedEnvironment, LatencySpec
from asyncrl.envs.registry import build_environment
from asyncrl.envs.tasks import heldout
from asyncrl.gates.evaluation import EvalSummary, run_episodes, summarize
from asyncrl.model import Transformer
from asyncrl.rollout.episode import EpisodeLimits
from asyncrl.sampling.engine import Engine
from asyncrl.tokenize import build_chat_format, build_tokenizer
from asyncrl.tokenize.chat import ChatFormat
from asyncrl.types import SamplingParams


@dataclass(frozen=True)
class Wiring:
    cfg: RunConfig
    fmt: ChatFormat

    @classmethod
    def of(cls, cfg: RunConfig) -> Wiring:
        tokenizer = build_tokenizer(cfg.tokenizer)
        return cls(cfg=cfg, fmt=build_chat_format(cfg.tokenizer, tokenizer))

    def make_env(self, task):
        env = build_environment(task, self.cfg.env)
        e = self.cfg.env
        if e.latency_p50_s > 0:
            spec = LatencySpec(kind="lognormal", p50_s=e.latency_p50_s, p99_s=e.latency_p99_s)
            env = DelayedEnvironment(env, spec, random.Random(task.id))
        return env

    def make_agent(self):
        return ToolAgent(self.fmt) if self.cfg.env.agent == "tool" else ModelAgent(self.fmt)

    def limits(self) -> EpisodeLimits:
        e = self.cfg.env
        return EpisodeLimits(
            max_steps=e.max_steps,
            max_response_tokens=e.max_response_tokens,
            max_context=e.max_context,
            timeout_s=e.episode_timeout_s,
        )

    def sampling(self, temperature: float | None = None) -> SamplingParams:
        r = self.cfg.rollout
        return SamplingParams(
            max_tokens=r.max_tokens,
            temperature=r.temperature if temperature is None else temperature,
            top_k=r.top_k,
            top_p=r.top_p,
            min_p=r.min_p,
            repetition_penalty=r.repetition_penalty,
            stop_tokens=self.fmt.stop_tokens,
        )

    def engine(self, model: Transformer, **kw) -> Engine:
        return Engine(
            model,
            self.cfg.rollout,
            max_len=self.cfg.env.max_context,
            vocab_limit=self.fmt.tok.vocab_size,
            decode_text=self.fmt.tok.decode,
            seed=self.cfg.seed,
            **kw,
        )

    def heldout(self):
        return heldout(self.cfg.env.tasks, self.cfg.env.heldout_size, self.cfg.env.seed)

    async def evaluate(
        self, engine, tasks=None, *, temperature: float = 0.0, samples: int = 1, tag: str = "eval"
    ) -> EvalSummary:
        tasks = tasks if tasks is not None else self.heldout()
        results = await run_episodes(
            engine,
            tasks,
            make_env=self.make_env,
            make_agent=self.make_agent,
            limits=self.limits(),
            sampling=self.sampling(temperature),
            samples=samples,
            concurrency=self.cfg.rollout.max_concurrency,
            seed=self.cfg.seed,
            tag=tag,
        )
        return summarize(tasks, results)


def evaluate_model(cfg: RunConfig, model: Transformer) -> EvalSummary:
    """Greedy held-out evaluation of a model on a fresh engine (blocking)."""
    wiring = Wiring.of(cfg)
    engine = wiring.engine(model)
    try:
        return asyncio.run(wiring.evaluate(engine))
    finally:
        engine.close()
