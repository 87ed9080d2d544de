"""The `asyncrl` command line: thin argument parsing over the stages.

Every command has `--help`. Configuration errors exit with status 2 and one line naming the key.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from asyncrl.config import ConfigError, load_config, to_yaml


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("config", help="YAML preset, e.g. configs/local.yaml")
    p.add_argument("overrides", nargs="*", help="dotted overrides such as learner.lr=3e-6")


def _cmd_config_show(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    sys.stdout.write(to_yaml(cfg))
    sys.stdout.write(f"# config hash: {cfg.hash()}\n")
    return 0


def _cmd_model_info(args: argparse.Namespace) -> int:
    from asyncrl.model import build_model, count_params

    cfg = load_config(args.config, args.overrides)
    model = build_model(cfg.model, seed=cfg.seed)
    print(json.dumps({"preset": cfg.model.preset, "params": count_params(model)}, indent=2))
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    """The main job: the whole pipeline on this machine through kfp.local (SubprocessRunner).
    One header, a line per stage start and end, a summary; the rest goes to the run's logs/
    (`--verbose`: everything on the terminal, as kfp.local prints it)."""
    import dataclasses

    cfg = load_config(args.config, args.overrides)
    from asyncrl.pipeline import console
    from asyncrl.pipeline.local import run_local
    from asyncrl.run_layout import RunLayout, new_run_id

    run_id = cfg.pipeline.run_id or new_run_id()
    cfg = dataclasses.replace(cfg, pipeline=dataclasses.replace(cfg.pipeline, run_id=run_id))
    layout = RunLayout.at(cfg.pipeline.runs_dir, run_id)
    print(f"asyncrl run {run_id} · config {args.config} · run folder {layout.root}", flush=True)
    if args.verbose:
        result = run_local(cfg)
        shown = None
    else:
        result, shown, logs = console.run_quietly(
            layout, cfg.learner.steps, sys.stdout, lambda: run_local(cfg)
        )
        for line in console.failure_tails(shown, logs):
            print(line)
    print(f"pipeline {result.final_state}")
    if shown is not None:
        for line in console.summary(shown, layout):
            print(line)
    if result.gate_passed is False:
        print("quality gate FAILED (see the gate report)")
    return 0 if result.succeeded else 1


def _run_dir(args: argparse.Namespace, cfg):
    """The run folder: --run-dir as given, else runs_dir/<run id> claimed for this config (a
    reused run id with another config is refused)."""
    from asyncrl.run_layout import RunLayout, new_run_id
    from asyncrl.stages.provision import claim

    if args.run_dir:
        return RunLayout.of(args.run_dir).create()
    layout = RunLayout.at(cfg.pipeline.runs_dir, cfg.pipeline.run_id or new_run_id())
    return claim(layout, cfg)


def _cmd_train(args: argparse.Namespace) -> int:
    """The train stage alone; resumes when the run folder holds a complete checkpoint."""
    cfg = load_config(args.config, args.overrides)
    from asyncrl.wiring.devices import ensure_host_devices

    ensure_host_devices(cfg)
    from asyncrl.cloud.distributed import initialize_from_env

    initialize_from_env()  # a JobSet trainer pod joins its slice's JAX job (no-op elsewhere)
    from asyncrl.stages.train import train

    layout = _run_dir(args, cfg)
    tr = train(cfg, layout, init_model=args.init_model)  # a CheckpointError: `main` says it
    print(
        f"train: {tr.steps} steps, held-out solve rate {100 * tr.initial_solve_rate:.1f}% -> "
        f"{100 * tr.final_solve_rate:.1f}% ({layout.root}/train/)"
    )
    return 0


def _cmd_recovery_test(args: argparse.Namespace) -> int:
    """Kill a short training run at each risky phase, resume it, print the verdict table."""
    cfg = load_config(args.config, args.overrides)
    from asyncrl.run_layout import Stage
    from asyncrl.stages.recovery_test import recovery_test, table

    layout = _run_dir(args, cfg)
    verdict = recovery_test(cfg, layout, init_model=args.init_model)
    print(table(verdict))
    print(f"verdict: {layout.result_path(Stage.RECOVERY_TEST)}")
    return 0 if verdict.passed else 1


def _cmd_trace_summary(args: argparse.Namespace) -> int:
    """Where the time went in a run's trace (our own reader: no trace processor needed)."""
    from pathlib import Path

    from asyncrl.tracing.reader import format_summary, read_packets, summarize, validate

    path = Path(args.run_dir)
    if path.is_dir():
        found = sorted(path.rglob("*.perfetto-trace"))
        if not found:
            print(f"asyncrl: no *.perfetto-trace under {path}", file=sys.stderr)
            return 2
        path = found[0]
    packets, truncated = read_packets(path)
    print(f"trace: {path} ({len(packets)} packets{', truncated' if truncated else ''})")
    print(format_summary(summarize(packets)))
    problems = validate(packets, truncated=truncated)
    for p in problems:
        print(f"invalid: {p}")
    return 1 if problems else 0


def _cmd_report(args: argparse.Namespace) -> int:
    from asyncrl.run_layout import RunLayout
    from asyncrl.stages.report import write_report

    paths = write_report(RunLayout.of(args.run_dir))
    print(f"report: {paths.markdown}\nreport: {paths.html}")
    return 0


def _cmd_compare(args: argparse.Namespace) -> int:
    """Runs side by side: config differences, held-out rates with intervals, gate checks, speed."""
    from pathlib import Path

    from asyncrl.compare import compare

    plot = Path(args.plot) if args.plot else None
    table, _ = compare(args.runs, plot)
    print(table)
    if plot is not None:
        print(f"\nlearning curves: {plot}")
    return 0


def _cmd_gate(args: argparse.Namespace) -> int:
    """Gate a run's model: exit 0 when it passes, 1 with the failed checks when it does not."""
    from pathlib import Path

    from asyncrl.run_layout import RunLayout, Stage

    layout = RunLayout.of(args.run_dir)
    if not layout.root.is_dir():
        raise ConfigError("run_dir", f"{args.run_dir!r:.80} is not an existing run folder")
    cfg = load_config(args.config or str(layout.config), args.overrides)
    from asyncrl.stages.promote import promote
    from asyncrl.stages.quality_gate import format_report, quality_gate

    result = quality_gate(cfg, layout, Path(args.model) if args.model else None)
    print(format_report(result))
    print(f"report: {layout.result_path(Stage.QUALITY_GATE)}")
    promotion = promote(cfg, layout)
    print(f"promotion: {promotion.decision.value}")
    return 0 if result.passed else 1


def _cmd_pipeline_compile(args: argparse.Namespace) -> int:
    from pathlib import Path

    from asyncrl.pipeline.remote import compile_components, compile_pipeline

    for config in args.configs:
        path = compile_pipeline(load_config(config), Path(args.out))
        print(f"compiled {config} -> {path}")
    if args.components:  # the components of the first config's runtime image
        for path in compile_components(load_config(args.configs[0]), Path(args.components)):
            print(f"compiled component -> {path}")
    return 0


def _kfp(fn):
    """Run a KFP command; endpoint failures exit 3 with one line naming the endpoint."""
    from asyncrl.pipeline.remote import KfpError

    try:
        return fn()
    except KfpError as e:
        print(f"asyncrl: {e}", file=sys.stderr)
        return 3


def _host(args, cfg) -> str:
    host = args.host or cfg.pipeline.kfp_host
    if not host:
        from asyncrl.config import ConfigError

        raise ConfigError("pipeline.kfp_host", "no KFP endpoint: pass --host URL or set it")
    return host


def _cmd_pipeline_submit(args: argparse.Namespace) -> int:
    from asyncrl.pipeline import remote

    cfg = load_config(args.config, args.overrides)

    def go():
        run = remote.submit(cfg, _host(args, cfg), args.run_name, args.experiment)
        print(f"experiment {args.experiment or cfg.pipeline.experiment}: {run.experiment_url}")
        print(f"submitted run {run.run_id}: {run.url}")
        return 0

    return _kfp(go)


def _cmd_pipeline_schedule(args: argparse.Namespace) -> int:
    from asyncrl.pipeline import remote

    cfg = load_config(args.config, args.overrides)

    def go():
        job = remote.schedule(cfg, _host(args, cfg), args.cron, args.run_name, args.experiment)
        print(f"experiment {args.experiment or cfg.pipeline.experiment}: {job.experiment_url}")
        print(f"scheduled recurring run {job.run_id} on cron {args.cron!r}: {job.url}")
        return 0

    return _kfp(go)


def _cmd_pipeline_wait(args: argparse.Namespace) -> int:
    """Exit 0 when the run succeeded (the gate passed), 1 when it ended otherwise."""
    from asyncrl.pipeline import remote

    def go():
        state = remote.wait(args.host, args.run_id, args.timeout)
        print(f"run {args.run_id}: {state}")
        return 0 if state == remote.SUCCEEDED else 1

    return _kfp(go)


def _cmd_provision(args: argparse.Namespace) -> int:
    """Create or reuse the config's TPU node pools, the trainer's and (remote placement) the
    rollout replicas' (`--dry-run`: print the requests only)."""
    cfg = load_config(args.config, args.overrides)
    from asyncrl.cloud.provision import ProvisionError, node_pool_requests, provision_node_pools

    try:
        if args.dry_run:
            print(json.dumps(node_pool_requests(cfg), indent=2))
            return 0
        print(json.dumps(provision_node_pools(cfg, endpoint=args.endpoint), indent=2))
    except ProvisionError as e:
        print(f"asyncrl: {e}", file=sys.stderr)
        return 3
    return 0


def _cmd_jobset_render(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.overrides)
    import yaml

    from asyncrl.cloud.jobset import render_jobset

    print(yaml.safe_dump(render_jobset(cfg, args.name, args.run_uri), sort_keys=False))
    return 0


def _cmd_rollout_server(args: argparse.Namespace) -> int:
    """A rollout replica for placement 'remote': serve an engine on a TCP port until killed."""
    cfg = load_config(args.config, args.overrides)
    import logging

    from asyncrl.serving import replica

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    return replica.run(cfg, args)


def _kfp_args(p: argparse.ArgumentParser, name_help: str) -> None:
    p.add_argument("--host", help="KFP endpoint URL (default pipeline.kfp_host)")
    p.add_argument(
        "--experiment",
        help="experiment to file it under, created if missing (default pipeline.experiment)",
    )
    p.add_argument("--run-name", "--name", dest="run_name", help=name_help)


def _pipeline_parser(sub) -> None:
    """`asyncrl pipeline compile|submit|schedule|wait`."""
    pipe = sub.add_parser("pipeline", help="compile, submit, schedule or wait for the KFP pipeline")
    pipe_sub = pipe.add_subparsers(dest="pipeline_command", required=True)
    comp = pipe_sub.add_parser("compile", help="compile to YAML (default pipelines/compiled/)")
    comp.add_argument("configs", nargs="+", help="configs whose cluster settings to compile for")
    comp.add_argument("--out", default="pipelines/compiled")
    comp.add_argument(
        "--components", default="components", help="where component specs go ('' = none)"
    )
    comp.set_defaults(func=_cmd_pipeline_compile)
    submit = pipe_sub.add_parser("submit", help="start a run on a KFP endpoint")
    _config_args(submit)
    _kfp_args(submit, "run name (default <pipeline.name>-<config hash>)")
    submit.set_defaults(func=_cmd_pipeline_submit)
    sched = pipe_sub.add_parser("schedule", help="a recurring run (KFP cron: six fields)")
    _config_args(sched)
    sched.add_argument("--cron", required=True, help="e.g. '0 0 3 * * *' (03:00 daily)")
    _kfp_args(sched, "recurring run name (default <pipeline.name>-scheduled)")
    sched.set_defaults(func=_cmd_pipeline_schedule)
    wait = pipe_sub.add_parser("wait", help="wait for a run; exit code = its verdict")
    wait.add_argument("run_id")
    wait.add_argument("--host", required=True)
    wait.add_argument("--timeout", type=float, default=6 * 3600)
    wait.set_defaults(func=_cmd_pipeline_wait)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="asyncrl", description="Asynchronous agentic-RL post-training on JAX."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run the main job locally with a config")
    _config_args(run)
    run.add_argument(
        "--verbose", action="store_true", help="show kfp.local's whole output (default: logs/)"
    )
    run.set_defaults(func=_cmd_run)

    for name, func, text in (
        ("train", _cmd_train, "run (or resume) the train stage alone"),
        ("recovery-test", _cmd_recovery_test, "kill and resume a short run at each phase"),
    ):
        cmd = sub.add_parser(name, help=text)
        _config_args(cmd)
        cmd.add_argument("--run-dir", help="run folder (default: a new runs/<run-id>/)")
        cmd.add_argument("--init-model", help="HF model folder to start from")
        cmd.set_defaults(func=func)

    gate = sub.add_parser("gate", help="held-out quality gate of a run's model (exit 1: failed)")
    gate.add_argument("run_dir")
    gate.add_argument("--config", help="config (default: the run folder's config.yaml)")
    gate.add_argument("--model", help="model folder (default: the run's trained model)")
    gate.add_argument(
        "overrides", nargs="*", help="dotted overrides such as gate.min_solve_rate=0.3"
    )
    gate.set_defaults(func=_cmd_gate)

    cmp_ = sub.add_parser("compare", help="compare runs side by side (run folders or gs:// URIs)")
    cmp_.add_argument("runs", nargs="+", help="run folders or gs:// run URIs")
    cmp_.add_argument(
        "--plot", default="compare-curves.png", help="overlay of the learning curves ('' = none)"
    )
    cmp_.set_defaults(func=_cmd_compare)

    _pipeline_parser(sub)

    rs = sub.add_parser("rollout-server", help="serve a rollout engine (placement: remote)")
    _config_args(rs)
    from asyncrl.serving.replica import add_arguments as replica_arguments

    replica_arguments(rs)  # the same flags as `python -m asyncrl.serving.replica`
    rs.set_defaults(func=_cmd_rollout_server)

    prov = sub.add_parser("provision", help="create or reuse the GKE TPU node pools")
    _config_args(prov)
    prov.add_argument("--dry-run", action="store_true", help="print the requests, send nothing")
    prov.add_argument("--endpoint", help="GKE API endpoint (default: Google's)")
    prov.set_defaults(func=_cmd_provision)
    js = sub.add_parser("jobset", help="render the trainer/rollout JobSet as YAML")
    _config_args(js)
    js.add_argument("--name", default="asyncrl-run")
    js.add_argument("--run-uri", default="gs://BUCKET/runs/RUN")
    js.set_defaults(func=_cmd_jobset_render)

    trace = sub.add_parser("trace", help="inspect traces")
    trace_sub = trace.add_subparsers(dest="trace_command", required=True)
    summary = trace_sub.add_parser("summary", help="where the time went, and whether it is valid")
    summary.add_argument("run_dir", help="a run folder or a .perfetto-trace file")
    summary.set_defaults(func=_cmd_trace_summary)

    report = sub.add_parser("report", help="write the run report (Markdown and HTML)")
    report.add_argument("run_dir")
    report.set_defaults(func=_cmd_report)

    config = sub.add_parser("config", help="inspect configurations")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    show = config_sub.add_parser("show", help="print the resolved config")
    _config_args(show)
    show.set_defaults(func=_cmd_config_show)

    model = sub.add_parser("model", help="inspect the model of a config")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    info = model_sub.add_parser("info", help="print the parameter count")
    _config_args(info)
    info.set_defaults(func=_cmd_model_info)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command. Exit status: 0 done; 1 the command's own "no" (a failed gate or run);
    2 bad input, with one line naming it; 3 an endpoint failed; 70 an internal error, with one
    line and the path of a log holding the traceback; 130 interrupted; 141 stdout was closed
    (quietly, like a tool killed by SIGPIPE)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe surfaces here rather than at interpreter exit
        return code
    except KeyboardInterrupt:
        _say("interrupted")
        return 130
    except Exception as e:  # every failure ends as an exit status and one line
        return _failure(e, argv)


# -- how a command fails (used by `main` only) ----------------------------------------------------

# Errors of bad input, by qualified class name (matched along the MRO, so no module is imported
# to recognise them), and their exit status.
_EXPECTED: dict[str, int] = {
    "asyncrl.config.errors.ConfigError": 2,
    "asyncrl.run_layout.LayoutError": 2,
    "asyncrl.records.RecordError": 2,
    "asyncrl.tracing.reader.TraceError": 2,
    "asyncrl.checkpoint.manager.CheckpointError": 2,
    "asyncrl.rollout.cursor.CursorError": 2,
    "asyncrl.learner.state.StateError": 2,
    "asyncrl.model.hf_checkpoint.CheckpointMismatch": 2,
    "asyncrl.cloud.jobset.JobSetError": 2,
    "asyncrl.gates.champion.RegistryError": 2,
    "asyncrl.serving.auth.TokenError": 2,
    "asyncrl.serving.replica.ReplicaError": 2,
    "asyncrl.storage.UnsafeObjectName": 2,
    "asyncrl.storage.TooLarge": 2,
    "asyncrl.pipeline.remote.KfpError": 3,
    "asyncrl.cloud.provision.ProvisionError": 3,
}
_PATH_ERRORS = (
    FileNotFoundError,
    IsADirectoryError,
    NotADirectoryError,
    FileExistsError,
    PermissionError,
)
_MESSAGE_CHARS = 600
INTERNAL_ERROR = 70  # EX_SOFTWARE of sysexits.h


def _failure(e: Exception, argv: Sequence[str] | None) -> int:
    if isinstance(e, BrokenPipeError) and _stdout_closed():
        _silence_stdout()
        return 141
    expected = _expected(e)
    if expected is not None:
        code, message = expected
        _say(message)
        return code
    try:
        log = _write_crash_log(e, argv)
    except OSError as log_error:
        _say(f"internal error: {type(e).__name__}: {e} (no log: {log_error}); traceback follows")
        import traceback

        traceback.print_exception(e, file=sys.stderr)
        return INTERNAL_ERROR
    _say(f"internal error: {type(e).__name__}: {e}; traceback in {log}")
    return INTERNAL_ERROR


def _expected(e: Exception) -> tuple[int, str] | None:
    """(exit status, message) for an error of bad input; None for anything else."""
    if isinstance(e, ConfigError):
        return 2, str(e)
    for cls in type(e).__mro__:
        code = _EXPECTED.get(f"{cls.__module__}.{cls.__qualname__}")
        if code is not None:
            return code, str(e)
    if isinstance(e, _PATH_ERRORS):
        paths = " -> ".join(str(p) for p in (e.filename, e.filename2) if p is not None)
        return 2, f"{e.strerror or type(e).__name__}: {paths or e}"
    if isinstance(e, json.JSONDecodeError):
        return 2, f"malformed JSON: {e.msg} at line {e.lineno}, column {e.colno}"
    if isinstance(e, UnicodeDecodeError):
        return 2, f"not UTF-8 text: {e.reason} at byte {e.start}"
    return None


def _say(message: str) -> None:
    """One line on stderr, however long or multi-line the message."""
    text = " ".join(str(message).split())
    if len(text) > _MESSAGE_CHARS:
        text = f"{text[: _MESSAGE_CHARS - 20]}... ({len(text)} chars)"
    print(f"asyncrl: {text}", file=sys.stderr, flush=True)


def _write_crash_log(e: Exception, argv: Sequence[str] | None) -> str:
    """The traceback in a new file under the temp folder ($TMPDIR), written whole or not at all."""
    import datetime as dt
    import os
    import tempfile
    import traceback

    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%d-%H%M%S")
    command = " ".join(sys.argv[1:] if argv is None else argv)
    text = f"asyncrl {command}\n{''.join(traceback.format_exception(e))}"
    fd, tmp = tempfile.mkstemp(prefix=f".asyncrl-error-{stamp}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        final = os.path.join(os.path.dirname(tmp), os.path.basename(tmp)[1:-4] + ".log")
        os.replace(tmp, final)
    except BaseException:
        os.unlink(tmp)
        raise
    return final


def _stdout_closed() -> bool:
    """Whether stdout is a pipe or socket whose reader went away (POLLERR on Linux)."""
    import select

    try:
        fd = sys.stdout.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(events & (select.POLLERR | select.POLLHUP) for _, events in poller.poll(0))
    except (AttributeError, OSError, ValueError):  # stdout replaced by an object without a fd
        return False


def _silence_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not complain again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass


if __name__ == "__main__":
    sys.exit(main())
