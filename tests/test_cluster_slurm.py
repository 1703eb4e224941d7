"""run.sub in dry-run mode: the srun command of each phase, its flags as run_pretraining.py parses them, the
phase-2 hand-off, resumption after a requeue, the preemption signal and the per-task rank variables."""
import os
import re
import shlex
import subprocess
import sys

import pytest

from bertrecipe.cli import run_pretraining
from helpers import REPO_ROOT

RUN_SUB = REPO_ROOT / "run.sub"


def dry_run(tmp_path, **env) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    environment.update(DRYRUN="1", DATADIR=str(tmp_path / "shards"), CHECKPOINTDIR=str(tmp_path / "ckpt"), **env)
    return subprocess.run(["bash", str(RUN_SUB)], env=environment, capture_output=True, text=True, timeout=30)


def srun_command(result: subprocess.CompletedProcess) -> list[str]:
    assert result.returncode == 0, result.stderr
    lines = [shlex.split(line) for line in result.stdout.splitlines() if line.strip()]
    [command] = [words for words in lines if words[0] == "srun"]
    return command


def training_args(command: list[str]):
    script = command.index("/workspace/bert/run_pretraining.py")
    return run_pretraining.parse_args(command[script + 1:])


def option(command: list[str], name: str) -> str:
    [value] = [word.split("=", 1)[1] for word in command if word.startswith(f"--{name}=")]
    return value


def test_phase1_runs_one_task_per_gpu_in_the_container_with_the_environment_settings(tmp_path):
    command = srun_command(dry_run(tmp_path, PHASE="1", BATCHSIZE="64", LR="1e-3", GRADIENT_STEPS="4",
                                   WARMUP_UPDATES="0.1", PRECISION="bf16", CONFIG="bert_configs/base.json",
                                   DGXNGPU="4", SLURM_JOB_NUM_NODES="2", CONT="registry/bert:1", SHARDING="fsdp"))
    assert option(command, "nodes") == "2" and option(command, "ntasks-per-node") == "4"
    assert option(command, "container-image") == "registry/bert:1"
    assert option(command, "container-mounts") == f"{tmp_path / 'shards'}:/data:ro,{tmp_path / 'ckpt'}:/results"
    args = training_args(command)
    assert (args.train_batch_size, args.learning_rate, args.gradient_accumulation_steps) == (64, 1e-3, 4)
    assert (args.warmup_proportion, args.bf16, args.fp16) == (0.1, True, False)
    assert (args.config_file, args.input_dir, args.output_dir) == ("bert_configs/base.json", "/data", "/results")
    assert (args.max_seq_length, args.max_predictions_per_seq, args.phase2) == (128, 20, False)
    assert not args.resume_from_checkpoint  # a fresh CHECKPOINTDIR: nothing to resume
    assert args.sharding == "fsdp"
    assert training_args(srun_command(dry_run(tmp_path, PHASE="1"))).sharding == "ddp"  # the default


def test_phase1_resumes_its_newest_checkpoint_after_a_requeue(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "ckpt_200.pt").write_bytes(b"")
    args = training_args(srun_command(dry_run(tmp_path, PHASE="1")))
    assert args.resume_from_checkpoint and not args.phase2


def test_a_sharded_run_resumes_its_folder_of_shards_and_leaves_out_ddps_fp16_all_reduce(tmp_path):
    """Under SHARDING=fsdp the checkpoints are ckpt_<step>.dcp folders, which a requeue resumes from, and fp16
    keeps its precision flag without DDP's compressed all-reduce (run_pretraining.py refuses it sharded)."""
    (tmp_path / "ckpt" / "ckpt_200.dcp").mkdir(parents=True)
    args = training_args(srun_command(dry_run(tmp_path, PHASE="1", SHARDING="fsdp", PRECISION="fp16")))
    assert args.resume_from_checkpoint and args.sharding == "fsdp" and args.fp16
    assert not args.allreduce_post_accumulation_fp16
    assert training_args(srun_command(dry_run(tmp_path, PHASE="1", PRECISION="fp16"))).allreduce_post_accumulation_fp16


def test_phase2_picks_up_phase1_checkpoints_from_the_same_folder(tmp_path):
    phase1 = srun_command(dry_run(tmp_path, PHASE="1"))
    phase2 = srun_command(dry_run(tmp_path, PHASE="2", PHASE1_END_STEP="7038", PRECISION="fp16"))
    assert option(phase1, "container-mounts") == option(phase2, "container-mounts")
    args = training_args(phase2)
    assert args.resume_from_checkpoint and args.phase2 and args.phase1_end_step == 7038
    assert (args.max_seq_length, args.max_predictions_per_seq) == (512, 80)
    assert args.fp16 and args.allreduce_post_accumulation_fp16
    assert args.json_summary == "/results/dllogger_phase2.json"
    assert training_args(phase1).json_summary == "/results/dllogger_phase1.json"


def test_preemption_sends_sigterm_to_the_tasks_before_the_time_limit():
    lines = RUN_SUB.read_text().splitlines()
    first_command = next(i for i, line in enumerate(lines[1:], 1) if line.strip() and not line.startswith("#"))
    directives = [line for line in lines[:first_command] if line.startswith("#SBATCH")]
    # No "B:" prefix: the signal goes to the job steps (the training processes), not only to the batch shell.
    [signal] = [d for d in directives if d.startswith("#SBATCH --signal=")]
    assert re.fullmatch(r"#SBATCH --signal=TERM@\d+", signal)
    assert "#SBATCH --requeue" in directives


def test_each_task_gets_torch_rank_variables_from_slurm(tmp_path):
    command = srun_command(dry_run(tmp_path))
    bash = command.index("bash")
    wrapper = command[bash:command.index("python")]  # bash -c <mapping> <name>
    probe = [sys.executable, "-c", "import os; print(os.environ['RANK'], os.environ['LOCAL_RANK'], "
                                   "os.environ['WORLD_SIZE'])"]
    env = {**os.environ, "SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8"}
    done = subprocess.run(wrapper + probe, env=env, capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["5", "1", "8"], done.stderr


@pytest.mark.parametrize("env, message", [({"PRECISION": "fp8"}, "PRECISION"), ({"PHASE": "3"}, "PHASE"),
                                          ({"TRAIN_STEPS": "5000"}, "TRAIN_STEPS 5000 differs from PHASE1_END_STEP")])
def test_bad_settings_exit_2_before_running_anything(tmp_path, env, message):
    result = dry_run(tmp_path, **env)
    assert result.returncode == 2 and message in result.stderr and "srun" not in result.stdout


def test_missing_data_folder_is_refused(tmp_path):
    environment = {k: v for k, v in os.environ.items() if k not in ("DATADIR", "CHECKPOINTDIR")}
    result = subprocess.run(["bash", str(RUN_SUB)], env={**environment, "DRYRUN": "1"}, capture_output=True,
                            text=True, timeout=30)
    assert result.returncode != 0 and "DATADIR" in result.stderr and "srun" not in result.stdout
