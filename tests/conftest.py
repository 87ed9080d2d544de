"""Test session set-up: 4 virtual CPU devices (meshes, disaggregated placement), float32."""

import os
from dataclasses import dataclass
from pathlib import Path

# LLVM's backend optimisation off: the tests' programs are tiny and compile-bound, and level 0
# compiles them about 1.4x faster (test_model: 40 s -> 30 s without a cache). Results are still
# float32 with the same HLO; every test compares two computations made under the same flags.
os.environ.setdefault(
    "XLA_FLAGS", "--xla_force_host_platform_device_count=4 --xla_backend_optimization_level=0"
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One persistent compilation cache for the session and every process it starts (kfp.local runs
# each component in a subprocess): a jitted step compiled once is loaded, not recompiled.
_CACHE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), ".cache", "jax")
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", _CACHE)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

import pytest  # noqa: E402  (after the environment above: JAX reads it at import)

# Under pytest-xdist (`make test` runs two workers) some modules must share one worker:
# - the whole-pipeline runs are session fixtures, made once per worker that asks for them, so every
#   module that reads one goes to the same worker and each run is made once per session;
# - the sandbox tests list every sandbox process and folder on the host, so another worker's
#   sandbox would read as a leak.
# Every other test is its own unit. (xdist's `xdist_group` marker does not work with pytest 9:
# it rewrites a node id attribute pytest 9 no longer reads.)
_SHARED_WORKER = {
    **dict.fromkeys(
        ["test_cli.py", "test_compare.py", "test_pipeline.py", "test_report_browser.py"],
        "pipeline-runs",
    ),
    **dict.fromkeys(["test_sandbox.py", "test_sandbox_adversarial.py"], "sandbox"),
}


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    from xdist.scheduler import LoadScopeScheduling

    class SharedWorkerScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid):
            module = nodeid.split("::", 1)[0].rsplit("/", 1)[-1]
            return _SHARED_WORKER.get(module, nodeid)

    return SharedWorkerScheduling(config, log)


@pytest.fixture(scope="session")
def gcs_bucket():
    """A gs:// bucket on a loopback GCS emulator, shared by the session's tests."""
    from asyncrl.testing.gcs import gcs_emulator

    with gcs_emulator() as bucket:
        yield bucket


# -- whole-pipeline runs, each made once per session and shared by the tests that read them ------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# The micro model through every stage: small enough for seconds per stage; it proves the wiring,
# not learning (2 RL steps), so the gate's bars are 0.
PIPELINE_OVERRIDES = (
    "learner.steps=2",
    "learner.time_budget_s=0",
    "learner.eval_every=0",
    "warm_start.steps=10",
    "warm_start.warmup_steps=2",
    "warm_start.content_steps=0",
    "warm_start.batch_size=4",
    "env.heldout_size=1",
    "env.train_size=8",
    "gate.samples_per_task=1",
    "gate.min_solve_rate=0.0",
    "gate.min_gain=0.0",
    "tracing.tensorboard=false",
)


def local_pipeline_run(folder, *overrides):
    """The local pipeline (kfp.local) on the micro config, its runs and champion under `folder`."""
    from asyncrl.config import load_config
    from asyncrl.pipeline.local import run_local
    from asyncrl.testing.configs import MICRO_OVERRIDES

    cfg = load_config(
        os.path.join(ROOT, "configs/local.yaml"),
        [
            *MICRO_OVERRIDES,
            *PIPELINE_OVERRIDES,
            f"pipeline.runs_dir={folder / 'runs'}",
            f"gate.champion={folder / 'ch'}",
            *overrides,
        ],
    )
    return run_local(cfg)


@dataclass(frozen=True)
class PipelineRun:
    folder: Path  # holds runs/ and the champion registry ch/
    result: object  # pipeline.local.LocalRun: how far the run got, from its validated results
    returncode: int | None = None  # of `asyncrl run`, for the run made through the CLI
    output: str = ""


@pytest.fixture(scope="session")
def passing_run(tmp_path_factory):
    """A run through every stage, made the way a user makes one: `asyncrl run` (what `make run`
    calls) in its own process, run id `passing`."""
    import subprocess
    import sys

    from asyncrl.pipeline.local import outcome
    from asyncrl.run_layout import RunLayout
    from asyncrl.testing.configs import MICRO_OVERRIDES

    folder = tmp_path_factory.mktemp("passing-run")
    overrides = [
        *MICRO_OVERRIDES,
        *PIPELINE_OVERRIDES,
        f"pipeline.runs_dir={folder / 'runs'}",
        "pipeline.run_id=passing",
        f"gate.champion={folder / 'ch'}",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "run", "configs/local.yaml", *overrides],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    layout = RunLayout.of(folder / "runs" / "passing")
    return PipelineRun(folder, outcome(layout), done.returncode, done.stdout + done.stderr)


@pytest.fixture(scope="session")
def failing_gate_run(tmp_path_factory):
    """A run whose gate cannot pass (min_solve_rate 1), without warm start or recovery test,
    made in-process through `pipeline.local.run_local`."""
    folder = tmp_path_factory.mktemp("failing-gate-run")
    result = local_pipeline_run(
        folder,
        "gate.min_solve_rate=1.0",
        "pipeline.stages=[provision,train,quality_gate,report]",
    )
    return PipelineRun(folder, result)


def recovery_verdict(*phases: tuple[str, bool]):
    """A recovery verdict of (phase name, passed) phases, as the stage records it: a failed phase
    resumed from the checkpoint before its kill with parameters that differ."""
    from asyncrl.stages.recovery_test import PhaseVerdict, RecoveryVerdict

    verdicts = tuple(
        PhaseVerdict(
            phase=name,
            kill_step=3,
            killed=True,
            checkpoint_at_kill=2,
            resumed_step=2,
            bit_identical=ok,
            cursor_ok=True,
            lost_steps=1,
            lost_tasks=0,
            passed=ok,
            detail="" if ok else "weights differ",
        )
        for name, ok in phases
    )
    passed = all(ok for _, ok in phases)
    return RecoveryVerdict(
        passed=passed, completed=True, final_step=6, seconds=9.0, phases=verdicts
    )
