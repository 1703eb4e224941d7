"""Fine-tuning and serving the modern family: run_glue.py and run_squad.py start from a ModernBERT folder that
transformers saved; what they save reloads to the same predictions and, converted, gives transformers' logits
(ModernBertForSequenceClassification / ModernBertForQuestionAnswering); the ONNX export of a modern QA model gives
the PyTorch model's logits."""
import json
import sys

import pytest
import torch
import transformers

from bertrecipe.deploy.onnx_export import TritonSignature, export_onnx, onnx_qa_logits, open_qa_session
from bertrecipe.model.weights import export_huggingface, load_weights_into, model_for_weights, read_weights
from helpers import EXCERPT, REPO_ROOT, TEST_DATA, TINY_MODERN, glue, run_command, squad, squad_subset, subset

GLUE_EXCERPTS = TEST_DATA / "glue"


@pytest.fixture(scope="module")
def modern_folder(tiny_bert, tmp_path_factory):
    """A seeded 3-layer ModernBERT (one global, two local layers of window 16) saved by transformers with the
    tiny BERT's WordPiece vocab."""
    vocab = (tiny_bert / "vocab.txt").read_text(encoding="utf-8")
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=len(vocab.splitlines()), bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102,
        **TINY_MODERN)
    folder = tmp_path_factory.mktemp("modern") / "encoder"
    transformers.ModernBertForMaskedLM(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text(vocab, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def squad_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("squad")
    dev = EXCERPT / "dev-v1.1.json"
    return {"train": squad_subset(dev, root / "train.json", ["Jacksonville,_Florida"], 3),
            "predict": squad_subset(dev, root / "predict.json", ["1973_oil_crisis"], 2)}


def their_logits(cls, folder, ids, mask):
    model = cls.from_pretrained(folder, attn_implementation="sdpa").eval()
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=mask)


def saved_model_as_transformers(saved, tmp_path):
    weights = read_weights(saved)
    ours = model_for_weights(weights, weights.config)
    load_weights_into(ours, weights)
    export_huggingface(ours, tmp_path / "as_hf")
    return ours.eval(), tmp_path / "as_hf"


def sample_batch(vocab_size):
    generator = torch.Generator().manual_seed(2)
    ids = torch.randint(1000, vocab_size, (2, 40), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 25:] = 0
    return ids * mask, mask


@pytest.mark.slow
def test_glue_fine_tunes_a_modern_folder_and_saves_what_transformers_reads(modern_folder, tmp_path):
    data = subset(GLUE_EXCERPTS / "STS-B", tmp_path / "STS-B", 40, 40)
    out = tmp_path / "out"
    glue(modern_folder / "vocab.txt", data, out, "--task_name", "sts-b", "--init_checkpoint", str(modern_folder),
         "--do_train", "--do_eval", "--max_seq_length", "64", "--train_batch_size", "16", "--learning_rate", "1e-3",
         "--num_train_epochs", "1", "--eval_batch_size", "64", "--seed", "1")
    scores = [row.split("\t")[1] for row in (out / "eval_predictions.tsv").read_text().splitlines()[1:]]
    assert len(scores) == 40 and len(set(scores)) >= 20
    again = tmp_path / "again"
    glue(modern_folder / "vocab.txt", data, again, "--task_name", "sts-b", "--init_checkpoint",
         str(out / "pytorch_model.bin"), "--mode", "eval", "--max_seq_length", "64", "--eval_batch_size", "64")
    assert (again / "eval_predictions.tsv").read_text() == (out / "eval_predictions.tsv").read_text()
    ours, folder = saved_model_as_transformers(out / "pytorch_model.bin", tmp_path)
    ids, mask = sample_batch(ours.config.vocab_size)
    with torch.no_grad():
        _, logits = ours(ids, attention_mask=mask)
    expected = their_logits(transformers.ModernBertForSequenceClassification, folder, ids, mask).logits
    assert torch.allclose(logits, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_squad_fine_tunes_a_modern_folder_and_its_model_exports_to_transformers_and_onnx(modern_folder,
                                                                                          squad_files, tmp_path):
    out = tmp_path / "out"
    squad(modern_folder / "vocab.txt", out, "--init_checkpoint", str(modern_folder), "--train_file",
          str(squad_files["train"]), "--predict_file", str(squad_files["predict"]), "--do_train", "--do_predict",
          "--train_batch_size", "8", "--max_steps", "3")
    predictions = json.loads((out / "predictions.json").read_text())
    assert predictions and all(isinstance(answer, str) for answer in predictions.values())
    saved = next(p for p in (out / "pytorch_model.bin", out / "model.pt") if p.exists())
    ours, folder = saved_model_as_transformers(saved, tmp_path)
    ids, mask = sample_batch(ours.config.vocab_size)
    with torch.no_grad():
        _, start, end = ours(ids, attention_mask=mask)
    output = their_logits(transformers.ModernBertForQuestionAnswering, folder, ids, mask)
    real = mask.bool()
    assert torch.allclose(start[real], output.start_logits[real], rtol=1e-4, atol=1e-5)
    assert torch.allclose(end[real], output.end_logits[real], rtol=1e-4, atol=1e-5)
    segments = torch.zeros_like(ids)
    export_onnx(TritonSignature(ours), (ids, segments, mask), tmp_path / "model.onnx", "squad", opset=17)
    onnx_start, onnx_end = onnx_qa_logits(open_qa_session(tmp_path / "model.onnx"),
                                     [ids.numpy(), segments.numpy(), mask.numpy()], batch_size=2)
    assert torch.allclose(torch.from_numpy(onnx_start)[real], start[real], rtol=1e-3, atol=1e-4)
    assert torch.allclose(torch.from_numpy(onnx_end)[real], end[real], rtol=1e-3, atol=1e-4)


def test_inference_answers_with_a_modern_checkpoint(modern_folder, tmp_path):
    """A QA folder transformers saved: its head is loaded (no warning of an untrained head) and the answer is a
    span of the context (the logits themselves are checked against transformers in the SQuAD test above)."""
    model = transformers.ModernBertForQuestionAnswering.from_pretrained(modern_folder)
    model.save_pretrained(tmp_path / "qa")
    text = "The quick brown fox jumped over the lazy dog in the garden behind the house."
    context = tmp_path / "article.txt"
    context.write_text(text, encoding="utf-8")
    result = run_command([sys.executable, str(REPO_ROOT / "inference.py"), "--init_checkpoint",
                             str(tmp_path / "qa"), "--vocab_file", str(modern_folder / "vocab.txt"),
                             "--do_lower_case", "--question", "Where did the fox jump?", "--context_file",
                             str(context), "--max_seq_length", "64"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "no QA head" not in result.stderr
    answer = json.loads(result.stdout)["answer"]
    assert answer and answer.lower() in text.lower()
