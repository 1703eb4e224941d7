"""benchmarks/gpu_report.sh --tiny: the GPU report's logic on this CPU (a tiny BERT, 1-2 steps a measurement).
Its JSON holds every section with numbers or an error line in their place, and its Markdown names the device,
torch and the precision; the batch-size search, pytest's counts and the error lines are checked alone, in this
process (benchmarks.gpu_report's functions). The shell helpers refuse an unknown flag before doing anything."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_report, model_throughput
from helpers import ENV, REPO_ROOT

BENCHMARKS = REPO_ROOT / "benchmarks"
# The numbers each section's rows must carry (or, for each "<part>_", an error line under "<part>_error").
NUMBERS = {
    "cuda_tests": ["passed", "failed", "skipped", "errors"],
    "gemm_peak": ["gflops"],
    "model_step": ["ours_seq_per_s", "peer_seq_per_s"],
    "max_micro_batch": ["ours_largest_micro_batch", "peer_largest_micro_batch"],
    "loop": ["loop_seq_per_s", "model_step_seq_per_s"],
    "finetune": ["ours_seq_per_s", "peer_seq_per_s"],
    "sharding": ["state_bytes_per_process_max", "step_seconds_max"],
    "profile": ["total_ms_per_step"],
    "compiled_step": ["ours_seq_per_s", "peer_seq_per_s"],
    "data_prep": ["mb_per_s_per_process"],
}


@pytest.fixture(scope="module")
def tiny_report(tmp_path_factory) -> tuple[dict, str]:
    out = tmp_path_factory.mktemp("gpu_report")
    env = {**ENV, "PYTHON": sys.executable}
    done = subprocess.run(["bash", str(BENCHMARKS / "gpu_report.sh"), "--tiny", "--output_dir", str(out),
                           "--profile", "--data_prep"], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["gpu_report.json", "gpu_report.md"]  # no temporaries left
    return json.loads((out / "gpu_report.json").read_text()), (out / "gpu_report.md").read_text()


def carries(row: dict, key: str) -> bool:
    """The number under `key`, or the error line that stands in its place."""
    part = key.split("_")[0]
    number = row.get(key)
    return (isinstance(number, (int, float)) and number >= 0) or bool(row.get(f"{part}_error") or row.get("error"))


@pytest.mark.slow
def test_the_tiny_report_has_every_section_with_numbers_or_an_error_line(tiny_report) -> None:
    data, _ = tiny_report
    assert list(data["sections"]) == list(gpu_report.SECTIONS)
    for name, section in data["sections"].items():
        assert "skipped" not in section and "error" not in section, (name, section)
        assert section["rows"], name
        for row in section["rows"]:
            for key in NUMBERS[name]:
                assert carries(row, key), (name, key, row)
    model = data["sections"]["model_step"]["rows"]
    assert {(r["seq"], r["precision"]) for r in model} == {(32, "bf16"), (32, "fp16"), (64, "bf16"), (64, "fp16")}
    assert all("ours_of_peak" in r and "speedup" in r for r in model)  # measured against the GEMM peak and the peer
    assert {r["precision"] for r in data["sections"]["gemm_peak"]["rows"]} == {"bf16", "fp16", "tf32"}
    ddp, fsdp = data["sections"]["sharding"]["rows"]  # side by side on 2 CPU processes: FSDP holds half the state
    assert (ddp["layout"], fsdp["layout"]) == ("ddp:2", "fsdp:2")
    assert fsdp["state_bytes_per_process_max"] == pytest.approx(ddp["state_bytes_per_process_max"] / 2, rel=0.01)
    assert data["sections"]["cuda_tests"]["rows"][0]["command"].startswith("-m pytest -m cuda tests")
    assert data["sections"]["cuda_tests"]["rows"][0]["returncode"] is not None  # not cut off


@pytest.mark.slow
def test_the_tiny_report_names_device_torch_and_precision(tiny_report) -> None:
    data, markdown = tiny_report
    header = data["header"]
    assert header["torch"] == torch.__version__ and header["driver"] == "n/a (CPU)" and header["tiny"]
    assert header["device"] in markdown.splitlines()[0]
    assert f"torch {torch.__version__}" in markdown
    assert "precision: model steps bf16 and fp16 autocast, GEMM peak bf16, fp16, tf32" in markdown
    table = [line for line in markdown.splitlines() if line.startswith("| model step |")]
    assert table and all(" bf16 |" in line or " fp16 |" in line for line in table)
    assert "### Where the time goes: seq 32" in markdown  # --profile's tables


def test_the_batch_search_doubles_then_bisects() -> None:
    tried = []

    def fits(size: int) -> bool:
        tried.append(size)
        return size <= 100

    assert gpu_report.largest_fitting(fits, 8, 1024) == (100, "101 does not fit")
    assert tried == [8, 16, 32, 64, 128, 96, 112, 104, 100, 102, 101]
    assert gpu_report.largest_fitting(lambda n: n <= 5, 8, 1024) == (5, "6 does not fit")
    assert gpu_report.largest_fitting(lambda n: False, 1, 8) == (0, "1 does not fit")
    assert gpu_report.largest_fitting(lambda n: True, 1, 8) == (8, "reached the cap of 8")


def test_pytest_counts_come_from_the_closing_line() -> None:
    output = "x\nFAILED tests/a.py::t - boom\n1 failed, 3 passed, 2 skipped, 1268 deselected, 2 errors in 7.14s\n"
    cut_off = "tests/test_cuda.py::test_a PASSED  [ 4%]\ntests/test_cuda.py::test_b[x] FAILED  [ 8%]\ntests/test_cu"
    counts = [gpu_report.pytest_counts(text)
              for text in (output, "1269 deselected, 1 error in 5.00s", "no tests ran in 0.01s", cut_off)]
    assert counts[0] == {"passed": 3, "failed": 1, "skipped": 2, "errors": 2, "deselected": 1268}
    assert counts[1]["errors"] == 1 and counts[2]["passed"] == 0
    assert counts[3] == {"passed": 1, "failed": 1, "skipped": 0, "errors": 0, "deselected": 0}


def test_an_error_line_names_what_failed() -> None:
    failed = subprocess.CalledProcessError(1, [sys.executable, "run_pretraining.py"],
                                           stderr=b"Traceback\n  ...\ntorch.OutOfMemoryError: CUDA out of memory\n\n")
    assert (gpu_report.error_line(failed)
            == "run_pretraining.py exited with 1: torch.OutOfMemoryError: CUDA out of memory")
    assert (gpu_report.error_line(ModuleNotFoundError("No module named 'blingfire'\nmore"))
            == "ModuleNotFoundError: No module named 'blingfire'")
    assert "time budget" in gpu_report.Deadline(0.0).lacks(10) and gpu_report.Deadline(None).lacks(10**6) is None


# A GPU report's header as gpu_report.header() writes it, for the rows checked alone below.
HEADER = {"device": "NVIDIA H100 80GB HBM3", "tiny": False, "date": "today", "driver": "570.1", "cuda": "13.0",
          "torch": "2.11.0+cu130", "transformers": "5.17.0", "python": "3.12", "cpus": 16, "model": "BERT-large",
          "precisions": {"model_step": ["bf16"], "gemm_peak": ["bf16"], "others": "bf16"}, "command": "x",
          "lamb": "multi-tensor (foreach) update"}


def test_a_failed_measurement_keeps_its_row(tmp_path) -> None:
    """measured() turns a failure into the row's error line; the Markdown shows it where the number would be."""

    def out_of_memory() -> dict:
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    row = {"seq": 512, "batch": 32, "precision": "bf16", "compiled": False, "peer_seq_per_s": 200.0}
    row.update({f"ours_{k}": v for k, v in gpu_report.measured("cpu", out_of_memory).items()})
    report = gpu_report.Report(tmp_path, HEADER)
    report.open("model_step")
    report.add("model_step", row)
    assert row["ours_error"].startswith("OutOfMemoryError: CUDA out of memory")
    markdown = (tmp_path / "gpu_report.md").read_text()
    line = next(line for line in markdown.splitlines() if line.startswith("| model step |"))
    assert "ours: OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB" in line and "200 seq/s" in line
    assert json.loads((tmp_path / "gpu_report.json").read_text())["sections"]["model_step"]["rows"] == [row]


def test_a_goal_is_met_missed_or_not_measured_never_missed_for_a_peer_not_installed(tmp_path) -> None:
    """Measured goals are met or NOT met; one whose measurement did not run (transformers not installed, the GEMM
    peak or the model step missing, the time budget spent) is "not measured (why)" and no missed goal."""
    header = {**HEADER, "transformers": "not installed",
              "precisions": {"model_step": ["fp16", "bf16"], "gemm_peak": ["bf16"], "others": "fp16"}}
    run = gpu_report.Run(None, gpu_report.Report(tmp_path, header), gpu_report.Deadline(0.0), tmp_path)

    def peer_without_transformers(*args, **kwargs) -> dict:  # what the peer meets on a machine without transformers
        raise ModuleNotFoundError("No module named 'transformers'")

    met = {"seq": 128, "batch": 8, "precision": "fp16", "ours_seq_per_s": 1500.0, "peer_seq_per_s": 500.0,
           "speedup": 3.0}
    missed = {"seq": 512, "batch": 8, "precision": "fp16", "ours_seq_per_s": 120.0, "peer_seq_per_s": 100.0,
              "speedup": 1.2}
    no_peer = {"seq": 128, "batch": 8, "precision": "bf16", "ours_seq_per_s": 1500.0}
    no_peer.update({f"peer_{k}": v for k, v in gpu_report.measured("cpu", peer_without_transformers,
                                                                       model_throughput.LARGE).items()})
    run.report.open("model_step")
    for row in (met, missed, no_peer):
        run.add("model_step", {**row, "goals": gpu_report.model_goals(row, run)})
    run.add("model_step", gpu_report.skipped_model_row(run, 512, "fp16", run.deadline.lacks(100)))
    run.report.open("loop")
    loop = {"seq": 128, "batch": 8, "loop_seq_per_s": 90.0, "model_step_error": "OutOfMemoryError: CUDA out of memory"}
    run.add("loop", {**loop, "goals": gpu_report.loop_goals(loop)})
    sections = json.loads((tmp_path / "gpu_report.json").read_text())["sections"]  # as the report wrote them
    no_peer_goals = sections["model_step"]["rows"][2]["goals"]
    halted = "peer: ModuleNotFoundError: No module named 'transformers'"
    assert no_peer_goals == [
        {"goal": "ours >= 1.5x transformers", "met": None, "not_measured": halted},
        {"goal": ">= 1,400 seq/s at seq 128 on one H100", "met": True},
        {"goal": ">= 45 % of the bf16 GEMM peak", "met": None, "not_measured": "no bf16 GEMM peak was measured"}]
    markdown = (tmp_path / "gpu_report.md").read_text()
    met, missed, no_peer, skipped = [line for line in markdown.splitlines() if line.startswith("| model step |")]
    assert "ours >= 1.5x transformers: met; >= 1,400 seq/s at seq 128 on one H100: met |" in met
    assert "ours >= 1.5x transformers: **NOT met** |" in missed
    assert (f"ours >= 1.5x transformers: not measured ({halted}); >= 1,400 seq/s at seq 128 on one H100: met; "
            ">= 45 % of the bf16 GEMM peak: not measured (no bf16 GEMM peak was measured) |") in no_peer
    assert no_peer.count("ModuleNotFoundError") == 1  # the error line is not repeated after the goal quoting it
    assert "ours >= 1.5x transformers: not measured (skipped: 0 s of the 0 s time budget left" in skipped
    [loop] = [line for line in markdown.splitlines() if line.startswith("| loop |")]
    assert ("the loop within 5 % of the model step: not measured (model_step: OutOfMemoryError: CUDA out of "
            "memory) |") in loop
    assert "**NOT met**" not in no_peer + skipped + loop
    assert "\n1 goal(s) not met: rerun with --profile" in markdown  # the missed one alone


@pytest.mark.slow
def test_a_command_past_its_time_is_killed_with_its_children_and_keeps_its_output() -> None:
    # A parent that starts a child, says its pid and waits (bash -c has no job control: one process group).
    parent = ["bash", "-c", "sleep 60 & echo child $!; wait"]
    tick = time.monotonic()
    status, output = gpu_report.run_group(parent, timeout=2)
    assert status is None and time.monotonic() - tick < 30
    child = int(output.split()[-1])  # printed before the cut: kept
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and Path(f"/proc/{child}").exists():  # init reaps it (seconds here)
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists()
    assert gpu_report.run_group(["echo", "done"], timeout=60) == (0, "done\n")


def refusal(script: str, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    """A shell helper run from `cwd` with a python that fails if reached: a refusal must come before it runs."""
    return subprocess.run(["bash", str(BENCHMARKS / script), *args], cwd=cwd, capture_output=True, text=True,
                          env={**ENV, "PYTHON": "false"}, timeout=60)


@pytest.mark.parametrize("args, line", [
    (["--tiny"], "error: gather_gpu_wheels.sh: unknown option --tiny; see --help"),
    (["wheels", "more"], "error: gather_gpu_wheels.sh: one folder at most, got wheels and more; see --help"),
])
def test_gather_gpu_wheels_refuses_a_flag_as_its_folder_before_downloading(tmp_path, args, line) -> None:
    done = refusal("gather_gpu_wheels.sh", *args, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert list(tmp_path.iterdir()) == []  # no --tiny folder, nothing downloaded


@pytest.mark.parametrize("args, line", [
    (["--tiny", "--bogus", "--output_dir", "out"], "error: gpu_report.sh: unknown option --bogus; see --help"),
    (["--wheels", "wheels", "--output_dir=out", "--tny"], "error: gpu_report.sh: unknown option --tny; see --help"),
    (["--wheels", "--tiny"], "error: gpu_report.sh: --wheels needs a folder; see --help"),
])
def test_gpu_report_sh_refuses_an_unknown_flag_before_installing_or_writing(tmp_path, args, line) -> None:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "a-1-py3-none-any.whl").write_bytes(b"")  # would be installed, were it not refused
    done = refusal("gpu_report.sh", *args, cwd=tmp_path)
    assert (done.returncode, done.stdout, done.stderr) == (2, "", line + "\n")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wheels"]


def test_gpu_report_sh_passes_the_reports_flags_and_knows_all_of_them(tmp_path) -> None:
    """gpu_report.sh's list of the report's flags is its parser's: none refused that the report takes."""
    text = (BENCHMARKS / "gpu_report.sh").read_text()
    listed = re.search(r"^REPORT_FLAGS=\(([^)]*)\)", text, re.MULTILINE).group(1).split()
    parser = gpu_report.argument_parser()
    assert sorted(listed) == sorted(flag for action in parser._actions for flag in action.option_strings)
    # Past the check, with every flag and a negative value: the python it execs (here `false`) is reached.
    done = refusal("gpu_report.sh", "--tiny", "--output_dir=out", "--device", "cpu", "--profile", "--data_prep",
                   "--sections", "loop", "--time_budget", "-1", "--batch_128", "2", "--batch_512", "1", cwd=tmp_path)
    assert (done.returncode, done.stderr) == (1, "")
