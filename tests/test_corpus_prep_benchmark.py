"""benchmarks/corpus_prep.py on a small corpus: both pipelines read the same Parquet files with the same tokenizer,
so they count the same documents' tokens (within the few a sentence split moves: ours tokenizes the sentences of a
document as the Wikipedia path splits them), and the peer's rows are run_mlm's (every row max_seq_length long)."""
import pytest

from benchmarks import corpus_prep


@pytest.mark.slow
def test_both_pipelines_tokenize_the_same_documents_and_report_their_figures(tmp_path):
    inputs = corpus_prep.make_corpus(tmp_path / "corpus", 0.3, 2)
    assert len(inputs) == 2
    tokenizer = corpus_prep.train_tokenizer(inputs, tmp_path)
    ours = corpus_prep.ours(inputs, tokenizer, 1, tmp_path / "ours")
    peer = corpus_prep.peer(inputs, tokenizer, 1, tmp_path / "peer")
    assert ours["tokens"] > 50_000 and abs(ours["tokens"] - peer["tokens"]) <= 0.001 * peer["tokens"]
    # run_mlm's group_texts cuts each map batch (1,000 documents) into whole rows and drops its remainder
    everything = peer["tokens"] + peer["special_tokens"]
    batches = -(-peer["documents"] // 1000)
    assert everything - batches * corpus_prep.SEQ < peer["rows"] * corpus_prep.SEQ <= everything
    assert ours["rows"] >= peer["rows"]  # ours keeps each document's last, shorter row; run_mlm drops the rest
    row = {"pipeline": "ours", "processes": 1, **ours, "seconds": 1.0, "tokens_per_second_per_process": 5.0,
           "peak_bytes": 2e6, "worker_peak_bytes": 0, "disk_bytes": 1e6}
    text = corpus_prep.table({"rows": [row], "scale": 10, "scaled": {**row, "worker_peak_bytes": 3e6}})
    assert "| ours | 1 |" in text and "10x the input" in text
