"""Compile, submit, schedule and wait for the pipeline on a Kubeflow Pipelines endpoint.

Thin use of `kfp.Client` (the KFP v2beta1 REST API). Every network failure becomes a `KfpError`
that names the endpoint and what was attempted: an unreachable host, a refusal (HTTP 4xx/5xx with
the server's message), a run that ends in another state than SUCCEEDED. The run config is passed
as the pipeline's `config_yaml` parameter (resolved here, with the CLI's overrides applied); the
run is filed under an experiment, created when missing, and the UI pages of both are returned. The
Kubernetes service account is named, never a key. `wait` maps the run's final state to an exit
code, so CI can gate on `asyncrl pipeline wait`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from asyncrl.config import RunConfig, to_yaml

COMPILED_DIR = Path("pipelines/compiled")
COMPONENTS_DIR = Path("components")
SUCCEEDED = "SUCCEEDED"


class KfpError(RuntimeError):
    pass


def compiled_name(cfg: RunConfig) -> str:
    return f"{cfg.pipeline.name}-{cfg.cluster.backend}.yaml"


def compile_pipeline(cfg: RunConfig, out_dir: Path = COMPILED_DIR) -> Path:
    from kfp import compiler

    from asyncrl.pipeline.definition import build_pipeline

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / compiled_name(cfg)
    compiler.Compiler().compile(build_pipeline(cfg), str(path))
    return path


def compile_components(cfg: RunConfig, out_dir: Path = COMPONENTS_DIR) -> list[Path]:
    """Each stage's component as a reusable spec, `<out_dir>/<stage>/component.yaml`, on the
    config's runtime image (what `kfp.components.load_component_from_file` reads)."""
    from kfp import compiler

    from asyncrl.pipeline.components import FUNCTIONS, components

    made = components(cfg.cluster.image)
    paths = []
    for f in FUNCTIONS:
        path = out_dir / f.__name__ / "component.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        compiler.Compiler().compile(getattr(made, f.__name__), str(path))
        paths.append(path)
    return paths


@dataclass(frozen=True, slots=True)
class Submitted:
    """A run (or a recurring run) created on the endpoint, with the UI pages that show it."""

    run_id: str  # the run's id, or the recurring run's
    url: str  # its page in the Kubeflow UI
    experiment_id: str
    experiment_url: str


def ui_link(host: str, kind: str, ident: str) -> str:
    """A page of the Kubeflow UI at `host` (the routes of KFP's frontend): kind is `runs`,
    `recurringrun` or `experiments`."""
    return f"{host.rstrip('/')}/#/{kind}/details/{ident}"


def _probe(host: str) -> None:
    """Ask the endpoint's health check first: kfp.Client would hide a refusal behind retries."""
    import urllib.error
    import urllib.request

    url = f"{host.rstrip('/')}/apis/v2beta1/healthz"
    try:
        with urllib.request.urlopen(url, timeout=10):
            return
    except urllib.error.HTTPError as e:
        body = e.read().decode(errors="replace").strip()[:300]
        message = f"Kubeflow Pipelines at {host} refused: HTTP {e.code} {e.reason}: {body}"
        raise KfpError(message) from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise KfpError(f"cannot reach Kubeflow Pipelines at {host}: {reason}") from None


def _client(host: str):
    import kfp

    _probe(host)
    try:
        return kfp.Client(host=host)
    except Exception as e:  # kfp raises several kinds while it loads its configuration
        raise KfpError(f"cannot reach Kubeflow Pipelines at {host}: {_reason(e)}") from None


def _reason(e: Exception) -> str:
    status = getattr(e, "status", None)
    body = getattr(e, "body", None)
    if status:
        return f"HTTP {status} {getattr(e, 'reason', '')}: {(body or '').strip()[:300]}"
    return f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"


def _call(host: str, what: str, fn):
    import contextlib
    import io

    try:  # kfp.Client prints its own links to stdout; the CLI prints its own lines instead
        with contextlib.redirect_stdout(io.StringIO()):
            return fn()
    except KfpError:
        raise
    except Exception as e:
        raise KfpError(f"{what} at {host} failed: {_reason(e)}") from None


def _experiment(client, host: str, name: str) -> tuple[str, str]:
    """The experiment's id and page, created when no experiment has that name."""
    # kfp's create_experiment gets the experiment by name first and creates it only if missing.
    found = _call(
        host, f"finding or creating experiment {name!r}", lambda: client.create_experiment(name)
    )
    return found.experiment_id, ui_link(host, "experiments", found.experiment_id)


def submit(
    cfg: RunConfig, host: str, run_name: str | None = None, experiment: str | None = None
) -> Submitted:
    """Start a run of the pipeline with `cfg` as its config, filed under `experiment` (default
    `pipeline.experiment`, created if missing)."""
    package = compile_pipeline(cfg, Path(_tmpdir()))
    client = _client(host)
    experiment_id, experiment_url = _experiment(client, host, experiment or cfg.pipeline.experiment)
    result = _call(
        host,
        "creating the run",
        lambda: client.create_run_from_pipeline_package(
            str(package),
            arguments={"config_yaml": to_yaml(cfg)},
            run_name=run_name or f"{cfg.pipeline.name}-{cfg.hash()[:8]}",
            experiment_id=experiment_id,
            service_account=cfg.cluster.service_account,
            enable_caching=False,
        ),
    )
    url = ui_link(host, "runs", result.run_id)
    return Submitted(result.run_id, url, experiment_id, experiment_url)


def schedule(
    cfg: RunConfig,
    host: str,
    cron: str,
    name: str | None = None,
    experiment: str | None = None,
) -> Submitted:
    """A recurring run on a KFP cron (six fields: seconds first), filed like `submit`'s runs."""
    fields = cron.split()
    if len(fields) != 6:
        raise KfpError(
            f"cron {cron!r} has {len(fields)} fields; KFP needs six (second minute hour "
            "day-of-month month day-of-week), e.g. '0 0 3 * * *' for 03:00 daily"
        )
    package = compile_pipeline(cfg, Path(_tmpdir()))
    client = _client(host)
    experiment_id, experiment_url = _experiment(client, host, experiment or cfg.pipeline.experiment)
    job = _call(
        host,
        "creating the recurring run",
        lambda: client.create_recurring_run(
            experiment_id=experiment_id,
            job_name=name or f"{cfg.pipeline.name}-scheduled",
            cron_expression=cron,
            pipeline_package_path=str(package),
            params={"config_yaml": to_yaml(cfg)},
            service_account=cfg.cluster.service_account,
            enable_caching=False,
            no_catchup=True,
        ),
    )
    url = ui_link(host, "recurringrun", job.recurring_run_id)
    return Submitted(job.recurring_run_id, url, experiment_id, experiment_url)


def wait(host: str, run_id: str, timeout_s: float) -> str:
    """The run's final state (SUCCEEDED, FAILED, ...) after it ends."""
    client = _client(host)
    run = _call(
        host,
        f"waiting for run {run_id}",
        lambda: client.wait_for_run_completion(run_id, timeout=timeout_s, sleep_duration=2),
    )
    return str(run.state)


def _tmpdir() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="asyncrl-kfp-")
