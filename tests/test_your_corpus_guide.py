"""docs/your-corpus.md's commands, run as the page gives them, in its order, in one shell: on a tiny corpus of
Parquet, zstd JSON Lines and a save_to_disk folder, with tiny released-style checkpoints (a BERT and a ModernBERT
that transformers saved, with their vocab.txt and BPE tokenizer.json), the page's paths pointed at them and its
sizes made small. Then what the page promises: the manifest, folders that transformers loads, GLUE scores."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
import transformers
import zstandard

from bertrecipe.dataprep.vocab_training import train_bpe
from helpers import GLUE_EXCERPTS, REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, page_script

GUIDE = REPO_ROOT / "docs" / "your-corpus.md"
BOOKS = sorted((TEST_DATA / "books").glob("*.txt"))
# The page's sizes, made small (pattern, replacement), applied to its commands in this order.
SMALL = [(r"--n_training_shards \d+", "--n_training_shards 2"), (r"--n_test_shards \d+", "--n_test_shards 1"),
         (r"--fraction_test_set [\d.]+", "--fraction_test_set 0.2"), (r"--n_processes \d+", "--n_processes 2"),
         (r"--max_steps \d+", "--max_steps 4"), (r"ckpt_10000", "ckpt_4"),
         (r"--num_steps_per_checkpoint \d+", "--num_steps_per_checkpoint 2"),
         (r"--train_batch_size \d+", "--train_batch_size 8"), (r"--max_seq_length 1024", "--max_seq_length 128"),
         (r"seq_len_1024", "seq_len_128"), (r"--max_predictions_per_seq 320", "--max_predictions_per_seq 40"),
         (r"--dupe_factor 5", "--dupe_factor 2"), (r"--min_chars 200", "--min_chars 40")]


def guide_script() -> str:
    """The page's bash blocks, in order, as one script."""
    return page_script(GUIDE, SMALL, 5)


def paragraphs() -> list[str]:
    return [" ".join(p.split()) for book in BOOKS for p in book.read_text(encoding="utf-8").split("\n\n")
            if len(p.split()) > 8]


def make_corpus(folder: Path) -> None:
    """web/*.parquet (text, url, score), wiki.jsonl.zst, books/ (save_to_disk), from the books' paragraphs."""
    texts = paragraphs()
    (folder / "web").mkdir(parents=True)
    web = [{"text": t, "url": f"https://example.org/{i}", "score": i % 5} for i, t in enumerate(texts[:40])]
    for part in range(2):
        rows = web[part * 20:(part + 1) * 20]
        pq.write_table(pa.Table.from_pylist(rows), folder / "web" / f"part-0000{part}.parquet", row_group_size=5)
    lines = "".join(json.dumps({"text": t, "title": f"article {i}"}) + "\n" for i, t in enumerate(texts[40:52]))
    (folder / "wiki.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode("utf-8")))
    datasets.Dataset.from_list([{"text": t} for t in texts[52:]]).save_to_disk(str(folder / "books"))


def make_checkpoints(folder: Path) -> tuple[Path, Path]:
    """A tiny BERT (pre-training heads) and a tiny ModernBERT as transformers saves released ones."""
    torch.manual_seed(0)
    bert = folder / "bert-base-uncased"
    size = sum(1 for _ in VOCAB_EXCERPT.open(encoding="utf-8"))
    config = transformers.BertConfig(vocab_size=size, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=512)
    transformers.BertForPreTraining(config).save_pretrained(bert)
    shutil.copyfile(VOCAB_EXCERPT, bert / "vocab.txt")
    modern = folder / "ModernBERT-base"
    modern.mkdir()
    tokenizer = train_bpe(BOOKS, modern / "tokenizer.json", 1000)
    tokens = len(json.loads(tokenizer.read_text(encoding="utf-8"))["model"]["vocab"])
    config = transformers.ModernBertConfig(
        vocab_size=tokens, hidden_size=32, num_attention_heads=2, num_hidden_layers=3, intermediate_size=48,
        local_attention=16, global_attn_every_n_layers=3, max_position_embeddings=256, pad_token_id=0,
        bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
    transformers.ModernBertForMaskedLM(config).save_pretrained(modern)
    return bert, modern


@pytest.mark.slow
def test_the_guide_goes_from_parquet_files_to_fine_tuned_models_of_both_families(tmp_path):
    corpus, models, scratch = tmp_path / "my_corpus", tmp_path / "models", tmp_path / "scratch"
    make_corpus(corpus)
    make_checkpoints(models)
    scratch.mkdir()
    script = guide_script()
    places = {"/scratch/prep": str(scratch / "prep"), "/data/my_corpus": str(corpus), "/models": str(models),
              "/data/glue/SST-2": str(GLUE_EXCERPTS / "SST-2"), "/scratch/": f"{scratch}/"}
    assert all(page in script for page in places)
    script = re.sub("|".join(map(re.escape, places)), lambda m: places[m.group(0)], script)  # one pass
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    assert "records kept as documents" in done.stdout and (scratch / "first_look.hdf5").is_file()
    prep = scratch / "prep"
    manifest = json.loads(next(prep.glob("hdf5_lower_case_1_seq_len_128_*/custom/manifest.json")).read_text())
    assert [(s["name"], s["epochs"]) for s in manifest["sources"]] == [("web", 1.0), ("wiki", 3.0), ("books", 2.0)]
    assert manifest["totals"]["training"]["tokens"] > 0
    assert all(source["selection"]["min_chars"] == 40 for source in manifest["sources"])
    assert (prep / "hdf5_document_chunks_bpe_seq_len_128_random_seed_12345" / "custom" / "manifest.json").is_file()
    transformers.BertForPreTraining.from_pretrained(scratch / "bert_continued_hf")
    transformers.ModernBertForMaskedLM.from_pretrained(scratch / "modern_continued_hf")
    for run in ("sst2_bert", "sst2_modern"):
        results = json.loads((scratch / run / "results.json").read_text())
        assert 0.0 <= results["eval_acc"] <= 1.0 and results["train_examples"] == 40, results
