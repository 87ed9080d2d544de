"""The `asyncrl` command line: help everywhere, config show round-trips, bad keys exit 2."""

import json

import pytest
import yaml

from asyncrl.cli import build_parser, main
from asyncrl.config import from_dict, load_config
from asyncrl.config.run import RunConfig


def _commands(parser, prefix=()):
    yield prefix
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        for name, sub in action.choices.items():
            yield from _commands(sub, (*prefix, name))


@pytest.mark.parametrize("command", list(_commands(build_parser())), ids=" ".join)
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([*command, "--help"])
    assert info.value.code == 0
    assert "usage: asyncrl" in capsys.readouterr().out


def test_config_show_prints_the_resolved_config(capsys):
    assert main(["config", "show", "configs/local.yaml", "learner.lr=2e-5"]) == 0
    printed = yaml.safe_load(capsys.readouterr().out)
    cfg = from_dict(RunConfig, printed)
    assert cfg == load_config("configs/local.yaml", ["learner.lr=2e-5"])


def test_bad_key_exits_2_with_one_clear_line(capsys):
    assert main(["config", "show", "configs/local.yaml", "learner.lrr=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "learner.lrr" in err[0] and "did you mean 'learner.lr'" in err[0]


def test_missing_config_file_exits_2(capsys):
    assert main(["config", "show", "configs/nope.yaml"]) == 2
    assert "configs/nope.yaml" in capsys.readouterr().err


@pytest.mark.entry
def test_run_executes_the_pipeline_and_exits_by_its_outcome(passing_run):
    """`asyncrl run` (what `make run` calls): the pipeline through kfp.local, exit 0 on success.
    The run is the session's `passing_run` (conftest.py), made by this very command."""
    assert passing_run.returncode == 0, passing_run.output[-3000:]
    run = passing_run.folder / "runs" / "passing"
    assert json.loads((run / "model_check.json").read_text())["ok"] is True
    assert load_config(run / "config.yaml").model.preset == "micro"
    assert json.loads((run / "warm_start" / "warm_start.json").read_text())["steps"] == 10
    assert json.loads((run / "train" / "train.json").read_text())["steps"] == 2
    assert json.loads((run / "teardown.json").read_text())["pipeline_state"] == "SUCCEEDED"
    assert (run / "report.html").exists() and (run / "train" / "learning_curve.png").exists()


LINE_BUDGET = 40  # a successful `asyncrl run` without a terminal (issue 19)


@pytest.mark.entry
def test_run_prints_a_short_transcript_and_logs_the_rest_per_stage(passing_run):
    lines = passing_run.output.splitlines()
    assert len(lines) <= LINE_BUDGET, passing_run.output
    assert lines[0].startswith("asyncrl run passing · config configs/local.yaml")
    ended = [line.split()[1] for line in lines if line.startswith("✓ ")]
    logs = passing_run.folder / "runs" / "passing" / "logs"
    assert ended and all((logs / f"{task}.log").stat().st_size > 0 for task in ended)
    assert "executor_input" not in passing_run.output  # kfp.local's JSON went to the logs
    assert "executor_input" in (logs / "train.log").read_text()
    assert "pipeline SUCCEEDED" in lines


def test_rollout_server_takes_the_same_flags_as_the_replica_module():
    import argparse

    from asyncrl.serving import replica

    def flags(parser):
        return {o for a in parser._actions for o in a.option_strings}

    module = argparse.ArgumentParser()
    replica.add_arguments(module)
    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    cli_flags = flags(sub.choices["rollout-server"])
    assert cli_flags == flags(module)
    assert {"--host", "--port", "--token-file", "--run-dir", "--weights-root"} <= cli_flags
    assert {"--init-model", "--ready-file", "--max-connections", "--read-timeout-s"} <= cli_flags
    argv = ["c.yaml", "--host", "0.0.0.0", "--port", "8470", "--token-file", "/t", "--run-dir", "r"]
    args = build_parser().parse_args(["rollout-server", *argv])
    assert (args.host, args.port, args.token_file, args.run_dir) == ("0.0.0.0", 8470, "/t", "r")
    assert args.max_connections is None and args.read_timeout_s is None  # = the config's keys
