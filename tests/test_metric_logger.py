"""metric_logger.py: NVIDIA dllogger's JSON-lines layout, the readable copy, TensorBoard scalars."""
import json

import pytest

from bertrecipe.errors import InputError
from bertrecipe.metric_logger import MetricLogger, check_log_paths, read_log


def test_records_follow_the_dllogger_layout(tmp_path):
    printed = []
    log = MetricLogger(tmp_path / "log.json", printer=printed.append)
    log.log("PARAMETER", {"lr": 0.1})
    log.metadata("training_sequences_per_second", {"unit": "sequences/s"})
    log.log([0, 5], {"average_loss": 1.5, "skipped_steps": 0, "nan": float("nan")})
    log.log([], {"final_loss": 1.25})
    log.close()
    lines = (tmp_path / "log.json").read_text().splitlines()
    assert all(line.startswith("DLLL {") for line in lines)
    records = [json.loads(line[5:]) for line in lines]
    assert list(records[0]) == ["timestamp", "datetime", "elapsedtime", "type", "step", "data"]
    assert records[1] == {**records[1], "type": "METADATA", "metric": "training_sequences_per_second",
                          "metadata": {"unit": "sequences/s"}}
    assert list(records[1]) == ["timestamp", "elapsedtime", "datetime", "type", "metric", "metadata"]
    assert all(isinstance(r["timestamp"], str) and isinstance(r["elapsedtime"], str) for r in records)
    assert records[2]["step"] == [0, 5] and records[2]["data"]["nan"] == "nan"
    assert records[3]["step"] == [] and read_log(tmp_path / "log.json") == records
    assert "+" in records[0]["datetime"] or "-" in records[0]["datetime"][19:]  # local time with its offset
    assert any("average_loss: 1.5" in line for line in printed)


def test_disabled_logger_writes_nothing(tmp_path):
    log = MetricLogger(tmp_path / "log.json", enabled=False)
    log.log([0, 1], {"loss": 1.0})
    log.close()
    assert not (tmp_path / "log.json").exists()


def test_tensorboard_scalars_are_written(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricLogger(None, printer=lambda _: None, tensorboard_dir=tmp_path / "tb")
    for step in (1, 2, 3):
        log.log([0, step], {"average_loss": 4.0 - step})
    log.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("average_loss")] == [(1, 3.0), (2, 2.0), (3, 1.0)]


def test_nothing_is_created_before_the_first_record(tmp_path):
    """An entry point may build its logger before its inputs are checked: a refused run leaves no log file and
    no TensorBoard event file behind."""
    log = MetricLogger(tmp_path / "logs" / "log.json", printer=lambda _: None, tensorboard_dir=tmp_path / "tb")
    log.close()
    assert list(tmp_path.iterdir()) == []
    log = MetricLogger(tmp_path / "logs" / "log.json", printer=lambda _: None, tensorboard_dir=tmp_path / "tb")
    log.log("PARAMETER", {"lr": 0.1})  # the JSON file opens with its first record; TensorBoard with its first scalar
    assert (tmp_path / "logs" / "log.json").is_file() and not (tmp_path / "tb").exists()
    log.log([0, 1], {"loss": 1.0})
    log.close()
    assert list((tmp_path / "tb").iterdir())


@pytest.mark.parametrize("case", ["json is a folder", "json folder is a file", "tensorboard dir is a file"])
def test_unusable_log_paths_are_one_line_input_errors_that_create_nothing(tmp_path, case):
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("mine\n")
    json_path, tensorboard_dir, named = {
        "json is a folder": (tmp_path / "folder", None, "--json-summary"),
        "json folder is a file": (tmp_path / "file" / "log.json", None, "--json-summary"),
        "tensorboard dir is a file": (tmp_path / "log.json", tmp_path / "file", "TensorBoard"),
    }[case]
    with pytest.raises(InputError, match=named) as error:
        check_log_paths(json_path, tensorboard_dir)
    assert "\n" not in str(error.value)
    with pytest.raises(InputError, match=named):
        MetricLogger(json_path, tensorboard_dir=tensorboard_dir)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "folder"]
    assert (tmp_path / "file").read_text() == "mine\n" and not list((tmp_path / "folder").iterdir())


def test_usable_log_paths_pass_the_check(tmp_path):
    check_log_paths(tmp_path / "new" / "deeper" / "log.json", tmp_path / "tb")
    check_log_paths(None, None)
    assert list(tmp_path.iterdir()) == []
