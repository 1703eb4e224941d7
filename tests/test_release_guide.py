"""docs/release.md's commands, run as the page gives them, in its order, in one shell: its paths pointed at a tiny
pre-trained checkpoint of the test corpus, GLUE's SST-2 excerpt, a BEIR folder of the SQuAD excerpt and a tiny
ModernBERT with a BPE tokenizer.json, its sizes made small. Then what the page promises of each folder."""
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers

from bertrecipe.dataprep.vocab_training import train_bpe
from helpers import GLUE_EXCERPTS, REPO_ROOT, TEST_DATA, VOCAB_EXCERPT, page_script, pretrain

GUIDE = REPO_ROOT / "docs" / "release.md"
SMALL = [(r"--num_train_epochs \d+", "--max_steps 2"), (r"--train_batch_size 32", "--train_batch_size 4"),
         (r"--max_seq_length 256", "--max_seq_length 64"), (r"--eval_batch_size 64", "--eval_batch_size 16"),
         (r"--layers -1,-2,-3,-4", "--layers -1,-2")]  # the tiny model has 2 layers


def tiny_modern(folder: Path) -> Path:
    """A ModernBERT masked LM as transformers saves one, and a BPE tokenizer.json of the test books."""
    folder.mkdir(parents=True)
    tokenizer = train_bpe(sorted((TEST_DATA / "books").glob("*.txt")), folder / "tokenizer.json", 1000)
    tokens = len(json.loads(tokenizer.read_text(encoding="utf-8"))["model"]["vocab"])
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(
        vocab_size=tokens, hidden_size=32, num_attention_heads=2, num_hidden_layers=3, intermediate_size=48,
        local_attention=16, global_attn_every_n_layers=3, max_position_embeddings=256, pad_token_id=0,
        bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
    transformers.ModernBertForMaskedLM(config).save_pretrained(folder)
    return folder / "tokenizer.json"


@pytest.mark.slow
def test_the_release_page_runs_as_written_and_every_folder_loads(corpus, squad_beir, tmp_path):
    from sentence_transformers import SentenceTransformer

    results = tmp_path / "results"
    pretrain(corpus, tmp_path / "run", "--train_batch_size", 8, "--max_steps", 2)
    (results / "checkpoints").mkdir(parents=True)
    shutil.copyfile(tmp_path / "run" / "ckpt_2.pt", results / "checkpoints" / "ckpt_8601.pt")
    shutil.copyfile(corpus / "bert_config.json", results / "bert_config.json")
    tokenizer_json = tiny_modern(tmp_path / "modern")
    places = {"/results/modern/ckpt_8601.pt": str(tmp_path / "modern"), "/data/vocab/vocab.txt": str(VOCAB_EXCERPT),
              "/data/vocab/tokenizer.json": str(tokenizer_json), "/data/glue/SST-2": str(GLUE_EXCERPTS / "SST-2"),
              "/data/beir/": f"{squad_beir}/", "/data/hdf5/test": str(corpus / "eval"), "/results/": f"{results}/",
              "/releases/": f"{tmp_path / 'releases'}/"}
    script = page_script(GUIDE, SMALL, 5)
    assert all(page in script for page in places)
    script = re.sub("|".join(map(re.escape, places)), lambda m: places[m.group(0)], script)
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]

    releases = tmp_path / "releases"
    transformers.pipeline("fill-mask", model=str(releases / "my-bert"))("the man went to the [MASK] .")
    assert (releases / "my-bert" / "onnx" / "model_quantized.onnx").is_file()
    classifier = transformers.AutoModelForSequenceClassification.from_pretrained(releases / "my-bert-sst2")
    assert classifier.config.id2label == {0: "0", 1: "1"}
    assert SentenceTransformer(str(releases / "my-embedder"), device="cpu").encode(["a text"]).shape == (1, 64)
    assert "model-index" in (releases / "my-embedder" / "README.md").read_text()
    modern = transformers.AutoTokenizer.from_pretrained(releases / "my-modernbert")
    assert modern.mask_token is not None
    transformers.AutoModelForMaskedLM.from_pretrained(releases / "my-modernbert")
    features = (results / "features.jsonl").read_text().splitlines()
    assert [json.loads(line)["linex_index"] for line in features] == [0, 1]
    assert re.search(r"^Finished: Final Loss = [\d.]+$", done.stdout, re.M)
