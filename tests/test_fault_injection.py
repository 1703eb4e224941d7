"""A 2-process pre-training run killed at random moments (SIGKILL, SIGTERM, SIGINT; during startup, steps and
checkpoint writes) or whose disk fills during a checkpoint write, restarted until it ends, has the uninterrupted
run's final checkpoint, bit for bit, in both model families (benchmarks/fault_injection.py, issue 32 item 8;
"Nothing lost, round three"). FAULT_INJECTION_SEED=<n> replays another schedule."""
import errno
import math
import os
import random
import subprocess
from dataclasses import astuple

import pytest
import torch

from benchmarks import fault_injection as fi
from bertrecipe.common.errors import InputError

SEED = int(os.environ.get("FAULT_INJECTION_SEED", "0"))


def test_checkpoint_comparison_sees_one_ulp_and_ignores_only_the_clock_and_the_paths():
    weights = torch.randn(4, 3)
    a = {"model": {"w": weights}, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}}, "train_seconds": 1.0,
         "args": {"output_dir": "reference", "json_summary": "reference/log.json", "seed": 42}, "phase_step": 4}
    b = {"model": {"w": weights.clone()}, "optimizer": {"state": {0: {"exp_avg": torch.zeros(3)}}},
         "train_seconds": 7.5, "args": {"output_dir": "faulted", "json_summary": "faulted/log.json", "seed": 42},
         "phase_step": 4}
    assert fi.differences(a, b) == []
    nudged = weights.clone()
    nudged[2, 1] = torch.nextafter(nudged[2, 1], torch.tensor(math.inf))  # one float32 ulp
    assert not torch.equal(nudged, weights)
    assert fi.differences(a, {**b, "model": {"w": nudged}}) == ["model.w"]
    assert fi.differences(a, {**b, "model": {"w": weights.double()}}) == ["model.w"]  # the dtype counts
    assert fi.differences(a, {**b, "args": {**b["args"], "seed": 43}}) == ["args.seed"]
    assert fi.differences(a, {**b, "phase_step": 5}) == ["phase_step"]
    assert fi.differences(a, {key: value for key, value in b.items() if key != "optimizer"}) == ["optimizer"]


def test_the_schedule_is_replayable_and_spreads_its_steps_over_the_run():
    settings = fi.Settings(max_steps=40)
    first = fi.plan(random.Random(5), 20, settings, startup_seconds=3.0, step_seconds=0.05)
    again = fi.plan(random.Random(5), 20, settings, startup_seconds=3.0, step_seconds=0.05)
    assert first == again and len(first) == 21
    steps = [fault.step for fault in first[:-1]]
    assert steps == sorted(steps) and 1 <= steps[0] <= 2 and 36 <= steps[-1] <= 38
    assert first[-1].final and first[-1].moment == "checkpoint" and first[-1].step == 40
    assert all(fault.target == "job" for fault in first if fault.signal == "SIGKILL")


@pytest.mark.slow
def test_twenty_faults_and_restarts_end_bit_for_bit_like_the_uninterrupted_run(tmp_path):
    campaign = fi.run_campaign(tmp_path, faults=20, seed=SEED)
    report = fi.table(campaign)
    print(report)
    summary = fi.summary(campaign)
    assert summary["faults"] >= 20, report
    if SEED == 0:  # what the pinned schedule covers (another seed's may miss a case, by chance)
        assert set(summary["by_signal"]) == {"SIGKILL", "SIGTERM", "SIGINT"}, report
        assert set(summary["by_target"]) == {"job", "launcher"}, report
        assert summary["in_checkpoint_write"] >= 5 and summary["half_written_left_by_sigkill"] >= 1, report
        assert summary["landed"].get("before the first step", 0) >= 1, report
    assert summary["problems"] == [], report
    assert "ckpt_40.pt" in campaign.compared and campaign.differences == [], report
    assert campaign.record_mismatches == [] and campaign.bit_exact, report


@pytest.mark.slow
def test_a_sharded_run_survives_twenty_faults_bit_for_bit(tmp_path):
    """The same campaign on 2 processes under --sharding fsdp: every checkpoint is a folder that both processes
    write their shards into (killed inside that write too), each resume reads its slices back, and the run still
    ends to the last bit as the uninterrupted one."""
    campaign = fi.run_campaign(tmp_path, faults=20, seed=SEED, settings=fi.Settings(sharding="fsdp"))
    report = fi.table(campaign)
    print(report)
    summary = fi.summary(campaign)
    assert summary["faults"] >= 20 and summary["problems"] == [], report
    assert "ckpt_40.dcp" in campaign.compared and campaign.differences == [], report
    assert campaign.record_mismatches == [] and campaign.bit_exact, report
    assert "--sharding fsdp" in report, report
    assert any(launch.landed == "in a checkpoint write" for launch in campaign.launches), report


def test_disk_faults_take_places_among_the_signals_at_checkpoint_writes_and_never_the_final_one():
    """... and without them the draws are those of the version before disk faults (recorded from it), so that
    `--faults 25 --seed 0` replays the campaign the docs report."""
    drawn = [astuple(fault)[:4] for fault in fi.plan(random.Random(0), 6, fi.Settings(max_steps=12), 3.0, 0.05)]
    assert drawn == [("SIGKILL", "job", "checkpoint", 1), ("SIGTERM", "launcher", "step", 3),
                     ("SIGKILL", "job", "step", 4), ("SIGKILL", "job", "startup", 6),
                     ("SIGKILL", "job", "checkpoint", 7), ("SIGTERM", "job", "checkpoint", 10),
                     ("SIGINT", "launcher", "checkpoint", 12)]
    settings = fi.Settings(max_steps=40)
    first = fi.plan(random.Random(3), 10, settings, 3.0, 0.05, disk_faults=5)
    assert first == fi.plan(random.Random(3), 10, settings, 3.0, 0.05, disk_faults=5) and len(first) == 16
    disk = [fault for fault in first if fault.signal == fi.DISK_FULL]
    assert len(disk) == 5 and all(f.moment == "checkpoint" and f.target == "disk" and not f.final for f in disk)
    assert first[-1].final and first[-1].signal in fi.SIGNALS and first[-1].step == 40
    steps = [fault.step for fault in first[:-1]]
    assert steps == sorted(steps) and steps[0] >= 1 and steps[-1] <= 38
    only_disks = fi.plan(random.Random(3), 0, settings, 3.0, 0.05, disk_faults=2)
    assert [fault.signal for fault in only_disks[:2]] == [fi.DISK_FULL] * 2 and only_disks[2].final


def worker_traceback_text(last_line: str) -> str:
    """A worker's traceback as Python prints it: frames of the recipe's code, then the exception."""
    return (f"Traceback (most recent call last):\n  File \"{fi.REPO}/run_pretraining.py\", line 9, in <module>\n"
            f"    main()\n  File \"{fi.REPO}/bertrecipe/pretraining/loop.py\", line 346, in save\n"
            f"    if any_process(failure is not None, ctx):\n{last_line}\n")


TORCHRUN_TRACEBACK = (  # torchrun's own, after a worker's exit status 2: frames of torch alone
    "Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n"
    f"  File \"{fi.REPO}/.venv/lib/python3.11/site-packages/torch/distributed/run.py\", line 1028, in main\n"
    "    run(args)\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError: \n"
    "/work/main/run_pretraining.py FAILED\n")


def test_a_worker_traceback_is_told_from_torchruns_own():
    assert fi.worker_traceback("DLL step 3\n" + TORCHRUN_TRACEBACK) is None
    lost = "torch.distributed.DistBackendError: [../gloo/transport/tcp/pair.cc:534] Connection closed by peer"
    assert fi.worker_traceback(TORCHRUN_TRACEBACK + worker_traceback_text(lost) + "DLL step 4\n") == lost


def test_a_full_disk_must_end_the_run_in_one_line_per_process_saying_where_to_resume():
    out = "/campaign/faulted"
    rank0 = (f"{out}/ckpt_4.pt: cannot write the checkpoint (No space left on device); nothing of it is left; "
             f"the newest good checkpoint is {out}/ckpt_2.pt: resume from it "
             "with --resume_from_checkpoint")
    rank1 = (f"{out}: the first process could not write the checkpoint; no checkpoint in {out} yet")
    assert fi.full_disk_problems(1, [rank0, rank1], 2, finished=False, traceback=None) == []
    assert fi.full_disk_problems(2, [rank0], 1, finished=False, traceback=None) == []
    assert fi.full_disk_problems(0, [], 2, finished=True, traceback=None) == []  # written before the disk filled
    lost = "torch.distributed.DistBackendError: Connection closed by peer"
    assert fi.full_disk_problems(1, [rank0], 2, finished=False, traceback=lost) == [
        "full disk: 1 'error:' lines, expected one per process (2)", f"full disk: a traceback from a worker: {lost}"]
    assert fi.full_disk_problems(0, [], 2, finished=False, traceback=None) == [
        "full disk: exit status 0, expected 1", "full disk: 0 'error:' lines, expected one per process (2)",
        "full disk: no 'error:' line names a file with 'No space left on device'"]
    cut = f"{out}/log.json: No space left on device"
    assert fi.full_disk_problems(1, [cut, rank1], 2, finished=False, traceback=None) == [
        f"full disk: a line without the checkpoint to resume from: {cut}"]


def test_the_write_a_full_disk_failed_is_read_from_the_file_named():
    def failed_at(name, writing):
        launch = fi.Launch(1, 2, fi.Fault(fi.DISK_FULL, "disk", "checkpoint", 4, 0.0), write_at_fill=writing,
                           full_disk_file=name)
        return launch.full_disk_failed_at
    assert failed_at("ckpt_4.pt", 4) == "the write it filled"
    assert failed_at("ckpt_6.pt", 4) == "the next checkpoint" and failed_at("ckpt_4.pt", None) == "the next checkpoint"
    assert failed_at("log.json", 4) == "log.json" and failed_at("", None) == "none"
    assert failed_at("events.out.tfevents.1764314537.localhost.14114.0", 4) == "the TensorBoard events"


def test_a_tmpfs_that_cannot_be_mounted_is_one_line_and_leaves_no_folder(tmp_path):
    folder = tmp_path / "work" / "faulted"
    with pytest.raises(fi.NoTmpfs, match=rf"^--disk_faults: cannot mount a tmpfs at {folder} \(.+\); run as root"):
        fi.mount_tmpfs(folder, -1)  # a size mount refuses, root or not
    assert list(tmp_path.iterdir()) == []


def test_campaign_flags_that_ask_for_no_fault_are_one_line():
    with pytest.raises(InputError, match="^--faults 0 --disk_faults 0: each must be >= 0 and together >= 1"):
        fi.arguments(["--faults", "0"])
    with pytest.raises(InputError, match="^--faults 3 --disk_faults -1"):
        fi.arguments(["--faults", "3", "--disk_faults", "-1"])
    assert fi.arguments(["--faults", "0", "--disk_faults", "2", "--family", "modern"]).family == "modern"


@pytest.fixture
def tmpfs(tmp_path):
    folder = tmp_path / "disk"
    try:
        fi.mount_tmpfs(folder, 1)
    except fi.NoTmpfs as refusal:
        pytest.skip(str(refusal))
    yield folder
    if os.path.ismount(folder):
        subprocess.run(["umount", "-l", str(folder)], check=True)


def test_the_filler_takes_all_the_free_space_and_gives_it_back(tmpfs):
    (tmpfs / "ckpt_2.pt").write_bytes(b"w" * 100_000)
    filler = fi.fill_disk(tmpfs)
    assert os.statvfs(tmpfs).f_bavail == 0
    with pytest.raises(OSError) as full, open(tmpfs / ".ckpt_4.pt.1.x.tmp", "wb") as write:
        write.write(b"w" * 65536)
        write.flush()
    assert full.value.errno == errno.ENOSPC
    filler.unlink()
    assert os.statvfs(tmpfs).f_bavail * os.statvfs(tmpfs).f_frsize > 900_000


def test_the_files_of_the_tmpfs_stay_in_the_folder_after_the_campaign(tmpfs):
    (tmpfs / "tensorboard").mkdir()
    (tmpfs / "tensorboard" / "events").write_text("e")
    (tmpfs / "ckpt_2.pt").write_bytes(b"w" * 1000)
    fi.unmount_keeping_files(tmpfs)
    assert not os.path.ismount(tmpfs)
    assert (tmpfs / "ckpt_2.pt").read_bytes() == b"w" * 1000 and (tmpfs / "tensorboard" / "events").read_text() == "e"
    assert sorted(p.name for p in tmpfs.parent.iterdir()) == ["disk"]  # no scratch copy left


@pytest.mark.slow
def test_the_modern_family_survives_full_disks_and_a_kill_bit_for_bit(tmp_path):
    """Two full disks during checkpoint writes (seed 4: the first at the first checkpoint, before any is
    written) and a SIGKILL in the final checkpoint's write, on a tiny ModernBERT trained with AdamW."""
    settings = fi.Settings(family="modern", max_steps=6)
    try:
        campaign = fi.run_campaign(tmp_path, faults=0, seed=4, settings=settings, disk_faults=2)
    except fi.NoTmpfs as refusal:
        pytest.skip(str(refusal))
    report = fi.table(campaign)
    print(report)
    summary = fi.summary(campaign)
    assert summary["problems"] == [], report
    assert summary["by_signal"] == {"DISKFULL": 2, "SIGKILL": 1}, report
    assert summary["survived"] == {"DISKFULL": 2, "SIGKILL": 1}, report
    assert summary["disk_full_error_lines"] == 4 and summary["launcher_exit_codes"]["DISKFULL"] == {"1": 2}, report
    assert "ckpt_6.pt" in campaign.compared and campaign.differences == [], report
    assert campaign.record_mismatches == [] and campaign.bit_exact, report
    assert "modern (ModernBERT config, masked LM alone, --optimizer adamw)" in report, report
    assert "--family modern --disk_faults 2" in report, report
    assert not os.path.ismount(tmp_path / "faulted") and (tmp_path / "faulted" / "ckpt_6.pt").is_file()
