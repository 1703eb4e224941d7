"""metric_logger.py: NVIDIA dllogger's JSON-lines layout, the readable copy, TensorBoard scalars."""
import json

from metric_logger import MetricLogger, read_log


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
