"""run_pretraining.py --sharding fsdp (FSDP2 on gloo, as torchrun --standalone starts it): the same losses and
weights as DDP on as many processes, LAMB's trust ratios over whole tensors, sharded checkpoints that every process
writes its part of (torch.distributed.checkpoint), and resumes on other numbers of processes."""
import json
import sys

import pytest
import torch
from safetensors import safe_open

from bertrecipe.common.errors import InputError
from bertrecipe.model.weights import read_weights
from bertrecipe.training import checkpointing
from bertrecipe.training.metric_logger import read_log
from helpers import GLUE_EXCERPTS, REPO_ROOT, TINY, glue, pretrain, run_command, step_records

STEPS = 20
NO_DROPOUT = "bert_config_no_dropout.json"


def sharded_tensors(folder):
    """A ckpt_<step>.dcp folder's tensors, whole, put together from its safetensors files by the offset of each
    slice that the file's header records (DCP_SHARDING_INFO): plain safetensors, not the reader the recipe uses."""
    slices = {}
    for path in sorted(folder.glob("*.safetensors")):
        with safe_open(path, "pt") as f:
            offsets = json.loads((f.metadata() or {}).get("DCP_SHARDING_INFO", "{}"))
            for name in f.keys():
                tensor = f.get_tensor(name)
                start = offsets.get(name, {}).get("saved_offsets", [0] * tensor.dim())
                slices.setdefault(name, []).append((start, tensor))
    whole = {}
    for name, parts in slices.items():
        shape = [max(start[d] + tensor.shape[d] for start, tensor in parts) for d in range(parts[0][1].dim())]
        whole[name] = torch.zeros(shape, dtype=parts[0][1].dtype)
        for start, tensor in parts:
            whole[name][tuple(slice(s, s + n) for s, n in zip(start, tensor.shape, strict=True))] = tensor
    return whole


def checkpoint(folder, step):
    """ckpt_<step>.pt, or the folder ckpt_<step>.dcp as the same dictionary (whole model and optimizer state)."""
    if not (folder / f"ckpt_{step}.dcp").is_dir():
        return torch.load(folder / f"ckpt_{step}.pt", weights_only=True)
    sharded = folder / f"ckpt_{step}.dcp"
    state, tensors = torch.load(sharded / "training_state.pt", weights_only=True), sharded_tensors(sharded)
    model = {name[len("model."):]: value for name, value in tensors.items() if name.startswith("model.")}
    model.update({name: model[source] for name, source in state["tied"].items()})
    names = state["optimizer"]["parameter_names"]
    moments = {index: {} for index in range(len(names))}
    for name, value in tensors.items():
        if name.startswith("optimizer."):
            parameter, key = name[len("optimizer."):].rsplit(".", 1)
            moments[names.index(parameter)][key] = value
    return {**state, "model": model, "optimizer": {"state": moments}}


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


def ddp_and_fsdp_runs(corpus, tmp_path, nproc, *extra):
    """The same 20 LAMB steps with accumulation under DDP and under FSDP, evaluated twice (a sharded model's
    inference must not reuse weights gathered for the first) in batches that the ranks hold unequal numbers of."""
    ddp, fsdp = tmp_path / "ddp", tmp_path / "fsdp"
    # NVIDIA's phase-2 LAMB rate. A tensor's norm summed over shards differs from the whole tensor's by fp32's
    # rounding (a few 1e-6 of it on 500,000 numbers), which moves each step's update by as much: 20 steps at the
    # helper's 2e-2 drift 2.5e-6 apart, at 4e-3 under 1e-6.
    common = ["--train_batch_size", 4, "--gradient_accumulation_steps", 2, "--max_steps", STEPS, "--log_freq", 1,
              "--num_steps_per_checkpoint", STEPS, "--learning_rate", "4e-3", *extra,
              "--do_eval", "--eval_dir", corpus / "eval", "--eval_batch_size", 24, "--eval_steps", STEPS // 2]
    pretrain(corpus, ddp, *common, config=NO_DROPOUT, nproc=nproc)
    pretrain(corpus, fsdp, *common, "--sharding", "fsdp", config=NO_DROPOUT, nproc=nproc)
    return ddp, fsdp


def skipped_steps(run):
    return [r["skipped_steps"] for _, r in sorted(step_records(run / "log.json").items())]


@pytest.mark.slow
@pytest.mark.parametrize("nproc, extra", [(2, []), (4, []), (2, ["--checkpoint_activations"])])
def test_fsdp_equals_ddp_on_as_many_processes(corpus, tmp_path, nproc, extra):
    """LAMB over shards is LAMB: the whole-tensor norms of its trust ratios and of the clipping make FSDP's run
    DDP's, step by step, with gradient accumulation (and with the layers' activations recomputed in backward,
    which gathers each layer's weights once more); the checkpoint holds the whole state."""
    ddp, fsdp = ddp_and_fsdp_runs(corpus, tmp_path, nproc, *extra)
    assert_same_run(ddp, fsdp, STEPS)
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
def test_fp16_under_fsdps_policy_trains_as_ddps_autocast_to_fp16s_resolution(corpus, tmp_path):
    """--fp16 sharded is FSDP's mixed-precision policy: every weight rounded to fp16 for the step (DDP's autocast
    rounds only the matmuls' operands, and keeps LayerNorm and embedding weights fp32), gradients reduced in fp32.
    The loss scaler skips the same steps (its first ones overflow at 2^20: every process decides from all shards),
    the losses agree within 1e-4, and each weight tensor within 5 % of its norm (at most 1.6 % seen, on a LayerNorm
    bias; 1e-6 in fp32, above)."""
    ddp, fsdp = ddp_and_fsdp_runs(corpus, tmp_path, 2, "--fp16")
    assert skipped_steps(ddp) == skipped_steps(fsdp) and skipped_steps(ddp)[-1] == 3
    losses_ddp, losses_fsdp = step_records(ddp / "log.json"), step_records(fsdp / "log.json")
    assert sorted(losses_ddp) == sorted(losses_fsdp) == [(0, s) for s in range(1, STEPS + 1)]
    for key, record in losses_ddp.items():
        assert losses_fsdp[key]["step_loss"] == pytest.approx(record["step_loss"], rel=1e-4), key
    weights_ddp, weights_fsdp = checkpoint(ddp, STEPS)["model"], checkpoint(fsdp, STEPS)["model"]
    for name, value in weights_ddp.items():
        difference = value - weights_fsdp[name]
        if name.endswith("key.bias"):  # its gradient is rounding noise (softmax ignores what a row's scores share)
            assert float(difference.abs().max()) < 1e-4, name
        else:
            assert float(difference.norm() / value.norm()) < 5e-2, name


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
    # Sharded folders from the legs on 4, 2 and 3 processes, one file from the single process (nothing to shard).
    assert sorted(p.name for p in moved.glob("ckpt_*")) == ["ckpt_4.dcp", "ckpt_6.pt", "ckpt_8.dcp"]
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


@pytest.mark.slow
def test_a_sharded_checkpoint_is_every_process_s_shards_and_every_command_reads_it(corpus, vocab_file, tmp_path):
    """Each process writes its own files of ckpt_<step>.dcp (the model's and the optimizer's); the converter makes
    the single file an unsharded run writes, which a DDP run resumes from as the sharded run goes on; the
    Hugging Face export, the weights reader, the release, run_glue.py and run_pretraining_inference take the
    folder as they take a file; a folder that lost a file is known not to load; a killed save's temporary folder is
    removed."""
    sharded, unsharded = tmp_path / "sharded", tmp_path / "unsharded"
    common = ["--train_batch_size", 4, "--log_freq", 1, "--num_steps_per_checkpoint", 2, "--learning_rate", "4e-3",
              "--resume_from_checkpoint"]
    pretrain(corpus, sharded, *common, "--max_steps", 4, "--sharding", "fsdp", config=NO_DROPOUT, nproc=2)
    folder = sharded / "ckpt_4.dcp"
    state = torch.load(folder / "training_state.pt", weights_only=True)
    assert sorted(state["tensor_files"]) == [f"shard-0000{rank}-model-0000{part}-of-00002.safetensors"
                                             for rank in (1, 2) for part in (1, 2)]
    assert all((folder / name).stat().st_size == size > 0 for name, size in state["tensor_files"].items())

    converted = unsharded / "ckpt_4.pt"
    run_command([sys.executable, str(REPO_ROOT / "scripts" / "convert_checkpoint.py"), str(folder), str(converted)])
    single, expected = torch.load(converted, weights_only=True), checkpoint(sharded, 4)
    assert single["model"].keys() == expected["model"].keys()
    assert all(torch.equal(single["model"][k], expected["model"][k]) for k in expected["model"])
    for index, entry in expected["optimizer"]["state"].items():
        assert entry.keys() <= single["optimizer"]["state"][index].keys()
        assert all(torch.equal(single["optimizer"]["state"][index][k], v) for k, v in entry.items())
    assert single["global_step"] == single["phase_step"] == 4 and single["data"] == state["data"]

    # A save killed in the middle leaves its temporary folder (of a process that has gone): the next start
    # removes it, and it was never taken for a checkpoint.
    stale = sharded / ".ckpt_6.dcp.99999999.abcdefgh.tmp"
    stale.mkdir()
    (stale / "shard-00001-model-00001-of-00002.safetensors").write_bytes(b"half")
    pretrain(corpus, sharded, *common, "--max_steps", 6, "--sharding", "fsdp", config=NO_DROPOUT, nproc=2)
    pretrain(corpus, unsharded, *common, "--max_steps", 6, config=NO_DROPOUT, nproc=2)
    assert not stale.exists()
    a, b = checkpoint(sharded, 6)["model"], checkpoint(unsharded, 6)["model"]
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6

    weights = read_weights(folder)
    assert all(torch.equal(weights.state_dict[k], v) for k, v in read_weights(converted).state_dict.items())
    exports = [tmp_path / "hf_from_folder", tmp_path / "hf_from_file"]
    for source, export in zip((folder, converted), exports, strict=True):
        run_command([sys.executable, str(REPO_ROOT / "scripts" / "convert_checkpoint.py"), str(source), str(export)])
    assert (exports[0] / "model.safetensors").read_bytes() == (exports[1] / "model.safetensors").read_bytes()
    released = tmp_path / "release"  # the card states the run's records, read from the folder's training state
    run_command([sys.executable, str(REPO_ROOT / "scripts" / "export_model.py"), str(sharded / "ckpt_6.dcp"),
                 str(released), "--vocab_file", str(vocab_file)])
    assert "| optimizer steps | 6 |" in (released / "README.md").read_text()
    tuned = tmp_path / "sst2"
    glue(vocab_file, GLUE_EXCERPTS / "SST-2", tuned, "--task_name", "SST-2", "--init_checkpoint", str(folder),
         "--do_train", "--max_seq_length", "32", "--train_batch_size", "8", "--max_steps", "2")
    assert (tuned / "pytorch_model.bin").is_file()
    scored = run_command([sys.executable, str(REPO_ROOT / "run_pretraining_inference.py"), "--input_dir",
                          str(corpus / "p1"), "--ckpt_dir", str(sharded), "--config_file", str(corpus / NO_DROPOUT),
                          "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--eval_batch_size", "8"])
    assert scored.returncode == 0 and f"{sharded / 'ckpt_6.dcp'}: masked-LM accuracy" in scored.stdout, scored.stderr

    (sharded / "ckpt_6.dcp" / "shard-00002-model-00002-of-00002.safetensors").unlink()
    with pytest.raises(InputError, match=r"ckpt_6\.dcp: incomplete sharded checkpoint: "
                                         r"shard-00002-model-00002-of-00002\.safetensors is missing"):
        checkpointing.load_checkpoint(sharded / "ckpt_6.dcp")
    assert checkpointing.newest_good_checkpoint(sharded) == folder


POLICY_PROBE = """
import sys
import torch
import torch.distributed as dist
from bertrecipe.model.families import config_from_json_file, encoder_of, layers_of, pretraining_model
from bertrecipe.training.process_group import init_distributed
from bertrecipe.training.sharding import shard_model

ctx = init_distributed(no_cuda=True)
model = shard_model(pretraining_model(config_from_json_file(sys.argv[1])), ctx, torch.bfloat16)
seen = {}
dense = layers_of(encoder_of(model))[0].intermediate.dense
dense.register_forward_hook(lambda module, args, out: seen.update(weight=module.weight.dtype, out=out.dtype))
ids = torch.randint(5, 100, (2, 16))
outputs = model(ids, torch.zeros_like(ids), torch.ones_like(ids))
(outputs.seq_relationship_logits.float().sum() + outputs.prediction_logits.float().sum()).backward()
gradient = dense.weight.grad
if ctx.is_main:
    print(seen["weight"], seen["out"], dense.weight.dtype, gradient.dtype, gradient.to_local().shape[0])
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_bf16_is_fsdps_mixed_precision_policy_with_fp32_master_weights_and_gradients(corpus, tmp_path):
    """Under --bf16 a layer computes with its weights gathered in bf16, while the shards the optimizer updates and
    their (reduce-scattered) gradients stay fp32, each process holding half of the rows."""
    script = tmp_path / "probe.py"
    script.write_text(POLICY_PROBE)
    result = run_command([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                          str(script), str(corpus / NO_DROPOUT)])
    assert result.returncode == 0, result.stderr[-2000:]
    intermediate = json.loads((corpus / NO_DROPOUT).read_text())["intermediate_size"]
    assert result.stdout.split() == ["torch.bfloat16", "torch.bfloat16", "torch.float32", "torch.float32",
                                     str(intermediate // 2)], result.stdout


@pytest.mark.slow
def test_phase_2_starts_from_a_sharded_phase_1_checkpoint_as_from_ddps(corpus, tmp_path):
    """The phase hand-over reads the folder of shards as it reads a file: phase 2 (longer rows, its own rate, the
    optimizer's step and schedule restarted, the moments kept) after a sharded phase 1 ends where DDP's two phases
    end, and numbers its checkpoints after phase 1's."""
    ends = {}
    for layout in ("ddp", "fsdp"):
        out = tmp_path / layout
        common = ["--train_batch_size", 4, "--log_freq", 1, "--learning_rate", "4e-3", "--sharding", layout]
        pretrain(corpus, out, *common, "--max_steps", 4, "--num_steps_per_checkpoint", 4, config=NO_DROPOUT,
                 nproc=2)
        pretrain(corpus, out, *common, "--max_steps", 2, "--num_steps_per_checkpoint", 2, "--resume_from_checkpoint",
                 "--phase2", "--phase1_end_step", 4, config=NO_DROPOUT, nproc=2, phase=2)
        kinds = {"ddp": ["ckpt_4.pt", "ckpt_6.pt"], "fsdp": ["ckpt_4.dcp", "ckpt_6.dcp"]}[layout]
        assert sorted(p.name for p in out.glob("ckpt_*")) == kinds
        ends[layout] = checkpoint(out, 6)
    assert ends["fsdp"]["phase2"] and ends["fsdp"]["phase_step"] == 2
    a, b = ends["ddp"]["model"], ends["fsdp"]["model"]
    assert max(float((a[k] - b[k]).abs().max()) for k in a) < 1e-6
