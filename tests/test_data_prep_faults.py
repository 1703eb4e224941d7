"""Data preparation's own fault campaign (benchmarks/data_prep_faults.py; issue 48, "Nothing lost, round four"):
bertPrep's text formatting and HDF5 creation on 2 processes, interrupted by SIGINT and SIGTERM at random moments,
to the process group and to bertPrep alone, end within 5 s in the one stop line with no process and no temporary
left, and the rerun's outputs are the uninterrupted run's, byte for byte. DATA_PREP_FAULTS_SEED=<n> replays
another schedule."""
import os
import random
import subprocess
import sys
import time

import pytest

from benchmarks import data_prep_faults as dpf
from helpers import ENV

SEED = int(os.environ.get("DATA_PREP_FAULTS_SEED", "0"))


def test_the_schedule_gives_each_stage_both_signals_to_both_targets_and_replays():
    durations = {"text_formatting": 3.0, "create_hdf5_files": 4.0}
    first = dpf.plan(random.Random(5), 4, durations)
    assert first == dpf.plan(random.Random(5), 4, durations) and len(first) == 16
    for stage in dpf.STAGES:
        faults = [fault for fault in first if fault.stage == stage]
        assert sorted((f.signal, f.target) for f in faults) == sorted(
            [(name, target) for name in dpf.SIGNALS for target in dpf.TARGETS] * 2)
        assert all(0 <= f.delay <= durations[stage] for f in faults)
    assert [f.stage for f in first] == sorted((f.stage for f in first), key=dpf.STAGES.index)
    one = dpf.plan(random.Random(0), 1, durations)  # one fault a signal: SIGINT to the group, SIGTERM to bertPrep
    assert {(f.signal, f.target) for f in one} == {("SIGINT", "group"), ("SIGTERM", "parent")}


def test_a_moment_counts_as_python_s_start_up_until_the_entry_point_catches_sigterm():
    """The campaign redraws a moment before the command's first line (a bare interpreter catches no SIGTERM) and
    signals any later one (the entry point's first line catches it)."""
    bare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], env=ENV)
    command = subprocess.Popen([sys.executable, "-c", "import bertrecipe.cli.entry, time; time.sleep(30)"], env=ENV)
    try:
        deadline = time.monotonic() + 30
        while not dpf.catches_sigterm(command.pid):
            assert command.poll() is None and time.monotonic() < deadline
            time.sleep(0.01)
        assert not dpf.catches_sigterm(bare.pid) and bare.poll() is None
    finally:
        bare.kill()
        command.kill()
        bare.wait()
        command.wait()


@pytest.mark.slow
def test_interrupted_data_prep_ends_in_one_line_leaves_nothing_and_reruns_to_the_reference_bytes(tmp_path):
    campaign = dpf.run_campaign(tmp_path, faults=1, seed=SEED, settings=dpf.Settings(copies=60))
    report = dpf.table(campaign)
    print(report)
    stages = dpf.summary(campaign)["stages"]
    assert [stages[stage]["faults"] for stage in dpf.STAGES] == [2, 2], report
    assert campaign.ok, report
