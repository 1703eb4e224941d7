"""run_pretraining.py --sharding fsdp (FSDP2 on gloo, as torchrun --standalone starts it): the same losses and
weights as DDP on as many processes, LAMB's trust ratios over whole tensors, checkpoints in the usual single-file
layout, and resumes on other numbers of processes."""
import json

import pytest
import torch

from bertrecipe.training.metric_logger import read_log
from helpers import TINY, pretrain, step_records

STEPS = 20
NO_DROPOUT = "bert_config_no_dropout.json"


def checkpoint(folder, step):
    return torch.load(folder / f"ckpt_{step}.pt", weights_only=True)


def evaluations(log):
    return [r["data"] for r in read_log(log) if r["type"] == "LOG" and "eval_loss" in r["data"]]


def assert_same_run(a, b, steps, loss_tolerance=1e-5, weight_tolerance=1e-6):
    """Every logged step's loss within loss_tolerance (relative) and the final weights within weight_tolerance."""
    losses_a, losses_b = step_records(a / "log.json"), step_records(b / "log.json")
    assert sorted(losses_a) == sorted(losses_b) == [(0, s) for s in range(1, steps + 1)]
    for key in losses_a:
        expected, found = losses_a[key]["step_loss"], losses_b[key]["step_loss"]
        assert found == pytest.approx(expected, rel=loss_tolerance), (key, expected, found)
    weights_a, weights_b = checkpoint(a, steps)["model"], checkpoint(b, steps)["model"]
    assert sorted(weights_a) == sorted(weights_b)
    worst = max(float((weights_a[k].float() - weights_b[k].float()).abs().max()) for k in weights_a)
    assert worst < weight_tolerance, worst


@pytest.mark.slow
@pytest.mark.parametrize("nproc, precision", [(2, []), (4, []), (2, ["--fp16"])])
def test_fsdp_equals_ddp_on_as_many_processes(corpus, tmp_path, nproc, precision):
    """LAMB over shards is LAMB: the whole-tensor norms of its trust ratios and of the clipping make FSDP's run
    DDP's, step by step, with gradient accumulation; the checkpoint holds the gathered (whole) state. In fp16 the
    loss scaler skips the same steps (its first ones overflow at 2^20): every process decides from all shards."""
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    # NVIDIA's phase-2 LAMB rate. A tensor's norm summed over shards differs from the whole tensor's by fp32's
    # rounding (a few 1e-6 of it on 500,000 numbers), which moves each step's update by as much: 20 steps at the
    # helper's 2e-2 drift 2.5e-6 apart, at 4e-3 under 1e-6.
    common = ["--train_batch_size", 4, "--gradient_accumulation_steps", 2, "--max_steps", STEPS, "--log_freq", 1,
              "--num_steps_per_checkpoint", STEPS, "--learning_rate", "4e-3", *precision]
    # Evaluated twice (a sharded model's inference must not reuse weights gathered for the first), in batches
    # that the ranks hold unequal numbers of.
    common += ["--do_eval", "--eval_dir", corpus / "eval", "--eval_batch_size", 24, "--eval_steps", STEPS // 2]
    pretrain(corpus, ddp, *common, config=NO_DROPOUT, nproc=nproc)
    pretrain(corpus, fsdp, *common, "--sharding", "fsdp", config=NO_DROPOUT, nproc=nproc)
    # fp16's products round to 11 bits: the two runs' last-bit differences grow faster there (1.8e-5 seen).
    assert_same_run(ddp, fsdp, STEPS, weight_tolerance=1e-4 if precision else 1e-6)
    skipped = [[r["skipped_steps"] for _, r in sorted(step_records(run / "log.json").items())] for run in (ddp, fsdp)]
    assert skipped[0] == skipped[1] and skipped[0][-1] == (3 if precision else 0), skipped
    held_out_ddp, held_out_fsdp = evaluations(ddp / "log.json"), evaluations(fsdp / "log.json")
    assert len(held_out_ddp) == len(held_out_fsdp) == 3  # steps 10 and 20, and the final record
    for expected, found in zip(held_out_ddp, held_out_fsdp, strict=True):
        for key in ("eval_loss", "eval_mlm_accuracy"):
            assert found[key] == pytest.approx(expected[key], rel=1e-5), key
    moments_ddp, moments_fsdp = checkpoint(ddp, STEPS)["optimizer"], checkpoint(fsdp, STEPS)["optimizer"]
    assert sorted(moments_ddp["state"]) == sorted(moments_fsdp["state"])
    # The moments follow the weights' last-bit differences; a key bias's gradient is rounding noise (its true
    # value is 0: softmax ignores what a row's scores share), hence the floor.
    for index, entry in moments_ddp["state"].items():
        for key, value in entry.items():
            difference = (value - moments_fsdp["state"][index][key]).abs().max()
            assert difference <= 1e-3 * value.abs().max() + 1e-9, (index, key, float(difference))


@pytest.mark.slow
def test_fsdp_resumes_on_4_then_2_then_1_then_3_processes(corpus, tmp_path):
    """A sharded run stopped every 2 steps and resumed on another number of processes goes on as the run on 4
    processes that never stopped: the checkpoint is whole, and each resume shards it anew (the single-process leg
    trains unsharded, from and into the same files). Kept across the legs, as a resume must keep them: the global
    batch (24), the 12 lanes of the sample stream (every number of processes here divides them), and the
    micro-batch (2 rows, one lane's share of a step: NVIDIA's loss is a mean over each micro-batch's tokens, so
    another grouping of the rows would be another loss)."""
    straight, moved = tmp_path / "straight", tmp_path / "moved"
    common = ["--max_steps", 8, "--log_freq", 1, "--num_steps_per_checkpoint", 2, "--learning_rate", "4e-3",
              "--data_lanes", 12, "--sharding", "fsdp", "--resume_from_checkpoint"]
    legs = {4: (6, 3), 2: (12, 6), 1: (24, 12), 3: (8, 4)}  # processes: rows a process a step, micro-batches
    pretrain(corpus, straight, *common, "--train_batch_size", 6, "--gradient_accumulation_steps", 3,
             config=NO_DROPOUT, nproc=4)
    for nproc, (batch, accumulation) in legs.items():
        pretrain(corpus, moved, *common, "--train_batch_size", batch, "--gradient_accumulation_steps", accumulation,
                 "--steps_this_run", 2, config=NO_DROPOUT, nproc=nproc)
    # The logged step loss is the first process's, whose share of the batch changes with their number: the
    # weights after each leg are compared instead.
    assert sorted(p.name for p in moved.glob("ckpt_*.pt")) == ["ckpt_4.pt", "ckpt_6.pt", "ckpt_8.pt"]
    for step in (4, 6, 8):
        weights_a, weights_b = checkpoint(straight, step)["model"], checkpoint(moved, step)["model"]
        worst = max(float((weights_a[k] - weights_b[k]).abs().max()) for k in weights_a)
        assert worst < 1e-6, (step, worst)
    assert sorted(step_records(moved / "log.json")) == [(0, s) for s in range(1, 9)]


@pytest.mark.slow
def test_the_modern_family_with_stable_adamw_sharded_equals_ddp(corpus, tmp_path):
    """ModernBERT's layers are the units, and StableAdamW's per-tensor RMS (its update clipping) is the whole
    tensor's: FSDP on 2 processes trains as DDP does."""
    config = tmp_path / "modern_config.json"
    config.write_text(json.dumps({"model_type": "modernbert", "vocab_size": TINY["vocab_size"], "hidden_size": 64,
                                  "num_hidden_layers": 3, "num_attention_heads": 4, "intermediate_size": 96,
                                  "max_position_embeddings": 128, "local_attention": 16, "pad_token_id": 0,
                                  "global_attn_every_n_layers": 2}))
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    common = ["--train_batch_size", 4, "--max_steps", STEPS, "--log_freq", 1, "--num_steps_per_checkpoint", STEPS,
              "--optimizer", "stable_adamw", "--learning_rate", "1e-3"]
    pretrain(corpus, ddp, *common, config=config, nproc=2)
    pretrain(corpus, fsdp, *common, "--sharding", "fsdp", config=config, nproc=2)
    assert_same_run(ddp, fsdp, STEPS)
