"""run_downstream.py: the plan of runs (tasks found x grid x seeds), the aggregation (median and min-max of the seeds,
the best configuration, the GLUE average), resuming (a finished run is never rerun, a run without scores is), a
failing run (its log kept, named, exit 1), bad input as one line before any run, and one real run of the grid over
two GLUE excerpts and a tiny SQuAD with a tiny model."""
import _thread
import hashlib
import io
import json
import random
import shutil
import signal
import sys
import threading
import time
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from bertrecipe.cli import run_downstream
from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import downstream_plan as plan
from bertrecipe.finetuning import downstream_report as report
from bertrecipe.finetuning import downstream_runs as runs
from helpers import GLUE_EXCERPTS, QUESTIONS, REPO_ROOT, SENTENCES, in_process, tiny_model_files, tiny_squad_file

COMMAND = REPO_ROOT / "run_downstream.py"


def data_folder(root: Path, glue_tasks=("RTE", "MRPC"), squad: bool = True) -> Path:
    """GLUE excerpts as task folders and a tiny SQuAD v1.1 (one paragraph, three questions) in squad/."""
    data = root / "data"
    for name in glue_tasks:
        shutil.copytree(GLUE_EXCERPTS / name, data / name)
    if squad:
        (data / "squad").mkdir(parents=True)
        tiny_squad_file(data / "squad" / "train-v1.1.json", QUESTIONS)
        tiny_squad_file(data / "squad" / "dev-v1.1.json", QUESTIONS)
    return data


def test_the_plan_is_every_task_found_times_its_grid_and_seeds(tmp_path):
    data = data_folder(tmp_path, ("RTE", "CoLA"))
    (data / "SST-2").mkdir()
    shutil.copyfile(GLUE_EXCERPTS / "SST-2" / "train.tsv", data / "SST-2" / "train.tsv")  # no dev.tsv: not a task
    found = plan.find_tasks(data, None, retrieval=False)
    assert [t.name for t in found.tasks] == ["cola", "rte", "squad-v1.1"] and found.missing == {}
    overrides = plan.GridOverrides(learning_rates=(1e-5, 2e-5, 3e-5), seeds=(7, 8))
    grids = plan.task_grids(plan.PRESETS["modernbert"], found.tasks, overrides)
    planned = plan.plan_runs(found.tasks, grids)
    # modernbert: epochs {1, 2, 3} x batch {16, 32} for GLUE; SQuAD keeps the BERT paper's one epoch count and batch
    assert len(planned) == 2 * (3 * 3 * 2 * 2) + 3 * 1 * 1 * 2
    rte = [(r.learning_rate, r.epochs, r.batch_size, r.seed) for r in planned if r.task.name == "rte"]
    assert sorted(rte) == sorted((lr, ep, bs, s) for lr in (1e-5, 2e-5, 3e-5) for ep in (1.0, 2.0, 3.0)
                                 for bs in (16, 32) for s in (7, 8))
    assert len({r.label for r in planned}) == len(planned)  # one folder each
    squad = [r for r in planned if r.task.kind == plan.SQUAD]
    assert {(r.epochs, r.batch_size, r.max_seq_length) for r in squad} == {(3.0, 32, 384)}
    assert squad[0].task.train_file == data / "squad" / "train-v1.1.json"


def test_a_task_named_but_not_there_is_one_line_naming_what_is_missing(tmp_path):
    data = data_folder(tmp_path, ("RTE",), squad=False)
    (data / "SST-2").mkdir()
    found = plan.find_tasks(data, ["rte", "SST-2"], retrieval=False)
    with pytest.raises(InputError, match=r"--tasks sst-2: .*SST-2 has no train.tsv"):
        plan.check_found(found, data)
    with pytest.raises(InputError, match=r"--tasks squad-v2.0: no folder .* holds both train-v2.0.json"):
        plan.check_found(plan.find_tasks(data, ["squad-v2.0"], retrieval=False), data)
    with pytest.raises(InputError, match="--tasks beir-scifact: retrieval needs run_retrieval.py"):
        plan.check_found(plan.find_tasks(data, ["beir-scifact"], retrieval=False), data)


def reference_median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def test_each_configuration_is_the_median_and_min_max_of_its_seeds_and_the_best_median_is_the_score():
    task = plan.Task("mrpc", plan.GLUE, Path("MRPC"))
    grid = plan.Grid((1e-5, 2e-5, 3e-5), (2.0,), (16,), (1, 2, 3, 4), 128)
    planned = plan.plan_runs([task], {"mrpc": grid})
    rng = random.Random(0)
    records = {r.label: {"metrics": {"F1": rng.uniform(60, 90), "acc": rng.uniform(60, 90)}} for r in planned}
    del records[planned[-1].label]  # the last configuration has 3 of its 4 seeds
    summary = report.summarize_task(task, planned, records)
    medians = {}
    for config in summary["configurations"]:
        mine = [records[r.label]["metrics"]["F1"] for r in planned
                if r.learning_rate == config["learning_rate"] and r.label in records]
        f1 = config["metrics"]["F1"]
        assert (f1["median"], f1["min"], f1["max"], f1["n"]) == (reference_median(mine), min(mine), max(mine),
                                                                 len(mine))
        medians[config["learning_rate"]] = f1["median"]
    assert summary["configurations"][-1]["missing_seeds"] == [4] and not summary["complete"]
    best = max(medians, key=medians.get)
    assert summary["best"]["learning_rate"] == best and summary["score"] == medians[best]
    assert summary["metric"] == "F1"  # the BERT paper's MRPC number


def test_the_glue_average_is_the_mean_of_the_glue_scores_without_wnli():
    tasks = {"cola": {"score": 50.0, "complete": True}, "mrpc": {"score": 80.0, "complete": True},
             "wnli": {"score": 20.0, "complete": True}, "squad-v1.1": {"score": 88.0, "complete": True}}
    average = report.glue_average(tasks)
    assert average == {"score": 65.0, "tasks": ["CoLA", "MRPC"], "excluded": ["WNLI"], "complete": True}
    tasks["mrpc"] = {"score": None, "complete": False}
    assert report.glue_average(tasks)["score"] is None  # never an average of fewer tasks than it names
    assert report.glue_average({"squad-v1.1": {"score": 88.0, "complete": True}}) is None


def fake_command(folder_results: dict, fail: set):
    """A command that writes results.json (or exits 3 for the labels in `fail`) in a fraction of a second."""
    def command(run, folder):
        if run.label in fail:
            return [sys.executable, "-c", "import sys; print('boom'); sys.exit(3)"]
        code = f"import json, sys; json.dump({folder_results!r}, open(sys.argv[1] + '/results.json', 'w'))"
        return [sys.executable, "-c", code, str(folder)]
    return command


def test_a_failed_run_keeps_its_log_writes_no_scores_and_is_the_only_one_run_again(tmp_path):
    task = plan.Task("rte", plan.GLUE, Path("RTE"))
    planned = plan.plan_runs([task], {"rte": plan.Grid((1e-5, 2e-5), (1.0,), (8,), (1, 2), 64)})
    identity = {"checkpoint_sha256": "abc"}
    lines = []
    executor = runs.Executor(tmp_path, fake_command({"eval_acc": 0.75}, {planned[1].label}), identity)
    outcomes = executor.run_all(planned, runs.cpu_slots(2, 2), runs.Progress(4, 0, lines.append))
    failed = [o.run.label for o in outcomes if o.record is None]
    assert failed == [planned[1].label]
    folder = runs.run_folder(tmp_path, planned[1])
    assert "boom" in (folder / runs.LOG).read_text() and not (folder / runs.SCORES).exists()
    assert json.loads((folder / runs.FAILURE).read_text())["returncode"] == 3
    assert runs.read_scores(runs.run_folder(tmp_path, planned[0]))["metrics"] == {"acc": 75.0}
    assert sum("FAILED" in line for line in lines) == 1 and lines[-1].startswith("[3/4 done, 0 running, 1 failed")
    done, todo = runs.sort_out_folders(planned, tmp_path, identity)
    assert todo == [planned[1]] and set(done) == {planned[i].label for i in (0, 2, 3)}
    executor = runs.Executor(tmp_path, fake_command({"eval_acc": 0.5}, set()), identity)
    executor.run_all(todo, runs.cpu_slots(2, 1), runs.Progress(4, 3, lines.append))
    assert runs.read_scores(folder)["metrics"] == {"acc": 50.0} and not (folder / runs.FAILURE).exists()
    assert runs.sort_out_folders(planned, tmp_path, identity)[1] == []


def test_scores_of_another_checkpoint_or_a_folder_not_ours_are_refused(tmp_path):
    task = plan.Task("rte", plan.GLUE, Path("RTE"))
    planned = plan.plan_runs([task], {"rte": plan.Grid((1e-5,), (1.0,), (8,), (1,), 64)})
    executor = runs.Executor(tmp_path, fake_command({"eval_acc": 0.75}, set()), {"checkpoint_sha256": "abc"})
    executor.run_all(planned, runs.cpu_slots(1, 1), runs.Progress(1, 0, lambda line: None))
    with pytest.raises(InputError, match="ran with other identity .checkpoint_sha256 'abc' instead of 'def'"):
        runs.sort_out_folders(planned, tmp_path, {"checkpoint_sha256": "def"})
    other = plan.plan_runs([task], {"rte": plan.Grid((2e-5,), (1.0,), (8,), (1,), 64)})
    runs.run_folder(tmp_path, other[0]).mkdir(parents=True)  # someone else's folder where a run would go
    with pytest.raises(InputError, match=r"lr2e-05_ep1_bs8_seed1: exists and was not made by run_downstream.py"):
        runs.sort_out_folders(other, tmp_path, {"checkpoint_sha256": "abc"})


def bad_input(argv):
    """The command's stderr, which must be one line, and nothing on stdout, with exit status 2. In this process
    without in_process's clean-up (whose torch reset imports inductor: 2.5 s), the SIGTERM handler restored."""
    handler = signal.getsignal(signal.SIGTERM)
    stdout, stderr = io.StringIO(), io.StringIO()
    saved, sys.argv = sys.argv, [str(a) for a in [COMMAND, *argv]]
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr), pytest.raises(SystemExit) as ended:
            run_downstream.cli()
    finally:
        sys.argv = saved
        signal.signal(signal.SIGTERM, handler)
    assert ended.value.code == 2, stderr.getvalue()
    assert len(stderr.getvalue().strip().splitlines()) == 1 and stdout.getvalue() == ""
    return stderr.getvalue()


def test_bad_input_is_one_line_before_any_run_and_writes_nothing(tmp_path):
    data = data_folder(tmp_path, ("RTE",), squad=False)
    vocab, config = tiny_model_files(tmp_path / "model")
    out = tmp_path / "out"
    common = ["--init_checkpoint", tmp_path / "model", "--data_dir", data, "--output_dir", out]
    assert "--tasks mrpc: " in bad_input([*common, "--tasks", "rte,mrpc", "--config_file", config])
    assert "--vocab_file: not given" in bad_input([*common[2:], "--init_checkpoint", config])
    accumulation = [*common, "--config_file", config, "--vocab_file", vocab, "--gradient_accumulation_steps", "3"]
    assert "batch sizes (8) must all be multiples" in bad_input([*accumulation, "--preset", "cpu_tiny"])
    inside = [*common[:4], "--output_dir", data / "RTE" / "out", "--config_file", config, "--vocab_file", vocab]
    assert "lies inside --data_dir" in bad_input(inside) and not (data / "RTE" / "out").exists()
    (data / "RTE" / "dev.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\ta\tb\tmaybe\n")
    assert "dev.tsv: line 2: label 'maybe'" in bad_input([*common, "--config_file", config])
    assert not out.exists()


@pytest.mark.slow
def test_a_vocab_of_another_model_is_refused_before_any_run(tmp_path, tiny_bert):
    data = data_folder(tmp_path, ("RTE",), squad=False)
    vocab, _ = tiny_model_files(tmp_path / "model")
    out = tmp_path / "out"
    common = ["--init_checkpoint", tiny_bert, "--data_dir", data, "--output_dir", out]
    assert f"{vocab}: " in bad_input([*common, "--vocab_file", vocab, "--do_lower_case"])  # 21 tokens, 8,960 rows
    assert "vocab.txt" in bad_input(common)  # an uncased vocab without --do_lower_case
    assert not out.exists()


@pytest.mark.slow
def test_a_failing_run_is_named_its_log_kept_and_the_call_exits_1(tmp_path, tiny_bert, monkeypatch):
    data = data_folder(tmp_path, ("RTE",), squad=False)
    monkeypatch.setitem(run_downstream.COMMANDS, plan.GLUE, "no_such_command")
    out = tmp_path / "out"
    result = in_process(run_downstream.cli, [COMMAND, "--init_checkpoint", tiny_bert, "--data_dir", data,
                                             "--output_dir", out, "--do_lower_case", "--preset", "cpu_tiny",
                                             "--learning_rates", "1e-4", "--seeds", "1"])
    assert result.returncode == 1
    assert "1 run(s) failed: rte/lr0.0001_ep1_bs8_seed1" in result.stderr
    log = out / "runs" / "rte" / "lr0.0001_ep1_bs8_seed1" / runs.LOG
    assert "cannot import name 'no_such_command' from 'bertrecipe.cli.entry'" in log.read_text()
    table = json.loads((out / "results.json").read_text())
    assert table["runs"]["failed"] == ["rte/lr0.0001_ep1_bs8_seed1"] and table["tasks"]["rte"]["score"] is None


def glue_metric(folder: Path, key: str) -> float:
    return 100 * json.loads((folder / "results.json").read_text())[key]


@pytest.mark.slow
def test_a_real_grid_over_two_glue_tasks_and_squad_then_resumed(tmp_path, tiny_bert):
    """12 runs (RTE, MRPC, SQuAD v1.1 x 2 learning rates x 2 seeds) of the real commands with a 2-layer model; the
    table's numbers are those the commands wrote; a second call runs nothing, one without a scores.json reruns."""
    data = data_folder(tmp_path)
    out = tmp_path / "out"
    argv = [COMMAND, "--init_checkpoint", tiny_bert, "--data_dir", data, "--output_dir", out, "--do_lower_case",
            "--preset", "cpu_tiny", "--workers", "2"]
    first = in_process(run_downstream.cli, argv)
    assert first.returncode == 0, first.stderr + first.stdout
    assert "12 runs, 0 done earlier, 12 to run" in first.stdout and first.stdout.count(" finished ") == 12
    table = json.loads((out / "results.json").read_text())
    assert list(table["tasks"]) == ["mrpc", "rte", "squad-v1.1"] and table["runs"]["finished"] == 12
    for name, key in (("mrpc", "eval_f1"), ("rte", "eval_acc")):
        for config in table["tasks"][name]["configurations"]:
            folders = [out / "runs" / name / f"lr{config['learning_rate']:g}_ep1_bs8_seed{s}" for s in (1, 2)]
            values = [glue_metric(folder, key) for folder in folders]
            assert config["metrics"][table["tasks"][name]["metric"]]["median"] == pytest.approx(sum(values) / 2)
    squad = table["tasks"]["squad-v1.1"]
    assert squad["metric"] == "F1" and squad["configurations"][0]["metrics"]["F1"]["n"] == 2
    assert table["glue_average"]["score"] == pytest.approx((table["tasks"]["mrpc"]["score"]
                                                            + table["tasks"]["rte"]["score"]) / 2)
    assert table["checkpoint"]["sha256"] == hashlib.sha256((tiny_bert / "model.safetensors").read_bytes()).hexdigest()
    assert table["protocol"]["preset"] == "cpu_tiny" and table["hardware"]["torch"]
    markdown = (out / "results.md").read_text()
    assert "**GLUE average** (MRPC, RTE)" in markdown and table["checkpoint"]["sha256"] in markdown
    assert not list(out.glob("runs/*/*/pytorch_model.bin"))  # weights removed once scored
    stamps = {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/scores.json")}
    again = in_process(run_downstream.cli, argv)
    assert again.returncode == 0 and "12 done earlier, 0 to run" in again.stdout
    assert {p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/scores.json")} == stamps
    removed = out / "runs" / "rte" / "lr5e-05_ep1_bs8_seed2" / "scores.json"
    removed.unlink()
    third = in_process(run_downstream.cli, argv)
    assert third.returncode == 0 and "11 done earlier, 1 to run" in third.stdout
    assert third.stdout.count(" started ") == 1 and "started rte/lr5e-05_ep1_bs8_seed2" in third.stdout
    assert removed.is_file()
    assert {p: t for p, t in stamps.items() if p != removed} == {
        p: p.stat().st_mtime_ns for p in out.glob("runs/*/*/scores.json") if p != removed}


def beir_folder(folder: Path) -> Path:
    """Six documents, four queries, each query's one relevant document in qrels/train.tsv and qrels/test.tsv."""
    (folder / "qrels").mkdir(parents=True)
    documents = [text for text, _ in SENTENCES] + ["a great film", "not very good"]
    (folder / "corpus.jsonl").write_text("".join(json.dumps({"_id": f"d{i}", "title": "", "text": text}) + "\n"
                                                 for i, text in enumerate(documents)))
    (folder / "queries.jsonl").write_text("".join(json.dumps({"_id": f"q{i}", "text": text.split()[-1]}) + "\n"
                                                  for i, (text, _) in enumerate(SENTENCES)))
    for split in ("train", "test"):
        rows = "".join(f"q{i}\td{i}\t1\n" for i in range(len(SENTENCES)))
        (folder / "qrels" / f"{split}.tsv").write_text("query-id\tcorpus-id\tscore\n" + rows)
    return folder


@pytest.mark.slow
@pytest.mark.skipif(not run_downstream.retrieval_available(), reason="run_retrieval.py is not in this checkout")
def test_a_beir_folder_is_a_retrieval_task_scored_by_ndcg_at_10(tmp_path, tiny_bert):
    data = tmp_path / "data"
    beir_folder(data / "toy")
    out = tmp_path / "out"
    result = in_process(run_downstream.cli, [COMMAND, "--init_checkpoint", tiny_bert, "--data_dir", data,
                                             "--output_dir", out, "--do_lower_case", "--preset", "cpu_tiny",
                                             "--learning_rates", "1e-4", "--seeds", "1,2", "--workers", "2"])
    assert result.returncode == 0, result.stderr + result.stdout
    task = json.loads((out / "results.json").read_text())["tasks"]["beir-toy"]
    written = [json.loads((out / "runs" / "beir-toy" / f"lr0.0001_ep1_bs8_seed{s}" / "results.json").read_text())
               for s in (1, 2)]
    assert task["metric"] == "nDCG@10" and written[0]["split"] == "test" and written[0]["train_steps"] >= 1
    assert task["score"] == pytest.approx(50 * (written[0]["ndcg@10"] + written[1]["ndcg@10"]))
    missing = plan.find_tasks(data, ["beir-toy"], retrieval=True)
    assert missing.tasks and missing.tasks[0].train_file == data / "toy" / "qrels" / "train.tsv"
    (data / "toy" / "qrels" / "train.tsv").unlink()
    with pytest.raises(InputError, match="--tasks beir-toy: .*toy has no qrels/train.tsv"):
        plan.check_found(plan.find_tasks(data, ["beir-toy"], retrieval=True), data)


def test_a_run_that_raises_is_named_failed_and_a_closed_output_stops_only_the_progress_lines(tmp_path):
    task = plan.Task("rte", plan.GLUE, Path("RTE"))
    planned = plan.plan_runs([task], {"rte": plan.Grid((1e-5, 2e-5), (1.0,), (8,), (1,), 64)})
    good = fake_command({"eval_acc": 0.75}, set())

    def command(run, folder):
        if run == planned[0]:
            raise OSError("No space left on device")
        return good(run, folder)

    def closed_pipe(line):
        raise BrokenPipeError(32, "Broken pipe")

    executor = runs.Executor(tmp_path, command, {"checkpoint_sha256": "abc"})
    outcomes = executor.run_all(planned, runs.cpu_slots(1, 1), runs.Progress(2, 0, closed_pipe))
    problems = {o.run.label: o.problem for o in outcomes}
    assert problems == {planned[0].label: "OSError: No space left on device", planned[1].label: ""}
    assert runs.read_scores(runs.run_folder(tmp_path, planned[1]))["metrics"] == {"acc": 75.0}


def test_the_tables_name_the_checkpoint_protocol_and_hardware_and_flag_what_is_incomplete(tmp_path):
    tasks = [plan.Task("cola", plan.GLUE, Path("CoLA")), plan.Task("wnli", plan.GLUE, Path("WNLI"))]
    grids = {t.name: plan.Grid((1e-5, 2e-5), (3.0,), (32,), (1, 2), 128) for t in tasks}
    planned = plan.plan_runs(tasks, grids)
    records = {r.label: {"metrics": {"MCC" if r.task.name == "cola" else "acc": 10.0 * r.seed + 1e6 * r.learning_rate}}
               for r in planned[:-1]}
    header = {"checkpoint": {"path": "ckpt.pt", "weights_file": "ckpt.pt", "sha256": "f00d"},
              "vocab": {"path": "vocab.txt", "kind": "wordpiece", "size": 30522, "sha256": "beef",
                        "do_lower_case": True},
              "protocol": report.protocol_record(plan.PRESETS["bert"], grids, max_steps=5,
                                                 overrides=plan.GridOverrides(seeds=(1, 2))),
              "hardware": {"gpus": ["NVIDIA H100"] * 2, "cpu": "x", "cpu_cores": 8, "torch": "2.5", "cuda": "12.4",
                           "precision": "fp16", "concurrent_runs": 2, "threads_per_run": None}}
    table = report.build_report(header, tasks, planned, records, [planned[-1].label])
    report.write_report(tmp_path, table)
    assert json.loads((tmp_path / "results.json").read_text()) == table
    text = (tmp_path / "results.md").read_text()
    for expected in ("`f00d`", "30,522 tokens", "preset `bert`", "Devlin et al. 2019", "2 GPU(s): NVIDIA H100",
                     "precision fp16", "stopped after 5 steps",
                     "**replaced by this command: seeds 1, 2**",
                     "| CoLA | MCC | 35.00 | n=2, 30.00 - 40.00 | lr 2e-05",
                     "WNLI (incomplete)", "**GLUE average** (CoLA; WNLI excluded) | | **35.00**",
                     f"failed in this call: {planned[-1].label}"):
        assert expected in text, expected


def test_ctrl_c_stops_the_running_processes_and_their_runs_are_left_to_rerun(tmp_path):
    task = plan.Task("rte", plan.GLUE, Path("RTE"))
    planned = plan.plan_runs([task], {"rte": plan.Grid((1e-5, 2e-5, 3e-5), (1.0,), (8,), (1,), 64)})
    executor = runs.Executor(tmp_path, lambda run, folder: [sys.executable, "-c", "import time; time.sleep(60)"],
                             {"checkpoint_sha256": "abc"})
    threading.Timer(1.0, _thread.interrupt_main).start()  # Ctrl-C, as the terminal delivers it to this thread
    start = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        executor.run_all(planned, runs.cpu_slots(2, 2), runs.Progress(3, 0, lambda line: None))
    assert time.monotonic() - start < 30
    assert executor.processes == set() or all(p.poll() is not None for p in executor.processes)
    assert runs.sort_out_folders(planned, tmp_path, {"checkpoint_sha256": "abc"}) == ({}, planned)


def test_one_run_per_gpu_names_the_gpus_this_process_sees_and_a_cpu_splits_its_cores():
    assert [slot.env["CUDA_VISIBLE_DEVICES"] for slot in runs.gpu_slots(4, 4)] == ["0", "1", "2", "3"]
    assert [slot.env["CUDA_VISIBLE_DEVICES"] for slot in runs.gpu_slots(2, 3, "5,7")] == ["5", "7", "5"]
    slots = runs.cpu_slots(16, 4)
    assert len(slots) == 4 and {s.env["OMP_NUM_THREADS"] for s in slots} == {"4"}
    assert {s.env["CUDA_VISIBLE_DEVICES"] for s in slots} == {""}
    assert runs.cpu_slots(2, 4)[0].env["OMP_NUM_THREADS"] == "1"


def test_each_task_is_scored_by_the_metric_papers_report():
    def first(name, kind, results):
        run = plan.plan_runs([plan.Task(name, kind, Path(name))], {name: plan.Grid((1e-5,), (1.0,), (8,), (1,), 64)})[0]
        return runs.metrics_of(run, results)

    v2 = {"F1": 60.0, "exact_match": 55.0, "best_f1": 71.5, "best_exact": 68.0, "HasAns_f1": 80.0}
    assert first("squad-v2.0", plan.SQUAD, v2) == {"F1": 71.5, "EM": 68.0, "F1 at 0": 60.0, "EM at 0": 55.0}
    assert first("squad-v1.1", plan.SQUAD, {"F1": 88.5, "exact_match": 81.0}) == {"F1": 88.5, "EM": 81.0}
    assert first("sts-b", plan.GLUE, {"eval_spearmanr": 0.885, "eval_pearson": 0.89, "eval_corr": 0.8875}) == {
        "Spearman": 88.5, "Pearson": 89.0}
    assert first("mnli", plan.GLUE, {"eval_acc": 0.84}) == {"m acc": 84.0}  # no dev_mismatched.tsv
    with pytest.raises(KeyError):
        first("mrpc", plan.GLUE, {"eval_acc": 0.8})  # its score, F1, missing: the run is not scored


@pytest.mark.parametrize("value", ["-1e-5", "-1e-5,3e-5", "-.5"])
def test_a_negative_learning_rate_is_judged_as_a_value_not_read_as_a_flag(tmp_path, value):
    """`--learning_rates -1e-5` was `expected one argument`: argparse took the value for an unknown flag (issue 48)."""
    result = in_process(run_downstream.cli, ["run_downstream.py", "--init_checkpoint", tmp_path, "--data_dir",
                                             tmp_path, "--output_dir", tmp_path / "out", "--learning_rates", value])
    assert (result.returncode, result.stderr) == (2, f"error: run_downstream.py: argument --learning_rates: "
                                                     f"'{value}': give one or more values > 0; see --help\n")
    assert not (tmp_path / "out").exists()
