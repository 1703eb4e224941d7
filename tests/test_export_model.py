"""scripts/export_model.py: each kind of checkpoint released as a folder that the real libraries load with no code of
ours and no missing or unused weight (transformers' loading info is the oracle), giving our outputs: logits of every
head (fp32, 1e-5), pipeline("fill-mask")'s top-5, SentenceTransformer's embeddings (cosine >= 0.9999), ONNX Runtime
(1e-4); the card's metadata parses and states only recorded facts; results of another checkpoint are refused; the
folder is written whole or not at all."""
import json
import sys

import numpy as np
import pytest
import torch
import yaml

from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.model.weights import load_weights_into, model_for_weights, read_weights
from bertrecipe.release.model_files import release_kind
from bertrecipe.release.signature import ReleaseSignature
from helpers import (
    REPO_ROOT,
    VOCAB_EXCERPT,
    glue,
    pretrain,
    run_command,
    snapshot,
    squad,
    tiny_modern_folder,
    tiny_sst2,
)

TEXTS = ["the movie was good", "a very awful film about the plot", "i liked it"]


def export(src, out, *flags, vocab=None):
    return run_command([sys.executable, REPO_ROOT / "scripts" / "export_model.py", src, out,
                        *(["--vocab_file", vocab] if vocab else []), *map(str, flags)])


def exported(src, out, *flags, vocab=None):
    result = export(src, out, *flags, vocab=vocab)
    assert result.returncode == 0, result.stderr
    return out


def loads_cleanly(model_class, folder):
    """transformers' model of the folder, after checking that it found every weight it has and used every one."""
    model, info = model_class.from_pretrained(folder, output_loading_info=True)
    assert not any(info[key] for key in ("missing_keys", "unexpected_keys", "mismatched_keys")), info
    return model.eval()


def ours(src, folder_kind_flags=()):
    """Our model of the checkpoint and its release kind, called as the release's class."""
    weights = read_weights(src)
    model = model_for_weights(weights, weights.config)
    load_weights_into(model, weights, src)
    embedding = "--embedding" in folder_kind_flags
    kind = release_kind(model.eval(), None if not src.is_file() else torch.load(src, weights_only=True).get("task"),
                        embedding, "mean" if embedding else None, 32 if embedding else None)
    return ReleaseSignature(model, kind)


def encoded(folder, texts=TEXTS, pair=False):
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    return tokenizer(*([texts, texts[::-1]] if pair else [texts]), padding=True, return_tensors="pt")


def our_call(signature, batch):
    args = [batch["input_ids"], batch["attention_mask"]]
    if "token_type_ids" in batch and not signature.modern:
        args.append(batch["token_type_ids"])
    with torch.no_grad():
        return signature(*args)


def onnx_outputs(path, batch):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {node.name: batch[node.name].numpy() for node in session.get_inputs()}
    return session.run(None, feed)


@pytest.fixture(scope="module")
def pretrained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("pretrained")
    pretrain(corpus, out, "--train_batch_size", 8, "--max_steps", 2)
    return out / "ckpt_2.pt"


@pytest.mark.slow
def test_a_pretrained_bert_is_a_masked_lm_for_transformers_pipeline_and_onnx_runtime(pretrained, tmp_path):
    import transformers

    folder = exported(pretrained, tmp_path / "release", "--onnx", "--int8", "--license", "apache-2.0",
                      "--language", "en", vocab=VOCAB_EXCERPT)
    theirs = loads_cleanly(transformers.AutoModelForMaskedLM, folder)
    mine = ours(pretrained)
    batch = encoded(folder)
    with torch.no_grad():
        logits = theirs(**batch).logits
    (expected,) = our_call(mine, batch)
    real = batch["attention_mask"].bool()  # padded positions predict nothing (ours skips them)
    assert (logits - expected)[real].abs().max() < 1e-5
    # fill-mask: the pipeline's top-5 are the five highest of our logits at the blank
    text = "the man went to the [MASK] ."
    found = transformers.pipeline("fill-mask", model=folder)(text)
    blank = encoded(folder, [text])
    (ours_at_blank,) = our_call(mine, blank)
    position = int((blank["input_ids"][0] == 103).nonzero()[0])
    assert [row["token"] for row in found] == ours_at_blank[0, position].topk(5).indices.tolist()
    # ONNX Runtime, fp32 within 1e-4; the int8 twin runs and keeps the ranking's head
    (onnx_logits,) = onnx_outputs(folder / "onnx" / "model.onnx", batch)
    assert np.abs(onnx_logits - expected.numpy())[real.numpy()].max() < 1e-4
    (int8_logits,) = onnx_outputs(folder / "onnx" / "model_quantized.onnx", batch)
    assert int8_logits.shape == onnx_logits.shape
    # the next-sentence head and pooler, which BertForMaskedLM has not, are kept beside it
    from safetensors.torch import load_file

    side = load_file(folder / "nsp_head.safetensors")
    assert set(side) == {"bert.pooler.dense.weight", "bert.pooler.dense.bias", "cls.seq_relationship.weight",
                         "cls.seq_relationship.bias"}
    pretraining = transformers.BertForPreTraining.from_pretrained(folder)
    pretraining.load_state_dict(side, strict=False)
    state = torch.load(pretrained, weights_only=True)["model"]
    assert torch.equal(pretraining.cls.seq_relationship.weight, state["cls.seq_relationship.weight"])


@pytest.mark.slow
def test_the_card_states_the_checkpoint_s_records_and_the_given_metadata_only(pretrained, tmp_path):
    folder = exported(pretrained, tmp_path / "release", "--license", "apache-2.0", "--language", "en",
                      "--datasets", "wikipedia", vocab=VOCAB_EXCERPT)
    text = (folder / "README.md").read_text(encoding="utf-8")
    front, body = text.split("---\n")[1], text.split("---\n", 2)[2]
    meta = yaml.safe_load(front)
    assert meta["library_name"] == "transformers" and meta["pipeline_tag"] == "fill-mask"
    assert meta["license"] == "apache-2.0" and meta["language"] == ["en"] and meta["datasets"] == ["wikipedia"]
    assert "model-index" not in meta and "base_model" not in meta  # nothing measured, nothing given
    record = torch.load(pretrained, weights_only=True)
    assert "| optimizer steps | 2 |" in body and f"| tokens seen | {record['tokens']:,} |" in body
    hardware = record["hardware"]
    assert f"| hardware | 1 x {hardware['device']}, fp32, torch {torch.__version__} |" in body
    assert "No results file of this checkpoint was given" in body
    release = json.loads((folder / "release.json").read_text())
    assert release["source_sha256"] and set(release["files"]) >= {"config.json", "model.safetensors", "README.md"}


@pytest.fixture(scope="module")
def fine_tuned(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("fine_tuned")
    glue(tiny_bert / "vocab.txt", tiny_sst2(root / "SST-2"), root / "glue", "--task_name", "SST-2",
         "--init_checkpoint", str(tiny_bert), "--do_train", "--max_steps", "2", "--train_batch_size", "4",
         "--max_seq_length", "16")
    return root / "glue" / "pytorch_model.bin"


@pytest.mark.slow
def test_a_glue_model_keeps_its_head_and_its_labels_names(fine_tuned, tiny_bert, tmp_path):
    import transformers

    folder = exported(fine_tuned, tmp_path / "release", "--onnx", vocab=tiny_bert / "vocab.txt")
    theirs = loads_cleanly(transformers.AutoModelForSequenceClassification, folder)
    assert theirs.config.id2label == {0: "0", 1: "1"} and theirs.config.finetuning_task == "sst-2"
    batch = encoded(folder, pair=True)
    with torch.no_grad():
        logits = theirs(**batch).logits
    (expected,) = our_call(ours(fine_tuned), batch)
    assert (logits - expected).abs().max() < 1e-5
    (onnx_logits,) = onnx_outputs(folder / "onnx" / "model.onnx", batch)
    assert np.abs(onnx_logits - expected.numpy()).max() < 1e-4
    meta = yaml.safe_load((folder / "README.md").read_text().split("---\n")[1])
    assert meta["pipeline_tag"] == "text-classification"


@pytest.mark.slow
def test_a_squad_model_answers_as_ours_in_transformers(tiny_bert, tmp_path):
    import transformers

    from helpers import EXCERPT, squad_subset

    train = squad_subset(EXCERPT / "dev-v1.1.json", tmp_path / "train.json", ["Construction"], 2)
    squad(tiny_bert / "vocab.txt", tmp_path / "squad", "--init_checkpoint", str(tiny_bert), "--train_file",
          str(train), "--do_train", "--train_batch_size", "8", "--max_steps", "2", "--cache_dir", str(tmp_path / "c"))
    source = tmp_path / "squad" / "pytorch_model.bin"
    folder = exported(source, tmp_path / "release", vocab=tiny_bert / "vocab.txt")
    theirs = loads_cleanly(transformers.AutoModelForQuestionAnswering, folder)
    batch = encoded(folder, pair=True)
    with torch.no_grad():
        found = theirs(**batch)
    start, end = our_call(ours(source), batch)
    real = batch["attention_mask"].bool()  # padding is no answer's place: ours skips it
    assert (found.start_logits - start)[real].abs().max() < 1e-5
    assert (found.end_logits - end)[real].abs().max() < 1e-5


def sentence_embeddings(src, texts, vocab):
    """Our embedding model's unit vectors (finetuning/embedding.py), mean pooling, 32 tokens."""
    from bertrecipe.finetuning.embedding import encode_texts, load_embedding_model
    from bertrecipe.finetuning.model_loading import config_and_weights
    from bertrecipe.training.stepper import make_precision

    tokenizer = load_tokenizer(vocab, True)
    config, weights = config_and_weights(None, str(src))
    model = load_embedding_model(config, weights, str(src), tokenizer, 32, "mean")
    return encode_texts(model, tokenizer, texts, 32, 8, make_precision(torch.device("cpu"), False, False)).numpy()


@pytest.fixture(scope="module")
def retrieval_run(tiny_bert, squad_beir, tmp_path_factory):
    out = tmp_path_factory.mktemp("retrieval") / "out"
    result = run_command([sys.executable, REPO_ROOT / "run_retrieval.py", "--init_checkpoint", tiny_bert,
                          "--vocab_file", tiny_bert / "vocab.txt", "--do_lower_case", "--data_dir",
                          squad_beir / "test", "--do_train", "--train_file", squad_beir / "pairs.jsonl",
                          "--max_steps", "2", "--train_batch_size", "4", "--max_seq_length", "32", "--do_eval",
                          "--output_dir", out, "--disable_progress_bar"])
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.slow
def test_a_retrieval_model_is_a_sentence_transformer_with_its_scores_on_the_card(retrieval_run, tiny_bert,
                                                                                  tmp_path):
    import transformers
    from sentence_transformers import SentenceTransformer

    source = retrieval_run / "pytorch_model.bin"
    folder = exported(source, tmp_path / "release", "--onnx", "--results", retrieval_run / "results.json",
                      vocab=tiny_bert / "vocab.txt")
    loads_cleanly(transformers.AutoModel, folder)  # what sentence-transformers loads: every weight found
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    expected = sentence_embeddings(source, TEXTS, tiny_bert / "vocab.txt")
    assert (theirs * expected).sum(axis=1).min() >= 0.9999
    batch = encoded(folder)
    _, onnx_embedding = onnx_outputs(folder / "onnx" / "model.onnx", batch)
    assert np.abs(onnx_embedding - expected).max() < 1e-4
    meta = yaml.safe_load((folder / "README.md").read_text().split("---\n")[1])
    assert meta["library_name"] == "sentence-transformers" and meta["pipeline_tag"] == "sentence-similarity"
    ndcg = json.loads((retrieval_run / "results.json").read_text())["ndcg@10"]
    [entry] = meta["model-index"][0]["results"][:1]
    assert entry["metrics"][0] == {"type": "ndcg_at_10", "name": "nDCG@10", "value": round(100 * ndcg, 2)}
    assert "zeros" in (folder / "README.md").read_text()  # the pooler it never had is stated, not hidden


@pytest.mark.slow
def test_an_encoder_released_as_an_embedding_model_gives_our_embeddings(tiny_bert, tmp_path):
    from sentence_transformers import SentenceTransformer

    folder = exported(tiny_bert, tmp_path / "release", "--embedding", "--pooling", "mean", "--max_seq_length", "32",
                      "--do_lower_case")
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    expected = sentence_embeddings(tiny_bert, TEXTS, tiny_bert / "vocab.txt")
    assert (theirs * expected).sum(axis=1).min() >= 0.9999
    assert json.loads((folder / "sentence_bert_config.json").read_text())["max_seq_length"] == 32


@pytest.mark.slow
def test_a_modern_masked_lm_loads_in_transformers_with_our_logits(tiny_bert, tmp_path):
    import transformers

    source = tiny_modern_folder(tmp_path / "modern", tiny_bert / "vocab.txt", "ModernBertForMaskedLM")
    folder = exported(source, tmp_path / "release", "--onnx", "--do_lower_case")
    theirs = loads_cleanly(transformers.AutoModelForMaskedLM, folder)
    batch = encoded(folder)
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        logits = theirs(**batch).logits
    (expected,) = our_call(ours(source), batch)
    mask = batch["attention_mask"].bool()
    assert (logits - expected)[mask].abs().max() < 1e-5
    (onnx_logits,) = onnx_outputs(folder / "onnx" / "model.onnx", batch)
    assert np.abs(onnx_logits - expected.numpy())[mask.numpy()].max() < 1e-4
    assert transformers.pipeline("fill-mask", model=str(folder))("the movie was [MASK] .")


@pytest.mark.slow
def test_results_of_another_checkpoint_are_refused_and_nothing_is_written(retrieval_run, tiny_bert, tmp_path):
    other = tmp_path / "other.json"
    results = json.loads((retrieval_run / "results.json").read_text())
    other.write_text(json.dumps({**results, "checkpoint_sha256": "0" * 64}))
    result = export(retrieval_run / "pytorch_model.bin", tmp_path / "release", "--results", other,
                    vocab=tiny_bert / "vocab.txt")
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "scores the checkpoint with sha256 000000000000..., not this one" in lines[0]
    assert not (tmp_path / "release").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["other.json"]


@pytest.mark.slow
def test_a_release_is_replaced_only_when_asked_and_only_if_it_is_one(fine_tuned, tiny_bert, tmp_path):
    vocab = tiny_bert / "vocab.txt"
    folder = exported(fine_tuned, tmp_path / "release", vocab=vocab)
    before = snapshot(folder)
    again = export(fine_tuned, folder, vocab=vocab)
    assert again.returncode == 2 and "pass --overwrite" in again.stderr and snapshot(folder) == before
    # a failing export (results of no checkpoint) leaves the previous release whole, even with --overwrite
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    failed = export(fine_tuned, folder, "--overwrite", "--results", bad, vocab=vocab)
    assert failed.returncode == 2 and snapshot(folder) == before
    assert exported(fine_tuned, folder, "--overwrite", "--model_name", "renamed", vocab=vocab)
    assert "# renamed" in (folder / "README.md").read_text()
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    refused = export(fine_tuned, foreign, "--overwrite", vocab=vocab)
    assert refused.returncode == 2 and "did not write it" in refused.stderr
    assert (foreign / "notes.txt").read_text() == "mine" and sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


@pytest.mark.slow
def test_run_downstream_results_of_this_checkpoint_fill_the_card_and_its_model_index(pretrained, tmp_path):
    from bertrecipe.model.weights import checkpoint_identity

    # run_downstream.py's results.json layout (downstream_report.build_report): the header names the checkpoint
    results = tmp_path / "results.json"
    results.write_text(json.dumps({
        "checkpoint": checkpoint_identity(pretrained),
        "protocol": {"grids": {"sst-2": {"seeds": [1, 2, 3]}, "squad-v1.1": {"seeds": [1]}}},
        "tasks": {"sst-2": {"kind": "glue", "metric": "acc", "score": 81.25},
                  "squad-v1.1": {"kind": "squad", "metric": "F1", "score": 70.5},
                  "rte": {"kind": "glue", "metric": "acc", "score": None}}}))
    folder = exported(pretrained, tmp_path / "release", "--results", results, vocab=VOCAB_EXCERPT)
    text = (folder / "README.md").read_text()
    meta = yaml.safe_load(text.split("---\n")[1])
    entries = meta["model-index"][0]["results"]
    assert [(e["dataset"]["name"], e["task"]["type"], e["metrics"][0]["type"], e["metrics"][0]["value"])
            for e in entries] == [("sst-2", "text-classification", "accuracy", 81.25),
                                  ("squad-v1.1", "question-answering", "f1", 70.5)]  # no score, no row
    assert "| sst-2 | acc | 81.25 | run_downstream.py, median over seeds at the best configuration (3 seeds) |" in text
    assert "| squad-v1.1 | F1 | 70.50 | run_downstream.py, median over seeds at the best configuration (1 seed) |" \
        in text  # each task with its own grid's seeds


def test_the_manifest_of_the_shards_the_checkpoint_read_gives_the_card_its_sources(tmp_path):
    from bertrecipe.release.card import CardFacts, card_text
    from bertrecipe.release.model_files import ReleaseKind
    from bertrecipe.release.records import SourceRecords, matching_manifest

    shards = tmp_path / "custom" / "training"
    shards.mkdir(parents=True)
    manifest = {"sources": [{"name": "web", "articles": {"training_tokens": 1200}},
                            {"name": "wiki", "articles": {"training_tokens": 300}}],
                "totals": {"training": {"rows": 12, "tokens": 1500}},
                "shards": {"training": [{"file": "custom_training_0.hdf5"}, {"file": "custom_training_1.hdf5"}]}}
    (tmp_path / "custom" / "manifest.json").write_text(json.dumps(manifest))
    records = SourceRecords(tmp_path / "ckpt_4.pt", "ab" * 32, {"args": {"input_dir": str(shards)}},
                            ["custom_training_0.hdf5"])
    assert matching_manifest(records) == manifest
    other = SourceRecords(records.path, records.sha256, records.payload, ["another_training_0.hdf5"])
    assert matching_manifest(other) is None  # shards the manifest does not list: not this run's data
    facts = CardFacts(name="m", kind=ReleaseKind("fill-mask", "BertForMaskedLM"), family="BERT",
                      sizes={"layers": 2, "hidden": 8, "heads": 2, "intermediate": 16, "max_length": 64,
                             "parameters": 100}, vocab="10 WordPiece tokens, uncased",
                      training=[("optimizer steps", "4")], manifest=manifest)
    text = card_text(facts)
    assert "1,500 tokens in 12 sequences of training shards" in text
    assert "| web | 1,200 |" in text and "| wiki | 300 |" in text


@pytest.mark.slow
def test_the_released_minilm_of_the_shared_data_is_a_sentence_transformer_with_our_embeddings(shared_data,
                                                                                                 tmp_path):
    import transformers
    from sentence_transformers import SentenceTransformer

    minilm = shared_data / "minilm"
    folder = exported(minilm, tmp_path / "release", "--embedding", "--pooling", "mean", "--max_seq_length", "32",
                      "--do_lower_case", "--onnx", "--int8")
    loads_cleanly(transformers.AutoModel, folder)
    theirs = SentenceTransformer(str(folder), device="cpu").encode(TEXTS)
    expected = sentence_embeddings(minilm, TEXTS, minilm / "vocab.txt")
    assert (theirs * expected).sum(axis=1).min() >= 0.9999
    _, onnx_embedding = onnx_outputs(folder / "onnx" / "model.onnx", encoded(folder))
    assert np.abs(onnx_embedding - expected).max() < 1e-4


@pytest.mark.slow
def test_a_modern_classifier_from_a_transformers_folder_keeps_its_labels_names(tiny_bert, tmp_path):
    import transformers

    source = tiny_modern_folder(tmp_path / "modern_classifier", tiny_bert / "vocab.txt",
                                "ModernBertForSequenceClassification", id2label={0: "negative", 1: "positive"},
                                label2id={"negative": 0, "positive": 1})
    folder = exported(source, tmp_path / "release", "--do_lower_case")
    theirs = loads_cleanly(transformers.AutoModelForSequenceClassification, folder)
    assert theirs.config.id2label == {0: "negative", 1: "positive"}
    batch = encoded(folder)
    batch.pop("token_type_ids", None)
    with torch.no_grad():
        logits = theirs(**batch).logits
    (expected,) = our_call(ours(source), batch)
    assert (logits - expected).abs().max() < 1e-5
    found = transformers.pipeline("text-classification", model=str(folder))(TEXTS[0])
    assert found[0]["label"] == ["negative", "positive"][int(expected[0].argmax())]
