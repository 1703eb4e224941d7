"""general_distill.py: a student learns a teacher's states on pre-training shards through run_pretraining's session
(its checks, checkpoints and exact resume); the student's checkpoints are ordinary ones that fine-tuning reads."""
import json
import sys

import h5py
import numpy as np
import pytest
import torch

from bertrecipe.cli import general_distill, run_glue, run_pretraining
from bertrecipe.common.errors import InputError
from bertrecipe.training.metric_logger import read_log
from helpers import REPO_ROOT, TINY_MODERN, in_process, run_command, tiny_sst2

VOCAB, SEQ, PREDS = 128, 16, 3
TEACHER = {"vocab_size": VOCAB, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 4,
           "intermediate_size": 64, "max_position_embeddings": 32, "type_vocab_size": 2, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "attention_probs_dropout_prob": 0.1, "initializer_range": 0.02}
STUDENT = {**TEACHER, "hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 4, "intermediate_size": 32}
BACKBONE = {"distillation": True, "distillation_config": {
    "use_attention_scores": True, "use_hidden_states": True, "use_value_states": True, "use_embedding_states": True,
    "use_pred_states": True, "attention_loss": "kld", "hidden_state_loss": "cosine", "embedding_state_loss": "mse",
    "value_state_loss": "kld", "student_teacher_layer_mapping": "last_layer"}}


def shard_arrays(n=32, seed=0):
    rng = np.random.default_rng(seed)
    segment_ids = np.zeros((n, SEQ), np.int8)
    segment_ids[:, SEQ // 2:] = 1
    return {"input_ids": rng.integers(5, VOCAB, (n, SEQ)).astype(np.int32), "input_mask": np.ones((n, SEQ), np.int8),
            "segment_ids": segment_ids,
            "masked_lm_positions": np.tile(np.arange(1, PREDS + 1, dtype=np.int32), (n, 1)),
            "masked_lm_ids": rng.integers(5, VOCAB, (n, PREDS)).astype(np.int32),
            "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8)}


@pytest.fixture(scope="module")
def teacher_space(tmp_path_factory):
    """Shards, a teacher (our checkpoint after 2 pre-training steps) and the student's config."""
    root = tmp_path_factory.mktemp("distil")
    (root / "data").mkdir()
    for index in range(2):
        with h5py.File(root / "data" / f"tiny_training_{index}.hdf5", "w") as f:
            for key, value in shard_arrays(seed=index).items():
                f.create_dataset(key, data=value)
    (root / "teacher_config.json").write_text(json.dumps(TEACHER))
    (root / "student_config.json").write_text(json.dumps(STUDENT))
    (root / "backbone.json").write_text(json.dumps(BACKBONE))
    run_pretraining.main(["--input_dir", str(root / "data"), "--config_file", str(root / "teacher_config.json"),
                          "--output_dir", str(root / "teacher"), "--max_seq_length", str(SEQ),
                          "--max_predictions_per_seq", str(PREDS), "--train_batch_size", "4", "--max_steps", "2",
                          "--learning_rate", "1e-3", "--do_train", "--disable_progress_bar"])
    return root


def distil_flags(root, out, *extra, config="student_config.json", distill="backbone.json"):
    return ["--input_dir", str(root / "data"), "--teacher_model", str(root / "teacher" / "ckpt_2.pt"),
            "--config_file", str(root / config), "--distill_config", str(root / distill), "--output_dir", str(out),
            "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PREDS), "--train_batch_size", "4",
            "--disable_progress_bar", "--num_steps_per_checkpoint", "2", *map(str, extra)]


def losses(out):
    return [r["data"]["step_loss"] for r in read_log(out / "dllogger.json")
            if isinstance(r.get("step"), list) and r["step"] and "step_loss" in r["data"]]


def test_the_student_learns_the_teachers_states_and_its_checkpoint_is_an_ordinary_one(teacher_space, tmp_path):
    out = tmp_path / "student"
    general_distill.main(distil_flags(teacher_space, out, "--max_steps", 30, "--learning_rate", 3e-3))
    curve = losses(out)
    assert len(curve) == 30 and np.mean(curve[-5:]) < 0.9 * np.mean(curve[:5]), curve
    ckpt = torch.load(out / "ckpt_30.pt", weights_only=True)
    assert ckpt["config"]["hidden_size"] == 16 and ckpt["objective"]["name"] == "general distillation"
    projection = [name for name in ckpt["model"] if name.startswith("distillation.")]
    assert projection and not [name for name in ckpt["model"] if name.startswith("student.")]
    # Fine-tuning takes the student as it takes any checkpoint of ours.
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                               + [f"w{i}" for i in range(VOCAB - 5)]) + "\n")
    data = tiny_sst2(tmp_path / "SST-2")
    done = in_process(run_glue.cli, ["run_glue.py", "--task_name", "sst-2", "--data_dir", data, "--vocab_file", vocab,
                                     "--init_checkpoint", out / "ckpt_30.pt", "--output_dir", tmp_path / "glue",
                                     "--do_train", "--max_steps", "1", "--max_seq_length", "16",
                                     "--train_batch_size", "4", "--disable_progress_bar", "--do_lower_case",
                                     "--allow_vocab_mismatch"])
    assert done.returncode == 0, done.stderr
    assert "distillation" not in done.stderr and "dropped" not in done.stderr, done.stderr


def test_a_student_with_the_teachers_weights_learns_nothing_new(teacher_space, tmp_path):
    """--student_init teacher with the teacher's own shape and the identity layer map: every term is zero (no
    dropout) at the first step."""
    # (soft cross-entropy's lowest value is the teacher's entropy, as TinyBERT defines it: mse on the logits is 0)
    identity = {"distillation": True, "distillation_config": {
        **BACKBONE["distillation_config"], "student_teacher_layer_mapping": "uniform", "pred_loss": "mse"}}
    (tmp_path / "identity.json").write_text(json.dumps(identity))
    out = tmp_path / "same"
    general_distill.main(distil_flags(teacher_space, out, "--max_steps", 1, "--student_init", "teacher",
                                      "--pretrain_dropout", 0, config="teacher_config.json",
                                      distill=tmp_path / "identity.json"))
    assert losses(out) == [pytest.approx(0.0, abs=1e-5)]


def test_a_narrower_student_starts_from_every_other_coordinate_of_the_teachers_last_layer(teacher_space, tmp_path):
    """--student_init teacher for the 1-layer student half the teacher's width: it starts from the teacher's layer 2
    cut to every other coordinate (a learning rate of 1e-12 leaves the start as it was)."""
    out = tmp_path / "narrow"
    general_distill.main(distil_flags(teacher_space, out, "--max_steps", 2, "--student_init", "teacher",
                                      "--learning_rate", 1e-12))
    teacher = torch.load(teacher_space / "teacher" / "ckpt_2.pt", weights_only=True)["model"]
    student = torch.load(out / "ckpt_2.pt", weights_only=True)["model"]
    query = "bert.encoder.layer.{}.attention.self.query.weight"
    assert student[query.format(0)].shape == (16, 16)
    torch.testing.assert_close(student[query.format(0)], teacher[query.format(1)][::2, ::2], rtol=0, atol=1e-6)
    inner = "bert.encoder.layer.{}.intermediate.dense.weight"
    torch.testing.assert_close(student[inner.format(0)], teacher[inner.format(1)][::2, ::2], rtol=0, atol=1e-6)


def test_a_resumed_distillation_ends_bit_for_bit_like_an_uninterrupted_one(teacher_space, tmp_path):
    general_distill.main(distil_flags(teacher_space, tmp_path / "whole", "--max_steps", 6))
    general_distill.main(distil_flags(teacher_space, tmp_path / "cut", "--max_steps", 6, "--steps_this_run", 4))
    general_distill.main(distil_flags(teacher_space, tmp_path / "cut", "--max_steps", 6, "--resume_from_checkpoint"))
    whole, cut = (torch.load(tmp_path / name / "ckpt_6.pt", weights_only=True) for name in ("whole", "cut"))
    for part in ("model", "optimizer"):
        flat_whole, flat_cut = (torch.nn.utils.parameters_to_vector(
            [t.float() for t in _tensors(ckpt[part])]) for ckpt in (whole, cut))
        assert torch.equal(flat_whole, flat_cut), part
    assert losses(tmp_path / "whole")[4:] == losses(tmp_path / "cut")[4:]


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for key in sorted(value, key=str) for t in _tensors(value[key])]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def test_run_pretraining_refuses_to_resume_a_distillation(teacher_space, tmp_path):
    out = tmp_path / "student"
    general_distill.main(distil_flags(teacher_space, out, "--max_steps", 4, "--steps_this_run", 2))
    with pytest.raises(InputError, match=r"ckpt_2.pt: was trained under another objective \(distillation_config"):
        run_pretraining.main(["--input_dir", str(teacher_space / "data"), "--config_file",
                              str(teacher_space / "student_config.json"), "--output_dir", str(out),
                              "--max_seq_length", str(SEQ), "--max_predictions_per_seq", str(PREDS),
                              "--train_batch_size", "4", "--max_steps", "4", "--resume_from_checkpoint", "--do_train",
                              "--disable_progress_bar", "--no_nsp", "--optimizer", "adamw"])


@pytest.mark.parametrize("case, expected", [
    ("vocab", "the teacher's vocab_size is 128 and the student (--config_file) has 64"),
    ("layers", "student_teacher_layer_mapping names teacher layer 5, but the teacher has 2 layers"),
    ("family", "the teacher is of the BERT family and the student (--config_file) of the modern"),
    ("head", "the teacher has no masked-LM head, which the prediction term"),
    ("heads", "are compared head by head, and the student (--config_file) has 2 heads, the teacher 4"),
])
def test_contradicting_inputs_are_one_line_before_anything_is_written(teacher_space, tmp_path, case, expected):
    config, distill, teacher = "student_config.json", "backbone.json", teacher_space / "teacher" / "ckpt_2.pt"
    if case == "vocab":
        (tmp_path / "small_vocab.json").write_text(json.dumps({**STUDENT, "vocab_size": 64}))
        config = tmp_path / "small_vocab.json"
    elif case == "layers":
        mapped = {"distillation": True, "distillation_config": {**BACKBONE["distillation_config"],
                                                                 "student_teacher_layer_mapping": [5]}}
        (tmp_path / "mapped.json").write_text(json.dumps(mapped))
        distill = tmp_path / "mapped.json"
    elif case == "heads":
        (tmp_path / "two_heads.json").write_text(json.dumps({**STUDENT, "num_attention_heads": 2}))
        config = tmp_path / "two_heads.json"
    elif case == "family":
        (tmp_path / "modern.json").write_text(json.dumps({
            "model_type": "modernbert", "vocab_size": VOCAB, "hidden_size": 16, "num_hidden_layers": 1,
            "num_attention_heads": 2, "intermediate_size": 32, "max_position_embeddings": 32}))
        config = tmp_path / "modern.json"
    else:  # a teacher without its masked-LM head, with the prediction term asked for
        bare = {name: value for name, value in torch.load(teacher, weights_only=True)["model"].items()
                if not name.startswith("cls.")}
        teacher = tmp_path / "headless.pt"
        torch.save({"model": bare, "config": TEACHER}, teacher)
    argv = distil_flags(teacher_space, tmp_path / "out", "--max_steps", 2, config=config, distill=distill)
    argv[argv.index("--teacher_model") + 1] = str(teacher)
    result = in_process(general_distill.cli, ["general_distill.py", *argv])
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert expected in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()


def test_nvidias_command_line_runs_as_written(teacher_space, tmp_path):
    """NVIDIA's flags: --student_model a folder with config.json, --do_lower_case, --vocab_file, --steps_per_epoch;
    the root script runs the command."""
    folder = tmp_path / "BERT_1L_16D"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(STUDENT))
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(VOCAB - 5)]))
    argv = distil_flags(teacher_space, tmp_path / "out", "--max_steps", 2, "--steps_per_epoch", 2, "--do_lower_case",
                        "--vocab_file", vocab)
    argv[argv.index("--config_file"):argv.index("--config_file") + 2] = ["--student_model", str(folder)]
    result = in_process(general_distill.cli, [str(REPO_ROOT / "distillation" / "general_distill.py"), *argv])
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "out" / "ckpt_2.pt").is_file()


@pytest.mark.slow
def test_two_processes_distil_as_one_with_the_same_global_batch(teacher_space, tmp_path):
    """DDP (gloo, 2 processes, 2 sequences each) against one process of 4 sequences: the same losses and student,
    the teacher outside DDP and the frozen heads never waited for."""
    general_distill.main(distil_flags(teacher_space, tmp_path / "one", "--max_steps", 4, "--pretrain_dropout", 0))
    argv = distil_flags(teacher_space, tmp_path / "two", "--max_steps", 4, "--pretrain_dropout", 0)
    argv[argv.index("--train_batch_size") + 1] = "2"
    done = run_command([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                        str(REPO_ROOT / "distillation" / "general_distill.py"), *argv])
    assert done.returncode == 0, done.stderr[-3000:]
    assert losses(tmp_path / "two") == pytest.approx(losses(tmp_path / "one"), rel=1e-4)
    one, two = (torch.load(tmp_path / name / "ckpt_4.pt", weights_only=True)["model"] for name in ("one", "two"))
    for name, value in one.items():
        torch.testing.assert_close(two[name], value, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.slow
def test_a_modern_teacher_distils_into_a_modern_student(teacher_space, tmp_path):
    """The modern family (rotary positions, local windows, fused QKV): a 3-layer teacher into a 1-layer student on
    the same shards (masked LM alone, no NSP)."""
    modern = {"model_type": "modernbert", "vocab_size": VOCAB, **TINY_MODERN, "max_position_embeddings": 32}
    (tmp_path / "teacher.json").write_text(json.dumps(modern))
    (tmp_path / "student.json").write_text(json.dumps({**modern, "num_hidden_layers": 1}))
    run_pretraining.main(["--input_dir", str(teacher_space / "data"), "--config_file", str(tmp_path / "teacher.json"),
                          "--output_dir", str(tmp_path / "teacher"), "--max_seq_length", str(SEQ),
                          "--max_predictions_per_seq", str(PREDS), "--train_batch_size", "4", "--max_steps", "2",
                          "--optimizer", "adamw", "--do_train", "--disable_progress_bar"])
    backbone = {"distillation": True, "distillation_config": {**BACKBONE["distillation_config"],
                                                              "use_pred_states": False}}
    (tmp_path / "backbone.json").write_text(json.dumps(backbone))  # NVIDIA's first stage: the states alone
    argv = distil_flags(teacher_space, tmp_path / "student", "--max_steps", 12, "--learning_rate", 3e-3,
                        config=tmp_path / "student.json",
                        distill=tmp_path / "backbone.json")
    argv[argv.index("--teacher_model") + 1] = str(tmp_path / "teacher" / "ckpt_2.pt")
    general_distill.main(argv)
    curve = losses(tmp_path / "student")
    assert len(curve) == 12 and np.mean(curve[-3:]) < 0.8 * np.mean(curve[:3]), curve
    ckpt = torch.load(tmp_path / "student" / "ckpt_12.pt", weights_only=True)
    assert ckpt["config"]["num_hidden_layers"] == 1 and "model.layers.0.attn.Wqkv.weight" in ckpt["model"]


def test_sharding_is_refused_in_one_line(teacher_space, tmp_path):
    argv = distil_flags(teacher_space, tmp_path / "out", "--max_steps", 2, "--sharding", "fsdp")
    result = in_process(general_distill.cli, ["general_distill.py", *argv])
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert "--sharding fsdp: general distillation trains under DDP" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
