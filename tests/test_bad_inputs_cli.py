"""Bad input at every `asyncrl` entry point: exit status 2 and one line naming the problem; an
internal error is one line plus a log file with the traceback; a closed stdout exits quietly."""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from asyncrl import cli
from asyncrl.cli import main
from asyncrl.config import RunConfig, to_yaml

LOCAL = "configs/local.yaml"


def fails(capsys, argv: list[str], code: int = 2) -> str:
    """Run `asyncrl argv` in-process; check the exit status and that stderr is one line."""
    assert main(argv) == code
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("asyncrl: ")
    return lines[0]


def _trace(path: Path, steps: int = 20) -> bytes:
    from asyncrl import tracing

    tracer = tracing.PerfettoTracer(path, chunk_events=8)
    track = tracer.track("learner")
    for i in range(steps):
        tracer.begin(track, "step", {"i": i})
        tracer.end(track)
    tracer.close()
    return path.read_bytes()


def _run_folder(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(to_yaml(RunConfig()))
    return run


# -- configs through every command that reads one ------------------------------------------------

CONFIG_COMMANDS = [
    ["config", "show"],
    ["model", "info"],
    ["jobset"],
    ["provision", "--dry-run"],
    ["pipeline", "compile"],
]


@pytest.mark.parametrize("command", CONFIG_COMMANDS, ids=" ".join)
def test_a_folder_as_the_config_exits_2_at_every_command(capsys, tmp_path, command):
    line = fails(capsys, [*command, str(tmp_path)])
    assert f"config file '{tmp_path}': is a folder" in line


@pytest.mark.parametrize("command", CONFIG_COMMANDS, ids=" ".join)
def test_a_binary_config_exits_2_at_every_command(capsys, tmp_path, command):
    (tmp_path / "c.yaml").write_bytes(b"\x7fELF\x02\x01\x01\x00\x00")
    assert "is binary (a NUL byte at offset 7)" in fails(
        capsys, [*command, str(tmp_path / "c.yaml")]
    )


def test_pipeline_compile_with_an_infinite_timeout_exits_2(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text("pipeline:\n  timeout_s: .inf\n")
    line = fails(capsys, ["pipeline", "compile", str(tmp_path / "c.yaml"), "--out", str(tmp_path)])
    assert "config key 'pipeline.timeout_s': got inf" in line


def test_a_list_as_the_model_preset_exits_2_naming_the_key(capsys, tmp_path):
    (tmp_path / "c.yaml").write_text("model:\n  preset: [tiny]\n")
    line = fails(capsys, ["model", "info", str(tmp_path / "c.yaml")])
    assert "config key 'model.preset': got ['tiny'] (list); expected a str" in line


def test_an_override_error_names_the_key(capsys):
    line = fails(capsys, ["config", "show", LOCAL, "rollout.top_k=99999999999"])
    assert "config key 'rollout.top_k': got 99999999999" in line and "int32" in line


def test_an_unknown_command_is_an_argparse_error_with_status_2(capsys):
    with pytest.raises(SystemExit) as info:
        main(["frobnicate"])
    assert info.value.code == 2
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err


# -- run folders --------------------------------------------------------------------------------


def test_gate_on_a_file_exits_2(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    assert str(tmp_path / "f") in fails(capsys, ["gate", str(tmp_path / "f")])


def test_gate_on_a_missing_folder_exits_2(capsys, tmp_path):
    assert str(tmp_path / "nope") in fails(capsys, ["gate", str(tmp_path / "nope")])


def test_report_into_a_folder_that_is_not_a_run_exits_2_and_writes_nothing(capsys, tmp_path):
    line = fails(capsys, ["report", str(tmp_path)])
    assert f"{tmp_path} is not a run folder" in line
    assert list(tmp_path.iterdir()) == []


def test_report_on_a_file_and_on_a_missing_path_exits_2(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    assert "is not a run folder" in fails(capsys, ["report", str(tmp_path / "f")])
    assert "is not a run folder" in fails(capsys, ["report", str(tmp_path / "nope")])
    assert not (tmp_path / "nope").exists()


def test_report_names_a_truncated_result_instead_of_failing(capsys, tmp_path):
    run = _run_folder(tmp_path)
    (run / "train").mkdir()
    (run / "train" / "train.json").write_text('{"steps": 3, "seco')
    assert main(["report", str(run)]) == 0
    assert "unreadable result" in (run / "report.md").read_text()
    assert "train.json" in (run / "report.md").read_text()


def test_train_with_a_file_as_the_run_dir_exits_2(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    line = fails(capsys, ["train", LOCAL, "--run-dir", str(tmp_path / "f")])
    assert str(tmp_path / "f") in line and "not a folder" in line


def _micro(tmp_path: Path, *overrides: str) -> str:
    from asyncrl.testing.configs import micro_config

    (tmp_path / "micro.yaml").write_text(to_yaml(micro_config(*overrides)))
    return str(tmp_path / "micro.yaml")


def test_a_reused_run_id_with_another_config_exits_2_naming_the_difference(capsys, tmp_path):
    from asyncrl.testing.configs import micro_config

    run = tmp_path / "r1"
    run.mkdir()
    pipeline = [f"pipeline.runs_dir={tmp_path}", "pipeline.run_id=r1"]
    recorded = to_yaml(micro_config(*pipeline))
    (run / "config.yaml").write_text(recorded)
    line = fails(capsys, ["train", _micro(tmp_path, *pipeline), "learner.lr=0.5"])
    assert "config key 'pipeline.run_id': 'r1' is an existing run with another config" in line
    assert "(learner.lr: 1e-05 → 0.5); use a new run id" in line
    assert (run / "config.yaml").read_text() == recorded and sorted(run.iterdir()) == [
        run / "config.yaml"
    ]


def test_a_run_whose_recorded_config_is_unreadable_exits_2(capsys, tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    (run / "config.yaml").write_text("learner: [")
    argv = ["train", _micro(tmp_path), f"pipeline.runs_dir={tmp_path}", "pipeline.run_id=r1"]
    line = fails(capsys, argv)
    assert f"{run / 'config.yaml'}: the run's recorded config is unreadable" in line


def test_train_with_a_file_as_checkpoint_dir_exits_2_naming_the_key(capsys, tmp_path):
    (tmp_path / "f").write_text("x")
    config = _micro(tmp_path, f"checkpoint.dir={tmp_path / 'f'}", "learner.steps=1")
    line = fails(capsys, ["train", config, "--run-dir", str(tmp_path / "run")])
    assert line.startswith(f"asyncrl: checkpoint.dir: '{tmp_path / 'f'}' is a file")
    assert (tmp_path / "f").read_text() == "x"


# -- rollout-server: every input is checked before the engine is built ---------------------------


ROLLOUT_SERVER_CASES = {  # flags over the good ones (None: leave the flag out), overrides, fragment
    "token-missing": ({"--token-file": "{tmp}/none"}, [], "cannot read the rollout token file"),
    "token-empty": ({"--token-file": "{tmp}/empty"}, [], "token file {tmp}/empty is empty"),
    "token-short": ({"--token-file": "{tmp}/short"}, [], "must be 16 to 4096 printable"),
    "no-token": ({"--token-file": None}, [], "no rollout token configured: pass --token-file"),
    "no-weights-root": ({"--run-dir": None}, [], "needs its weights root: pass --run-dir or"),
    "weights-root-file": ({"--weights-root": "{tmp}/token"}, [], "{tmp}/token exists and is not"),
    "port-high": ({"--port": "70000"}, [], "--port: got 70000; allowed: 0 (any free port) to"),
    "port-negative": ({"--port": "-1"}, [], "--port: got -1;"),
    "host-name": ({"--host": "localhost"}, [], "--host: got 'localhost'; allowed: an IP address"),
    "host-bad-ip": ({"--host": "10.0.0.300"}, [], "--host: got '10.0.0.300';"),
    "connections": ({"--max-connections": "-1"}, [], "--max-connections: got -1;"),
    "timeout-nan": ({"--read-timeout-s": "nan"}, [], "--read-timeout-s: got nan;"),
    "timeout-zero": ({"--read-timeout-s": "0"}, [], "--read-timeout-s: got 0.0;"),
    "timeout-inf": ({"--read-timeout-s": "inf"}, [], "--read-timeout-s: got inf;"),
    "config-port": ({}, ["cluster.rollout_port=0"], "'cluster.rollout_port': got 0; allowed: 1"),
    "config-host": ({}, ["cluster.rollout_bind_host=any"], "'cluster.rollout_bind_host': got"),
    "config-secret": ({}, ["cluster.rollout_token_secret=A_b"], "(DNS-1123 subdomain)"),
}


@pytest.mark.parametrize("case", list(ROLLOUT_SERVER_CASES))
def test_rollout_server_refuses_bad_input_before_building(capsys, monkeypatch, tmp_path, case):
    from asyncrl.serving.auth import TOKEN_ENV

    changes, overrides, fragment = ROLLOUT_SERVER_CASES[case]
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    (tmp_path / "token").write_text("a-test-token-0123456789\n")
    (tmp_path / "empty").write_text("\n")
    (tmp_path / "short").write_text("short\n")
    flags = {"--token-file": "{tmp}/token", "--run-dir": "{tmp}/run"} | changes
    argv = ["rollout-server", LOCAL, *overrides]
    for flag, value in flags.items():
        if value is not None:
            argv += [flag, value.replace("{tmp}", str(tmp_path))]
    assert fragment.replace("{tmp}", str(tmp_path)) in fails(capsys, argv)
    assert not (tmp_path / "run").exists()  # refused before anything was made


# -- trace summary ------------------------------------------------------------------------------


def test_trace_summary_of_a_valid_and_of_a_cut_trace_exits_0(capsys, tmp_path):
    data = _trace(tmp_path / "t.perfetto-trace")
    assert main(["trace", "summary", str(tmp_path / "t.perfetto-trace")]) == 0
    (tmp_path / "cut.perfetto-trace").write_bytes(data[: len(data) - 3])  # a crash's cut
    assert main(["trace", "summary", str(tmp_path / "cut.perfetto-trace")]) == 0
    assert "truncated" in capsys.readouterr().out


def test_trace_summary_of_garbage_exits_2(capsys, tmp_path):
    (tmp_path / "g.perfetto-trace").write_bytes(b"this is not a trace\n" * 10)
    line = fails(capsys, ["trace", "summary", str(tmp_path / "g.perfetto-trace")])
    assert "byte 0 (after 0 whole packets): 0x74 is not a trace packet" in line


def test_trace_summary_of_a_trace_with_a_garbage_tail_exits_2_naming_the_offset(capsys, tmp_path):
    data = _trace(tmp_path / "t.perfetto-trace")
    (tmp_path / "t.perfetto-trace").write_bytes(data + b"\xde\xad\xbe\xef garbage")
    line = fails(capsys, ["trace", "summary", str(tmp_path / "t.perfetto-trace")])
    assert f"byte {len(data)} (after" in line and "not a Perfetto trace" in line


@pytest.mark.parametrize(
    ("tail", "problem"),
    [
        (b"\x0a" + b"\xff" * 11, "longer than 10 bytes"),
        (b"\x0a\xff\xff\xff\xff\x0f", "is implausible"),
        (b"\x0a\x03\xff\xff\xff", "does not decode"),
    ],
    ids=["varint", "length", "payload"],
)
def test_trace_summary_of_a_malformed_packet_exits_2(capsys, tmp_path, tail, problem):
    data = _trace(tmp_path / "t.perfetto-trace", steps=2)
    (tmp_path / "t.perfetto-trace").write_bytes(data + tail)
    assert problem in fails(capsys, ["trace", "summary", str(tmp_path / "t.perfetto-trace")])


def test_trace_summary_of_an_empty_file_exits_2(capsys, tmp_path):
    (tmp_path / "e.perfetto-trace").write_bytes(b"")
    assert "empty file" in fails(capsys, ["trace", "summary", str(tmp_path / "e.perfetto-trace")])


def test_trace_summary_of_a_file_cut_inside_its_first_packet_exits_2(capsys, tmp_path):
    data = _trace(tmp_path / "t.perfetto-trace")
    (tmp_path / "t.perfetto-trace").write_bytes(data[:3])
    line = fails(capsys, ["trace", "summary", str(tmp_path / "t.perfetto-trace")])
    assert "no whole trace packet" in line


def test_trace_summary_of_a_missing_path_or_traceless_folder_exits_2(capsys, tmp_path):
    assert str(tmp_path / "nope") in fails(capsys, ["trace", "summary", str(tmp_path / "nope")])
    assert "no *.perfetto-trace" in fails(capsys, ["trace", "summary", str(tmp_path)])


# -- how failures are reported ------------------------------------------------------------------


def _raising(monkeypatch, error: BaseException) -> None:
    def command(args):
        raise error

    monkeypatch.setattr(cli, "_cmd_config_show", command)


@pytest.mark.parametrize(
    ("error", "fragment"),
    [
        (FileNotFoundError(2, "No such file or directory", "/x/y.json"), "/x/y.json"),
        (IsADirectoryError(21, "Is a directory", "/x/d"), "Is a directory: /x/d"),
        (NotADirectoryError(20, "Not a directory", "/x/f/y"), "Not a directory: /x/f/y"),
        (FileExistsError(17, "File exists", "/x/f"), "File exists: /x/f"),
        (PermissionError(13, "Permission denied", "/root/x"), "Permission denied: /root/x"),
        (json.JSONDecodeError("Expecting value", '{"a": ', 6), "malformed JSON"),
        (UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte"), "not UTF-8 text"),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, BaseException) else "",
)
def test_an_expected_error_exits_2_with_one_line(capsys, monkeypatch, error, fragment):
    _raising(monkeypatch, error)
    assert fragment in fails(capsys, ["config", "show", LOCAL])


def test_an_error_of_the_projects_own_input_kinds_exits_2(capsys, monkeypatch):
    from asyncrl.checkpoint.manager import CheckpointError
    from asyncrl.run_layout import LayoutError
    from asyncrl.serving.auth import TokenError
    from asyncrl.serving.replica import ReplicaError
    from asyncrl.storage import UnsafeObjectName
    from asyncrl.tracing.reader import TraceError

    for error in (
        LayoutError("run folder x: bad result"),
        TraceError("t: not a trace"),
        TokenError("the rollout token file /t is empty or over 4096 bytes"),
        UnsafeObjectName("gs://b/ckpt/10//tmp/x: refused the name '/tmp/x'"),
        CheckpointError("checkpoint step 3 at /c is corrupted"),
        ReplicaError("cannot bind 127.0.0.1:8470: Address already in use"),
    ):
        _raising(monkeypatch, error)
        assert fails(capsys, ["config", "show", LOCAL]) == f"asyncrl: {error}"


def test_a_multi_line_checkpoint_error_becomes_one_line(capsys, monkeypatch):
    from asyncrl.checkpoint.manager import CheckpointError

    _raising(monkeypatch, CheckpointError("step 3 was made by an incompatible config:\n  a: 1"))
    line = fails(capsys, ["config", "show", LOCAL])
    assert line == "asyncrl: step 3 was made by an incompatible config: a: 1"


def test_a_multi_line_message_becomes_one_line(capsys, monkeypatch):
    _raising(monkeypatch, FileNotFoundError(2, "No such\nfile", "/x\n/y"))
    assert fails(capsys, ["config", "show", LOCAL]) == "asyncrl: No such file: /x /y"


def test_an_internal_error_is_one_line_and_a_log_with_the_traceback(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _raising(monkeypatch, RuntimeError("kaboom\nsecond line"))
    line = fails(capsys, ["config", "show", LOCAL], code=cli.INTERNAL_ERROR)
    assert line.startswith(
        "asyncrl: internal error: RuntimeError: kaboom second line; traceback in "
    )
    (log,) = tmp_path.iterdir()  # written whole under a temporary name, then renamed
    assert line.endswith(str(log)) and log.name.startswith("asyncrl-error-")
    text = log.read_text()
    assert text.startswith(f"asyncrl config show {LOCAL}\nTraceback")
    assert "RuntimeError: kaboom" in text and "in command" in text


def test_an_internal_error_without_a_writable_log_prints_the_traceback(capsys, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", "/nonexistent/asyncrl-test")
    _raising(monkeypatch, RuntimeError("kaboom"))
    assert main(["config", "show", LOCAL]) == cli.INTERNAL_ERROR
    err = capsys.readouterr().err
    assert err.startswith("asyncrl: internal error: RuntimeError: kaboom (no log: ")
    assert "Traceback" in err


def test_an_interrupt_exits_130_with_one_line(capsys, monkeypatch):
    _raising(monkeypatch, KeyboardInterrupt())
    assert fails(capsys, ["config", "show", LOCAL], code=130) == "asyncrl: interrupted"


def test_a_broken_pipe_that_is_not_stdout_is_an_internal_error(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    _raising(monkeypatch, BrokenPipeError(32, "Broken pipe"))
    line = fails(capsys, ["config", "show", LOCAL], code=cli.INTERNAL_ERROR)
    assert "BrokenPipeError" in line


# -- out of process -----------------------------------------------------------------------------


def _asyncrl(*argv: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", *argv],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def test_a_closed_stdout_exits_quietly():
    proc = _asyncrl("config", "show", LOCAL)
    proc.stdout.close()  # the reader goes away before the command writes (like `| head -0`)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert err == b""


def test_a_bad_config_out_of_process_is_one_line_and_no_traceback(tmp_path):
    (tmp_path / "c.yaml").write_text("a: &a [1]\nb: *a\n")
    proc = _asyncrl("config", "show", str(tmp_path / "c.yaml"))
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and out == b""
    assert err.decode().splitlines() == [
        "asyncrl: config key 'a': YAML anchor/alias 'a' (line 1); anchors and aliases are not "
        "allowed"
    ]
