"""Embedding distillation (distillation/embedding.py, run_retrieval.py --teacher_model): the loss against a hand
computation and sentence-transformers' MSELoss; a student with the teacher's own weights at zero loss; the teacher's
embedding of each distinct text computed once; the student started from the teacher's layers; the command distilling
a student that an ordinary run_retrieval call then reads and scores alike (a projection where the widths differ, saved
as the student's `distillation.` extra); bad input in one line, exit 2, nothing written."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertrecipe.common.errors import InputError
from bertrecipe.distillation.embedding import EmbeddingDistillation, embedding_mse
from bertrecipe.distillation.student import DistillationStudent, Projection
from bertrecipe.finetuning.beir_data import TrainingPairs, read_beir
from bertrecipe.finetuning.embedding import EmbeddingModel, bare_encoder, encode_texts, load_embedding_model
from bertrecipe.finetuning.model_loading import config_and_weights, load_tokenizer
from bertrecipe.finetuning.retrieval_training import pair_batch
from bertrecipe.model.families import config_record
from bertrecipe.model.modern_config import ModernBertConfig
from bertrecipe.model.torch_files import load_torch_file
from bertrecipe.training.stepper import Precision
from helpers import REPO_ROOT, TINY_BERT, run_command, snapshot

FP32 = Precision("cpu")
SEQ = 32
QUERIES = ["who won super bowl 50?", "where was the game played?", "what is packet switching?"]
DOCUMENTS = ["Super Bowl 50 was an American football game.", "Super Bowl 50 was an American football game.",
             "Packet switching is a method of grouping data that is transmitted over a digital network into packets."]


# --- the loss ---------------------------------------------------------------------------------------------------

def test_the_loss_is_the_mean_squared_error_of_the_embeddings_by_hand():
    student = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    teacher = torch.tensor([[0.6, 0.8], [0.0, 1.0]])
    # (0.4² + 0.8² + 0² + 0²) / (2 texts x 2 features)
    assert float(embedding_mse(student, teacher)) == pytest.approx(0.2, abs=1e-7)
    projection = Projection(2, 3)
    with torch.no_grad():
        projection.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
        projection.bias.copy_(torch.tensor([0.0, 0.0, 0.5]))
    # [1, 0] -> [1, 0, 1.5] against [1, 0, 1]: 0.5² / 3; [0, 1] -> [0, 1, 1.5] against [0, 0, 1.5]: 1² / 3
    projected = embedding_mse(student, torch.tensor([[1.0, 0.0, 1.0], [0.0, 0.0, 1.5]]), projection)
    assert float(projected) == pytest.approx((0.25 + 1.0) / 6, abs=1e-7)


def test_embeddings_of_other_widths_without_a_projection_are_one_line():
    with pytest.raises(InputError) as refused:
        embedding_mse(torch.zeros(2, 4), torch.zeros(2, 8))
    message = str(refused.value)
    assert "4 wide" in message and "8" in message and "Projection(4, 8)" in message and "\n" not in message


@pytest.mark.slow  # importing sentence-transformers takes seconds
def test_the_loss_is_sentence_transformers_mse_loss_on_the_same_embeddings():
    """Their MSELoss averages a per-column MSE (queries, positives, negatives); ours the texts of the batch together:
    the same value where every column has the batch's rows."""
    from sentence_transformers.sentence_transformer.losses import MSELoss

    generator = torch.Generator().manual_seed(0)
    unit = [torch.nn.functional.normalize(torch.randn(5, 8, generator=generator), dim=1) for _ in range(6)]
    students, teachers = unit[:3], unit[3:]
    theirs = MSELoss(model=torch.nn.Identity()).compute_loss_from_embeddings(students, teachers)
    ours = embedding_mse(torch.cat(students), torch.cat(teachers))
    assert float(ours) == pytest.approx(float(theirs), rel=1e-6)


# --- the objective ----------------------------------------------------------------------------------------------

def embedding_folder(tiny_bert: Path, folder: Path, **config_changes) -> Path:
    """The tiny 2-layer BERT (a transformers folder) as an embedding model's folder, its config changed."""
    for name in ("model.safetensors", "vocab.txt"):
        shutil.copy(tiny_bert / name, folder / name)
    config = json.loads((tiny_bert / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **config_changes}))
    return folder


@pytest.fixture(scope="module")
def teacher(tiny_bert, tmp_path_factory):
    return embedding_folder(tiny_bert, tmp_path_factory.mktemp("teacher"))


@pytest.fixture(scope="module")
def quiet_teacher(tiny_bert, tmp_path_factory):
    """The teacher without dropout: trained on itself, the student gives the teacher's embeddings exactly."""
    return embedding_folder(tiny_bert, tmp_path_factory.mktemp("quiet_teacher"), hidden_dropout_prob=0.0,
                            attention_probs_dropout_prob=0.0)


def embedding_model(folder: Path, tokenizer):
    config, weights = config_and_weights(None, str(folder))
    return load_embedding_model(config, weights, str(folder), tokenizer, SEQ, "mean")


def ready(teacher_folder: Path, student=None, student_layers: int = 1):
    """(objective checked, student as trained, tokenizer, the batch of QUERIES -> DOCUMENTS)."""
    tokenizer = load_tokenizer(teacher_folder / "vocab.txt", True)
    objective = EmbeddingDistillation(str(teacher_folder), "mean")
    if student is None:
        config, weights, source = objective.student_start(student_layers)
        student = load_embedding_model(config, weights, source, tokenizer, SEQ, "mean")
    objective.check(student, tokenizer, SEQ, False)
    arrays = objective.arrays(tokenizer, TrainingPairs(QUERIES, DOCUMENTS), SEQ)
    trained = objective.trainable(student).eval()
    return objective, trained, tokenizer, pair_batch(arrays, np.arange(len(QUERIES)), torch.device("cpu"))


def test_a_student_with_the_teacher_s_own_weights_has_zero_loss(teacher):
    tokenizer = load_tokenizer(teacher / "vocab.txt", True)
    objective, trained, _, batch = ready(teacher, student=embedding_model(teacher, tokenizer))
    assert float(objective.loss()(trained, batch)) < 1e-12
    _, student, _, batch = ready(teacher)  # a student of one of its two layers is not the teacher
    assert float(objective.loss()(student, batch)) > 1e-6


def modern_student(vocab_size: int) -> EmbeddingModel:
    """A random one-layer ModernBERT of the teacher's vocab and width: the other family, for a BERT teacher."""
    torch.manual_seed(3)
    config = ModernBertConfig(vocab_size=vocab_size, hidden_size=TINY_BERT["hidden_size"], num_hidden_layers=1,
                              num_attention_heads=2, intermediate_size=48, max_position_embeddings=64, pad_token_id=0)
    return EmbeddingModel(bare_encoder(config), "mean")


@pytest.mark.parametrize("student_kind", ["the teacher's layer", "another family"])
def test_the_objective_s_loss_is_the_mse_of_each_text_s_embeddings_and_the_teacher_runs_once_a_text(
        teacher, student_kind):
    """Against the student's and the teacher's plain passes over every text; the teacher embeds each distinct text
    once (the documents hold one twice), and a batch it has seen costs it nothing. Only the embeddings are compared,
    so a student of the other family distils from the teacher alike."""
    vocab_size = json.loads((teacher / "config.json").read_text())["vocab_size"]
    student = modern_student(vocab_size) if student_kind == "another family" else None
    objective, student, tokenizer, batch = ready(teacher, student=student)
    encoded = {name: encode_texts(model, tokenizer, QUERIES + DOCUMENTS, SEQ, 8, FP32)
               for name, model in (("student", student), ("teacher", objective.teacher))}
    expected = ((encoded["student"] - encoded["teacher"]) ** 2).mean()
    seen = []
    objective.teacher.register_forward_pre_hook(lambda _module, inputs: seen.append(len(inputs[0])))
    loss = objective.loss()
    assert float(loss(student, batch)) == pytest.approx(float(expected), rel=1e-5)
    assert sum(seen) == len(set(QUERIES + DOCUMENTS)) == 5
    seen.clear()
    assert float(loss(student, batch)) == pytest.approx(float(expected), rel=1e-5)
    assert seen == []


def test_a_student_starts_from_the_teacher_s_layers(teacher):
    """--student_layers 1 of a 2-layer teacher: its second layer (the uniform choice, every other layer), the
    teacher's embeddings, the teacher's config otherwise."""
    objective = EmbeddingDistillation(str(teacher), "mean")
    config, weights, source = objective.student_start(1)
    assert config.num_hidden_layers == 1 and config.hidden_size == TINY_BERT["hidden_size"]
    assert source == f"{teacher} (its layer 2)"
    teacher_state = objective.weights.state_dict
    for name, tensor in weights.state_dict.items():
        twin = name.replace("encoder.layer.0.", "encoder.layer.1.")
        assert torch.equal(tensor, teacher_state[twin]), name
    with pytest.raises(InputError, match=r"^--student_layers 3: the teacher .* has 2 layers"):
        objective.student_start(3)


def test_a_distilled_student_s_config_names_the_student_s_class():
    """A DistillationStudent wrapping a model records the model's own class (transformers' name), not the wrapper's:
    the modern family's readers tell heads apart by it."""
    from bertrecipe.model.modern import ModernBertForQuestionAnswering

    config = ModernBertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=32, max_position_embeddings=64)
    wrapped = DistillationStudent(ModernBertForQuestionAnswering(config), Projection(16, 32))
    assert config_record(wrapped, config)["architectures"] == ["ModernBertForQuestionAnswering"]


# --- the command ------------------------------------------------------------------------------------------------

def command(*flags) -> list:
    return [sys.executable, REPO_ROOT / "run_retrieval.py", *flags]


def distil(teacher_folder: Path, squad: Path, out: Path, *extra) -> subprocess.CompletedProcess:
    return run_command(command(
        "--teacher_model", teacher_folder, "--vocab_file", teacher_folder / "vocab.txt", "--do_lower_case",
        "--data_dir", squad / "test", "--do_train", "--train_file", squad / "train" / "qrels" / "train.tsv",
        "--max_seq_length", SEQ, "--train_batch_size", "4", "--output_dir", out, "--disable_progress_bar", *extra))


def score(checkpoint: Path, vocab: Path, squad: Path, out: Path) -> dict:
    done = run_command(command("--init_checkpoint", checkpoint, "--vocab_file", vocab, "--do_lower_case",
                               "--data_dir", squad / "test", "--max_seq_length", SEQ, "--do_eval", "--output_dir", out))
    assert done.returncode == 0, done.stderr
    return json.loads((out / "results.json").read_text())


def distance_to_teacher(student: Path, teacher_folder: Path, texts: list[str]) -> float:
    """The mean squared difference of the two models' embeddings of the texts."""
    tokenizer = load_tokenizer(teacher_folder / "vocab.txt", True)
    model = embedding_model(student, tokenizer)
    ours = encode_texts(model, tokenizer, texts, SEQ, 16, FP32)
    theirs = encode_texts(embedding_model(teacher_folder, tokenizer), tokenizer, texts, SEQ, 16, FP32)
    return float(((ours - theirs) ** 2).mean())


@pytest.mark.slow
def test_the_command_distils_a_student_of_the_teacher_s_layers_that_an_ordinary_run_scores_alike(
        teacher, squad_beir, tmp_path):
    out = tmp_path / "student"
    done = distil(teacher, squad_beir, out, "--student_layers", "1", "--max_steps", "3", "--do_eval")
    assert done.returncode == 0, done.stderr
    results = json.loads((out / "results.json").read_text())
    assert results["objective"] == "embedding distillation" and results["teacher"] == str(teacher)
    assert results["teacher_pooling"] == "mean" and results["projection"] is False
    assert results["checkpoint"] == f"{teacher} (its layer 2)" and results["train_steps"] == 3
    assert json.loads((out / "bert_config.json").read_text())["num_hidden_layers"] == 1
    again = score(out / "pytorch_model.bin", teacher / "vocab.txt", squad_beir, tmp_path / "again")
    assert again["ndcg@10"] == results["ndcg@10"] and again["mrr@10"] == results["mrr@10"]


def random_student(folder: Path, teacher_folder: Path, seed: int, **config) -> Path:
    """A seeded random BERT of the teacher's vocab saved by transformers (TINY_BERT's shape, changed by `config`)."""
    import transformers

    vocab_size = json.loads((teacher_folder / "config.json").read_text())["vocab_size"]
    torch.manual_seed(seed)
    model_config = transformers.BertConfig(vocab_size=vocab_size, **{**TINY_BERT, **config})
    transformers.BertModel(model_config, add_pooling_layer=False).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_random_student_comes_nearer_the_teacher_on_texts_it_never_saw(teacher, squad_beir, tmp_path):
    student = random_student(tmp_path / "random", teacher, seed=2, num_hidden_layers=1)
    done = distil(teacher, squad_beir, tmp_path / "out", "--init_checkpoint", student, "--max_steps", "8",
                  "--learning_rate", "1e-3")
    assert done.returncode == 0, done.stderr
    test = read_beir(squad_beir / "test")
    texts = test.corpus_texts + test.query_texts
    before = distance_to_teacher(student, teacher, texts)
    after = distance_to_teacher(tmp_path / "out" / "pytorch_model.bin", teacher, texts)
    assert after < 0.75 * before, (before, after)  # 0.060 -> 0.033 when written


@pytest.mark.slow
def test_a_narrower_student_learns_through_a_projection_saved_as_its_distillation_extra(
        teacher, squad_beir, tmp_path):
    narrow = random_student(tmp_path / "narrow", teacher, seed=1, hidden_size=16, num_hidden_layers=1)
    done = distil(teacher, squad_beir, tmp_path / "out", "--init_checkpoint", narrow, "--max_steps", "2", "--do_eval")
    assert done.returncode == 0, done.stderr
    results = json.loads((tmp_path / "out" / "results.json").read_text())
    assert results["projection"] is True
    state = load_torch_file(tmp_path / "out" / "pytorch_model.bin")["model"]
    assert state["distillation.projection.weight"].shape == (32, 16)
    assert state["distillation.projection.bias"].shape == (32,)
    again = score(tmp_path / "out", teacher / "vocab.txt", squad_beir, tmp_path / "again")  # the extra dropped
    assert again["ndcg@10"] == results["ndcg@10"]


def test_the_teacher_distilled_into_itself_ends_its_step_at_zero_loss(quiet_teacher, squad_beir, tmp_path):
    done = distil(quiet_teacher, squad_beir, tmp_path / "out", "--init_checkpoint", quiet_teacher, "--max_steps", "1",
                  "--do_eval")
    assert done.returncode == 0, done.stderr
    assert json.loads((tmp_path / "out" / "results.json").read_text())["final_loss"] < 1e-12


def refused_flags(case: str, teacher: Path, other: Path, squad: Path, out: Path) -> list:
    """run_retrieval's flags that distil `other` into `teacher`'s weights, changed as the case says."""
    flags = {"--init_checkpoint": teacher, "--vocab_file": teacher / "vocab.txt", "--data_dir": squad / "test",
             "--train_file": squad / "pairs.jsonl", "--teacher_model": other, "--max_seq_length": SEQ,
             "--output_dir": out}
    switches = ["--do_lower_case", "--do_train", "--do_eval"]
    if case == "no training":
        switches.remove("--do_train")
    elif case == "symmetric loss":
        switches.append("--symmetric_loss")
    elif case == "too many layers":
        del flags["--init_checkpoint"]
        flags["--student_layers"] = 5
    elif case == "layers and a checkpoint":
        flags["--student_layers"] = 1
    elif case == "teacher pooling alone":
        del flags["--teacher_model"]
        flags["--teacher_pooling"] = "cls"
    elif case == "output is the teacher":
        flags["--output_dir"] = other
    elif case == "no teacher":
        flags["--teacher_model"] = other.parent / "no_such_teacher"
    return [*(str(part) for pair in flags.items() for part in pair), *switches]


REFUSED = {"vocab size": "teacher and student share one vocabulary", "other vocab": "is not the one of",
           "no training": "--teacher_model distils during --do_train", "symmetric loss": "--symmetric_loss",
           "too many layers": "--student_layers 5: the teacher", "layers and a checkpoint": "--student_layers",
           "teacher pooling alone": "--teacher_pooling", "output is the teacher": "--output_dir",
           "no teacher": "no_such_teacher"}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_bad_input_is_one_line_exit_2_and_nothing_written(teacher, squad_beir, tmp_path, case):
    other = shutil.copytree(teacher, tmp_path / "other_teacher")
    if case == "vocab size":
        config = json.loads((other / "config.json").read_text())
        (other / "config.json").write_text(json.dumps({**config, "vocab_size": config["vocab_size"] + 8}))
    elif case == "other vocab":  # the same size, two tokens swapped: the same ids stand for other words
        vocab = (teacher / "vocab.txt").read_text(encoding="utf-8").splitlines()
        vocab[-1], vocab[-2] = vocab[-2], vocab[-1]
        (other / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    before = snapshot(tmp_path)
    result = run_command(command(*refused_flags(case, teacher, other, squad_beir, tmp_path / "out")))
    assert result.returncode == 2 and REFUSED[case] in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert snapshot(tmp_path) == before and not (tmp_path / "out").exists()
