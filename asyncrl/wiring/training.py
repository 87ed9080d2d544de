"""Wiring of a training run: the task stream, the rollout plan, the engine, and resumption.

`stages/train.py` composes these; each is a plain function of the config (and of what it needs),
so tests and benchmarks build exactly the loop that the train stage runs.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from asyncrl.checkpoint.manager import Checkpointer, CheckpointError, digest, flatten
from asyncrl.checkpoint.train_record import TrainRecord, incompatibilities
from asyncrl.config import RunConfig, to_yaml
from asyncrl.envs.tasks import EpochOrder, task_stream
from asyncrl.learner.learner import Learner
from asyncrl.learner.lockstep import Lockstep
from asyncrl.model import build_model
from asyncrl.model import hf_checkpoint as hf
from asyncrl.rollout.orchestrator import OrchestratorSettings, RolloutPlan
from asyncrl.run_layout import RunLayout, Stage
from asyncrl.sampling.protocol import RolloutEngine
from asyncrl.wiring.devices import Placement
from asyncrl.wiring.episodes import Wiring

ADDRESSES_ENV = "ASYNCRL_ROLLOUT_ADDRESSES"  # host:port,host:port of JobSet rollout replicas


def training_tasks(cfg: RunConfig) -> EpochOrder:
    """The training stream: the train split, epoch after epoch, each epoch in its seeded order."""
    tasks = list(task_stream(cfg.env.tasks, "train", cfg.env.train_size, cfg.env.seed))
    return EpochOrder(tasks, cfg.seed)


def rollout_plan(cfg: RunConfig, wiring: Wiring, engine: RolloutEngine) -> RolloutPlan:
    """How the training run's episodes run: the orchestrator's settings and the queue's policy."""
    groups_per_step = cfg.learner.batch_size // cfg.rollout.group_size
    return RolloutPlan(
        engine=engine,
        settings=OrchestratorSettings(
            group_size=cfg.rollout.group_size,
            max_concurrency=cfg.rollout.max_concurrency,
            limits=wiring.limits(),
            sampling=wiring.sampling(),
            seed=cfg.seed,
            cancel_doomed=cfg.rollout.cancel_doomed_groups,
        ),
        make_env=wiring.make_env,
        make_agent=wiring.make_agent,
        failure_policy=cfg.rollout.failure_policy,
        max_retries=cfg.rollout.max_retries,
        max_ready=max(cfg.rollout.max_ready_groups, groups_per_step),
    )


def resume(checkpointer: Checkpointer, learner: Learner, cfg: RunConfig) -> TrainRecord:
    """Restore the learner from the newest complete checkpoint; a fresh record when there is none.

    Refused (CheckpointError) when the checkpoint was made by a config whose binding keys differ,
    or when its record does not validate.
    """
    step = checkpointer.latest_step()
    if step is None:
        return TrainRecord()
    where = f"checkpoint step {step} at {checkpointer.uri}"
    saved = TrainRecord.from_json(checkpointer.read_pipeline(step), where)
    diffs = incompatibilities(saved.config, cfg.to_dict())
    if diffs:
        raise CheckpointError(
            f"{where} was made by an incompatible config:\n  " + "\n  ".join(diffs)
        )
    learner.state, _ = checkpointer.restore(learner.state, step)
    return saved


def note_restored(layout: RunLayout, learner: Learner, record: TrainRecord) -> None:
    """Write what was restored (step, version, digest of the state) for the recovery test and
    the operator. Every process calls it (the digest gathers across hosts); process 0 writes."""
    if not learner.step:
        return
    restored = {"step": learner.step, "version": record.state.version}
    restored["digest"] = digest(flatten(learner.state))  # computed afresh, not copied
    if learner.lockstep.leader:
        layout.write_text(layout.resume_record, json.dumps(restored) + "\n")


def note_trained(layout: RunLayout, learner: Learner) -> None:
    """On a trainer of several processes, record what this process holds at the end: the step and
    a SHA-256 of each parameter shard on its devices, keyed by the shard's place in the whole
    array (`RunLayout.host_record`). No collective: each process reads only its own memory, so a
    follower that drifted from process 0 shows as a differing digest of a shard both hold (every
    shard on a data-parallel mesh). Nothing on a single process."""
    import jax

    if jax.process_count() == 1:
        return
    shards: dict[str, str] = {}
    for name, leaf in flatten(learner.state.params).items():
        for shard in leaf.addressable_shards:
            place = ",".join(
                f"{s.start or 0}:{n if s.stop is None else s.stop}"
                for s, n in zip(shard.index, leaf.shape, strict=True)
            )
            key = f"{name}[{place}]"
            if key not in shards:  # a shard on several local devices: the first copy
                data = np.ascontiguousarray(np.asarray(shard.data))
                shards[key] = hashlib.sha256(data.tobytes()).hexdigest()
    process = jax.process_index()
    record = {"process": process, "processes": jax.process_count(), "step": learner.step}
    text = json.dumps(record | {"shards": shards}, sort_keys=True)
    layout.write_text(layout.host_record(process), text + "\n")


def learner_for(
    cfg: RunConfig,
    wiring: Wiring,
    placement: Placement,
    source: str | None,
    steps: Lockstep | None = None,
) -> Learner:
    """The stage's learner: the model (from `source` when given) on the train mesh, keeping step
    with the trainer's other processes through `steps` (default: alone)."""
    model = build_model(cfg.model, seed=cfg.seed)
    if source:
        hf.load_into(model, source)
    tokenizer_vocab = wiring.fmt.tok.vocab_size  # the ids the engine can sample
    return Learner(
        model,
        cfg.learner,
        max_len=cfg.env.max_context,
        mesh=placement.train_mesh,
        vocab_limit=tokenizer_vocab,
        temperature=cfg.rollout.temperature,  # score the distribution the engine sampled from
        lockstep=steps,
    )


def local_engine(wiring: Wiring, learner: Learner, placement: Placement) -> RolloutEngine:
    return wiring.engine(
        learner.model(), placement=placement.engine_sharding, device_lock=placement.device_lock
    )


def remote_engine(cfg: RunConfig, layout: RunLayout, learner: Learner, init_model: str | None):
    """Rollout replicas in their own processes: local ones started here, or the JobSet's pods,
    whose addresses come in ASYNCRL_ROLLOUT_ADDRESSES. Returns (engine, local replicas or None)."""
    from flax import nnx

    from asyncrl.serving.client import RemoteEngine
    from asyncrl.serving.client_settings import ClientSettings
    from asyncrl.serving.replica import start_local_replicas

    def save_params(params, folder: Path) -> None:
        hf.save(nnx.merge(learner.graphdef, params, learner.rest), str(folder))

    given = os.environ.get(ADDRESSES_ENV)
    replicas = None
    if given:
        addresses = [_address(a) for a in given.split(",")]
    else:
        config_file = layout.write_text(
            layout.dir(Stage.TRAIN) / "rollout-config.yaml", to_yaml(cfg)
        )
        replicas = start_local_replicas(
            config_file,
            cfg.cluster.rollout_replicas,
            init_model,
            layout.replicas,
            weights_root=layout.weights,
        )
        addresses = replicas.addresses
    settings = ClientSettings.of(cfg)
    token = replicas.token if replicas is not None else None  # else the mounted Secret's
    engine = RemoteEngine(addresses, layout.weights, save_params, token=token, settings=settings)
    return engine, replicas


def _address(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{ADDRESSES_ENV}: {text!r:.80} is not host:port")
    return host, int(port)
