"""task_distill.py: a student learns a fine-tuned teacher's states (backbone stage), then its predictions (heads
stage), through run_glue.py's or run_squad.py's run; what it writes is an ordinary fine-tuned checkpoint."""
import json
import shutil
import sys

import pytest
import torch
import transformers

from bertrecipe.cli import inference, run_glue, run_squad, task_distill
from bertrecipe.cli import triton_deployer as deployer
from bertrecipe.model.bert import BertConfig, BertForSequenceClassification
from helpers import (
    CONTEXT,
    QUESTIONS,
    REPO_ROOT,
    in_process,
    run_command,
    tiny_model_files,
    tiny_squad_file,
    tiny_sst2,
)

DISTILLATION = REPO_ROOT / "distillation"
STUDENT = {"hidden_size": 8, "num_attention_heads": 2, "intermediate_size": 16}


@pytest.fixture(scope="module")
def glue_teacher(tmp_path_factory):
    """A one-layer BERT fine-tuned on a tiny SST-2 (run_glue's output folder), and a student config half as wide
    with the same heads."""
    root = tmp_path_factory.mktemp("task")
    vocab, config = tiny_model_files(root / "model")
    data = tiny_sst2(root / "SST-2", train_rows=16, dev_rows=8)
    done = in_process(run_glue.cli, ["run_glue.py", "--task_name", "sst-2", "--data_dir", data, "--vocab_file",
                                     vocab, "--config_file", config, "--output_dir", root / "teacher", "--do_train",
                                     "--max_steps", "20", "--learning_rate", "1e-2", "--max_seq_length", "16",
                                     "--train_batch_size", "4", "--do_lower_case", "--disable_progress_bar"])
    assert done.returncode == 0, done.stderr
    student = root / "student_config.json"
    student.write_text(json.dumps({**json.loads(config.read_text()), **STUDENT}))
    return root


def distil(root, out, stage, student, *extra, data=None, task="SST-2"):
    """task_distill.py on the tiny SST-2 with NVIDIA's config of `stage` (backbone, heads) or the file `stage`."""
    config = DISTILLATION / f"distillation_config_{stage}.json" if isinstance(stage, str) else stage
    return in_process(task_distill.cli, [
        "task_distill.py", "--teacher_model", root / "teacher", "--student_model", student, "--data_dir",
        data or root / "SST-2", "--task_name", task, "--output_dir", out, "--distill_config", config,
        "--max_seq_length", "16", "--train_batch_size", "4", "--learning_rate", "1e-2", "--do_lower_case",
        "--disable_progress_bar", "--vocab_file", root / "model" / "vocab.txt", *map(str, extra)])


def test_backbone_then_heads_make_an_ordinary_fine_tuned_student(glue_teacher, tmp_path):
    """NVIDIA's two stages: the backbone stage starts a fresh student (its config), the heads stage continues it;
    each writes run_glue's outputs, the dev set scored, and inference takes the student as any model."""
    fresh = tmp_path / "BERT_1L_8D"  # a folder holding only the student's config: it starts at random
    fresh.mkdir()
    shutil.copy(glue_teacher / "student_config.json", fresh / "config.json")
    backbone = distil(glue_teacher, tmp_path / "backbone", "backbone", fresh, "--max_steps", 10)
    assert backbone.returncode == 0, backbone.stderr
    heads = distil(glue_teacher, tmp_path / "heads", "heads", tmp_path / "backbone", "--max_steps", 10)
    assert heads.returncode == 0, heads.stderr
    results = json.loads((tmp_path / "heads" / "results.json").read_text())
    assert 0 <= results["eval_acc"] <= 1 and results["train_steps"] == 10
    stages = [torch.load(tmp_path / stage / "pytorch_model.bin", weights_only=True)["model"]
              for stage in ("backbone", "heads")]
    assert all(weights["bert.embeddings.word_embeddings.weight"].shape[1] == 8 for weights in stages)  # the student
    # 8 -> 16 wide: the backbone stage trained a projection (kept as an extra); the heads stage compares logits only
    assert [any(name.startswith("distillation.") for name in weights) for weights in stages] == [True, False]
    again = in_process(run_glue.cli, ["run_glue.py", "--task_name", "sst-2", "--data_dir", glue_teacher / "SST-2",
                                      "--vocab_file", glue_teacher / "model" / "vocab.txt", "--init_checkpoint",
                                      tmp_path / "heads", "--output_dir", tmp_path / "eval", "--do_eval",
                                      "--max_seq_length", "16", "--do_lower_case"])
    assert again.returncode == 0 and "distillation" not in again.stderr, again.stderr
    assert json.loads((tmp_path / "eval" / "results.json").read_text())["eval_acc"] == results["eval_acc"]


def test_the_heads_stage_brings_the_students_logits_to_the_teachers(glue_teacher, tmp_path):
    """With the logits' squared error as the prediction loss (soft cross-entropy's floor is the teacher's
    entropy), a fresh student's distance to the teacher's logits falls to a fraction of where it began."""
    heads = json.loads((DISTILLATION / "distillation_config_heads.json").read_text())
    heads["distillation_config"]["pred_loss"] = "mse"
    (tmp_path / "heads_mse.json").write_text(json.dumps(heads))
    folder = tmp_path / "BERT_1L_8D"
    folder.mkdir()
    shutil.copy(glue_teacher / "student_config.json", folder / "config.json")
    done = distil(glue_teacher, tmp_path / "heads", tmp_path / "heads_mse.json", folder, "--max_steps", 40,
                  "--log_freq", 1, "--json-summary", tmp_path / "log_mse.json")
    assert done.returncode == 0, done.stderr
    log = [json.loads(line[5:]) for line in (tmp_path / "log_mse.json").read_text().splitlines()
           if line.startswith("DLLL ")]
    curve = [r["data"]["step_loss"] for r in log if isinstance(r.get("step"), list) and "step_loss" in r["data"]]
    assert len(curve) == 40 and sum(curve[-5:]) < 0.3 * sum(curve[:5]), curve


def test_the_augmented_training_set_is_read_with_aug_train(glue_teacher, tmp_path):
    data = tmp_path / "SST-2"
    shutil.copytree(glue_teacher / "SST-2", data)
    missing = distil(glue_teacher, tmp_path / "out", "backbone", glue_teacher / "teacher", "--aug_train",
                     "--max_steps", 2, data=data)
    assert missing.returncode == 2 and "train_aug.tsv" in missing.stderr and not (tmp_path / "out").exists()
    rows = (data / "train.tsv").read_text().splitlines()
    (data / "train_aug.tsv").write_text("\n".join(rows + rows[1:]) + "\n")  # the originals and one copy of each
    done = distil(glue_teacher, tmp_path / "out", "backbone", glue_teacher / "teacher", "--aug_train", "--max_steps",
                  2, data=data)
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "results.json").read_text())["train_examples"] == 2 * (len(rows) - 1)


@pytest.mark.parametrize("case, expected", [
    ("headless", "the teacher has no head for this task"),
    ("vocab", "pass the vocab the teacher was fine-tuned with"),
    ("heads", "are compared head by head, and the student has 1 heads, the teacher 2"),
])
def test_a_teacher_that_cannot_teach_this_student_is_one_line_before_anything_is_written(glue_teacher, tmp_path,
                                                                                        case, expected):
    teacher, student = glue_teacher / "teacher", glue_teacher / "teacher"
    extra = ["--vocab_file", glue_teacher / "model" / "vocab.txt"]
    if case == "headless":  # a pre-trained model: no classifier
        saved = torch.load(teacher / "pytorch_model.bin", weights_only=True)
        weights = saved.get("model", saved)
        headless = tmp_path / "headless"
        headless.mkdir()
        torch.save({**saved, "model": {k: v for k, v in weights.items() if not k.startswith("classifier.")}}
                   if "model" in saved else {k: v for k, v in weights.items() if not k.startswith("classifier.")},
                   headless / "pytorch_model.bin")
        for name in ("bert_config.json", "config.json", "vocab.txt"):
            if (teacher / name).exists():
                shutil.copy(teacher / name, headless / name)
        teacher = headless
    elif case == "vocab":
        other = tmp_path / "vocab.txt"
        other.write_text((glue_teacher / "model" / "vocab.txt").read_text().replace("movie", "cinema"))
        extra = ["--vocab_file", other]
    else:
        config = tmp_path / "one_head.json"
        config.write_text(json.dumps({**json.loads((glue_teacher / "student_config.json").read_text()),
                                      "num_attention_heads": 1}))
        extra += ["--student_config_file", config]
    argv = ["task_distill.py", "--teacher_model", teacher, "--student_model", student, "--data_dir",
            glue_teacher / "SST-2", "--task_name", "SST-2", "--output_dir", tmp_path / "out", "--distill_config",
            DISTILLATION / "distillation_config_backbone.json", "--max_seq_length", "16", "--do_lower_case", *extra]
    result = in_process(task_distill.cli, argv)
    assert result.returncode == 2 and len(result.stderr.splitlines()) == 1, result.stderr
    assert expected in result.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_squad_distillation_writes_a_student_that_answers(glue_teacher, tmp_path):
    """SQuAD v1.1: a teacher fine-tuned by run_squad.py, the student distilled on its states then its start and end
    logits (each a distribution over the window's tokens); the student answers through inference.py."""
    data = tmp_path / "squad"
    data.mkdir()
    for name in ("train-v1.1.json", "dev-v1.1.json"):
        tiny_squad_file(data / name, QUESTIONS)
    vocab, config = glue_teacher / "model" / "vocab.txt", glue_teacher / "model" / "bert_config.json"
    teacher = in_process(run_squad.cli, ["run_squad.py", "--train_file", data / "train-v1.1.json", "--predict_file",
                                         data / "dev-v1.1.json", "--vocab_file", vocab, "--config_file", config,
                                         "--output_dir", tmp_path / "teacher", "--do_train", "--max_steps", "5",
                                         "--max_seq_length", "32", "--doc_stride", "8", "--max_query_length", "8",
                                         "--do_lower_case", "--disable_progress_bar"])
    assert teacher.returncode == 0, teacher.stderr
    for stage, student, out in (("backbone", tmp_path / "teacher", "backbone"),
                                ("heads", tmp_path / "backbone", "heads")):
        done = in_process(task_distill.cli, [
            "task_distill.py", "--teacher_model", tmp_path / "teacher", "--student_model", student, "--data_dir", data,
            "--task_name", "SQuADv1.1", "--output_dir", tmp_path / out, "--distill_config",
            DISTILLATION / f"distillation_config_{stage}.json", "--max_seq_length", "32", "--train_batch_size", "2",
            "--max_steps", "3", "--do_lower_case", "--disable_progress_bar", "--vocab_file", vocab, "--doc_stride",
            "8", "--max_query_length", "8"])
        assert done.returncode == 0, done.stderr
        assert (tmp_path / out / "predictions.json").is_file()
    answered = in_process(inference.cli, ["inference.py", "--init_checkpoint", tmp_path / "heads", "--vocab_file",
                                          vocab, "--do_lower_case", "--context", CONTEXT, "--question",
                                          "the movie was", "--max_seq_length", "32"])
    assert answered.returncode == 0 and "distillation" not in answered.stderr, answered.stderr


def test_a_student_started_from_the_teachers_layers_begins_where_the_teacher_is(glue_teacher, tmp_path):
    """--student_init teacher with a config-only folder of the teacher's own shape: the student is the teacher (its
    embeddings, layers and task head), as a step of a vanishing rate leaves it."""
    folder = tmp_path / "same_shape"
    folder.mkdir()
    shutil.copy(glue_teacher / "model" / "bert_config.json", folder / "config.json")
    done = distil(glue_teacher, tmp_path / "out", "heads", folder, "--student_init", "teacher", "--learning_rate",
                  1e-12, "--max_steps", 1)
    assert done.returncode == 0, done.stderr
    student = torch.load(tmp_path / "out" / "pytorch_model.bin", weights_only=True)["model"]
    teacher = torch.load(glue_teacher / "teacher" / "pytorch_model.bin", weights_only=True)["model"]
    assert student.keys() == teacher.keys()
    for name, value in teacher.items():
        torch.testing.assert_close(student[name], value, rtol=0, atol=1e-6, msg=name)


def test_a_distilled_student_with_its_projection_converts_and_deploys_as_any_model(glue_teacher, tmp_path):
    """The backbone stage's output carries the projection as a `distillation.` extra: the converter writes a
    transformers folder that BertForSequenceClassification loads with the student's own logits (transformers is the
    oracle), and the Triton deployer exports it (its ONNX graph checked against PyTorch before it is written)."""
    fresh = tmp_path / "BERT_1L_8D"
    fresh.mkdir()
    shutil.copy(glue_teacher / "student_config.json", fresh / "config.json")
    done = distil(glue_teacher, tmp_path / "backbone", "backbone", fresh, "--max_steps", 4)
    assert done.returncode == 0, done.stderr
    checkpoint = tmp_path / "backbone" / "pytorch_model.bin"
    state = torch.load(checkpoint, weights_only=True)["model"]
    assert any(name.startswith("distillation.") for name in state)
    vocab = glue_teacher / "model" / "vocab.txt"
    converted = run_command([sys.executable, REPO_ROOT / "scripts" / "convert_checkpoint.py", checkpoint,
                             tmp_path / "hf", "--vocab_file", vocab, "--do_lower_case"])
    assert converted.returncode == 0, converted.stderr
    theirs = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    config = BertConfig.from_dict(json.loads((tmp_path / "backbone" / "bert_config.json").read_text()))
    ours = BertForSequenceClassification(config, 2).eval()
    ours.load_state_dict({k: v for k, v in state.items() if not k.startswith("distillation.")})
    ids = torch.randint(5, config.vocab_size, (3, 10))
    with torch.no_grad():
        assert torch.allclose(theirs(input_ids=ids).logits, ours(ids)[1], atol=1e-5)
    repository = tmp_path / "repository"
    deployer.main(["--init_checkpoint", str(checkpoint), "--vocab_file", str(vocab), "--do_lower_case", "--task",
                   "glue", "--max_seq_length", "16", "--model_repository", str(repository), "--model_name", "sst2"])
    assert (repository / "sst2" / "1" / "model.onnx").is_file()
