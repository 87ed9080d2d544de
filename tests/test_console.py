"""What `asyncrl run` prints, fed kfp.local's task lines and the train stage's metrics directly."""

import io

from asyncrl.pipeline.console import Console, split_log
from asyncrl.run_layout import RunLayout


def _console(tmp_path, tty=False):
    (tmp_path / "train").mkdir(exist_ok=True)
    return Console(RunLayout.of(tmp_path), io.StringIO(), steps=5, tty=tty)


def test_each_task_gets_one_start_and_one_end_line(tmp_path):
    c = _console(tmp_path)
    log = (
        "INFO - Executing task \x1b[96m'warm-start'\x1b[0m\n{executor json}\n"
        "INFO - Task \x1b[96m'warm-start'\x1b[0m finished with status \x1b[91mFAILURE\x1b[0m\n"
    )
    c.update(log, 0.0)
    c.update(log, 9.0)  # the same lines again (a re-read): nothing more
    assert c.out.getvalue().splitlines() == ["▶ warm-start", "✗ warm-start failure in 0 s"]
    (tmp_path / "logs").mkdir()
    (tmp_path / "kfp.log").write_text(log)
    paths = split_log(tmp_path / "kfp.log", tmp_path / "logs")
    assert "{executor json}" in paths["warm-start"].read_text()


def test_progress_skips_rows_that_are_not_numbers_and_shows_the_next_good_one(tmp_path):
    c = _console(tmp_path, tty=True)
    metrics = tmp_path / "train" / "metrics.jsonl"
    metrics.write_text('{"kind": "train", "step": "x", "reward": null}\n')
    c.update("Executing task 'train'\n", 0.0)
    c.progress(10.0)
    assert c.out.getvalue() == "▶ train\n"
    metrics.write_text('{"kind": "train", "step": 2, "reward": 0.5}\n')
    c.progress(20.0)
    assert c.out.getvalue().endswith("train: step 2/5, 6.0 steps/min, ETA 0.5 min, reward 0.500")
