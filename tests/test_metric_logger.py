"""metric_logger.py: NVIDIA dllogger's JSON-lines layout, the readable copy, TensorBoard scalars."""
import errno
import json
import os
from types import SimpleNamespace

import pytest

from bertrecipe.common.errors import InputError
from bertrecipe.common.output_paths import check_writable_file
from bertrecipe.training.metric_logger import MetricLogger, check_log_paths, read_log
from helpers import permissions_are_ignored


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


# Issue 32: every log-writing failure is one InputError line naming the file and errno's text, refused before
# any work where it can be, and what was written before stays whole.

def failing_writes(monkeypatch, path_of_fd, error=errno.ENOSPC, after=10):
    """os.write fails with `error` for the file whose path `path_of_fd` matches, after writing `after` bytes of
    the data (as a disk filling up mid-record does); other writes go through."""
    real_write = os.write

    def write(fd, data):
        if path_of_fd(os.readlink(f"/proc/self/fd/{fd}")):
            real_write(fd, bytes(data[:after]))
            raise OSError(error, os.strerror(error))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", write)


def test_a_full_disk_is_one_line_naming_the_json_file_and_the_records_before_stay_whole(tmp_path, monkeypatch):
    path = tmp_path / "log.json"
    log = MetricLogger(path, printer=lambda _: None)
    log.log("PARAMETER", {"lr": 0.1})
    log.log([0, 1], {"loss": 2.0})
    failing_writes(monkeypatch, lambda name: name == str(path))
    with pytest.raises(InputError) as error:
        log.log([0, 2], {"loss": 1.0})
    monkeypatch.undo()
    assert str(error.value) == f"{path}: cannot write the JSON log (No space left on device)"
    assert [r["data"] for r in read_log(path)] == [{"lr": 0.1}, {"loss": 2.0}]  # no half record at the end
    assert path.read_text().endswith("}\n")
    log.log([0, 3], {"loss": 0.5})  # space again: the file goes on
    log.close()
    assert [r["data"] for r in read_log(path)][-1] == {"loss": 0.5}


def test_a_full_disk_is_one_line_naming_the_event_file_and_the_scalars_before_stay(tmp_path, monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    log = MetricLogger(None, printer=lambda _: None, tensorboard_dir=tmp_path / "tb")
    log.log([0, 1], {"average_loss": 3.0, "learning_rate": 0.1})
    failing_writes(monkeypatch, lambda name: "tfevents" in name)
    with pytest.raises(InputError) as error:
        log.log([0, 2], {"average_loss": 2.0})
    monkeypatch.undo()
    (event_file,) = (tmp_path / "tb").iterdir()
    assert str(error.value) == f"{event_file}: cannot write the TensorBoard events (No space left on device)"
    log.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("average_loss")] == [(1, 3.0)]
    assert [e.value for e in events.Scalars("learning_rate")] == [pytest.approx(0.1)]


def test_a_folder_made_where_the_json_file_goes_after_the_check_is_one_line(tmp_path):
    log = MetricLogger(tmp_path / "log.json", printer=lambda _: None)
    (tmp_path / "log.json").mkdir()  # after the check, before the first record
    with pytest.raises(InputError, match=r"log.json: cannot write the JSON log \(Is a directory\)$"):
        log.log("PARAMETER", {"lr": 0.1})


def test_a_file_made_where_the_tensorboard_folder_goes_after_the_check_is_one_line(tmp_path):
    log = MetricLogger(None, printer=lambda _: None, tensorboard_dir=tmp_path / "tb")
    (tmp_path / "tb").write_text("mine\n")
    with pytest.raises(InputError, match=r"tb: cannot write the TensorBoard folder \(File exists\)$"):
        log.log([0, 1], {"loss": 1.0})
    assert (tmp_path / "tb").read_text() == "mine\n"


def test_the_json_file_on_a_full_device_is_one_line(tmp_path):
    log = MetricLogger("/dev/full", printer=lambda _: None)  # passes the checks: it exists and is writable
    with pytest.raises(InputError, match=r"^/dev/full: cannot write the JSON log \(No space left on device\)$"):
        log.log("PARAMETER", {"lr": 0.1})


needs_permissions = pytest.mark.skipif(permissions_are_ignored(), reason="root writes where permissions forbid it")


@needs_permissions
@pytest.mark.parametrize("case", ["json in a read-only folder", "read-only json file", "json under a read-only "
                                  "folder", "read-only tensorboard folder", "tensorboard in a read-only folder"])
def test_unwritable_log_paths_are_refused_before_any_work(tmp_path, case):
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "old.json").write_text("DLLL {}\n")
    (locked / "tb").mkdir()
    json_path, tensorboard_dir, named = {
        "json in a read-only folder": (locked / "log.json", None, "--json-summary cannot be created"),
        "read-only json file": (locked / "old.json", None, "--json-summary cannot be written"),
        "json under a read-only folder": (locked / "new" / "log.json", None, f"{locked} is not writable"),
        "read-only tensorboard folder": (None, locked / "tb", "TensorBoard folder cannot be written to"),
        "tensorboard in a read-only folder": (None, locked / "new_tb", "TensorBoard folder cannot be created"),
    }[case]
    (locked / "old.json").chmod(0o444)
    (locked / "tb").chmod(0o555)
    locked.chmod(0o555)
    try:
        with pytest.raises(InputError) as error:
            MetricLogger(json_path, tensorboard_dir=tensorboard_dir)
        created = sorted(p.name for p in locked.iterdir())
    finally:
        locked.chmod(0o755)
        (locked / "tb").chmod(0o755)
    assert named in str(error.value) and str(error.value).endswith("(Permission denied)")
    assert "\n" not in str(error.value)
    assert created == ["old.json", "tb"] and (locked / "old.json").read_text() == "DLLL {}\n"


def test_a_read_only_file_system_is_named_as_such(tmp_path, monkeypatch):
    # Root-proof: os.access as on a read-only mount, where even root cannot write.
    monkeypatch.setattr(os, "access", lambda path, mode: False)
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(f_flag=os.ST_RDONLY))
    with pytest.raises(InputError, match=r"log.json: --json-summary cannot be created: .* is not writable "
                                         r"\(Read-only file system\)$"):
        check_log_paths(tmp_path / "log.json")
    with pytest.raises(InputError, match=r"tb: the TensorBoard folder cannot be created: .*\(Read-only file system\)$"):
        check_log_paths(None, tmp_path / "tb")


def test_a_log_file_that_is_not_a_folder_nor_writable_file_is_refused_and_dev_null_is_fine(tmp_path):
    check_writable_file("/dev/null", "--json-summary")  # a way to keep no log
    with pytest.raises(InputError, match=r"is a folder; give a file name such as .*logfile.txt"):
        check_writable_file(tmp_path, "--log_file", example="logfile.txt")


def test_a_record_still_being_appended_is_not_read(tmp_path):
    """A reader of a live run's log (a test, plot_logs) met a half-appended last line: JSONDecodeError."""
    from bertrecipe.training.metric_logger import read_log

    log = tmp_path / "dllogger.json"
    log.write_text('DLLL {"step": [0, 1], "data": {"loss": 1.0}}\nDLLL {"step": [0, 2], "da', encoding="utf-8")
    assert read_log(log) == [{"step": [0, 1], "data": {"loss": 1.0}}]
    log.write_text(log.read_text() + 'ta": {"loss": 0.5}}\n', encoding="utf-8")
    assert [r["data"]["loss"] for r in read_log(log)] == [1.0, 0.5]
