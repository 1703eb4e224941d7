"""run_pretraining_inference.py with NVIDIA's flags: a checkpoint's masked-LM and next-sentence accuracy on shards,
against a plain computation sample by sample (helpers.masked_lm_reference) and run_pretraining.py --do_eval's log;
NVIDIA's closing line; the checkpoint chosen by --ckpt_dir/--ckpt_step as NVIDIA's script chooses it; bad input one
line."""
import re
import sys

import pytest
import torch

from bertrecipe.model.bert import BertConfig, BertForPreTraining
from helpers import REPO_ROOT, TINY, final_record, masked_lm_reference, pretrain, run_command


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("inference_run")
    pretrain(corpus, out, "--train_batch_size", 16, "--max_steps", 6, "--num_steps_per_checkpoint", 3)
    return out


def infer(corpus, *flags):
    return run_command([sys.executable, REPO_ROOT / "run_pretraining_inference.py", "--input_dir", corpus / "eval",
                        "--config_file", corpus / "bert_config.json", "--eval_batch_size", "8",
                        "--max_seq_length", "64", "--max_predictions_per_seq", "10", "--eval", *map(str, flags)])


def reference(checkpoint, corpus):
    model = BertForPreTraining(BertConfig(**TINY)).eval()
    model.load_state_dict(torch.load(checkpoint, weights_only=True)["model"])
    return masked_lm_reference(model, corpus / "eval" / "books_test_0.hdf5", with_nsp=True)


def printed_scores(stdout):
    found = re.search(r"masked-LM accuracy ([\d.]+), next-sentence accuracy ([\d.]+), masked-LM loss ([\d.]+)", stdout)
    final = re.search(r"^Finished: Final Loss = ([\d.e-]+)$", stdout, re.M)
    assert found and final, stdout
    return [float(x) for x in found.groups()], float(final.group(1))


def test_the_newest_checkpoint_s_scores_are_the_plain_computation_s(corpus, trained, tmp_path):
    result = infer(corpus, "--ckpt_dir", trained, "--ckpt_step", -1, "--json-summary", tmp_path / "scores.json")
    assert result.returncode == 0, result.stderr
    (accuracy, nsp, loss), final_loss = printed_scores(result.stdout)
    expected_loss, expected_accuracy, expected_nsp = reference(trained / "ckpt_6.pt", corpus)
    assert accuracy == pytest.approx(expected_accuracy, abs=1e-4) and nsp == pytest.approx(expected_nsp, abs=1e-4)
    assert loss == pytest.approx(expected_loss, abs=1e-4) and final_loss == pytest.approx(expected_loss, rel=1e-4)
    logged = final_record(tmp_path / "scores.json")
    assert logged["checkpoint"].endswith("ckpt_6.pt") and logged["eval_nsp_accuracy"] == pytest.approx(expected_nsp)
    assert not list(tmp_path.glob("run_pretraining_inference.*"))


def test_a_chosen_step_and_an_init_checkpoint_score_as_run_pretraining_do_eval(corpus, trained, tmp_path):
    by_step = infer(corpus, "--ckpt_dir", trained, "--ckpt_step", 3)
    by_file = infer(corpus, "--init_checkpoint", trained / "ckpt_3.pt", "--output_dir", tmp_path / "kept")
    assert by_step.returncode == 0 and by_file.returncode == 0, by_step.stderr + by_file.stderr
    assert printed_scores(by_step.stdout) == printed_scores(by_file.stdout)
    done = run_command([sys.executable, REPO_ROOT / "run_pretraining.py", "--input_dir", corpus / "p1",
                        "--config_file", corpus / "bert_config.json", "--output_dir", tmp_path / "do_eval", "--do_eval",
                        "--eval_dir", corpus / "eval", "--init_checkpoint", trained / "ckpt_3.pt", "--eval_batch_size",
                        "8", "--json-summary", tmp_path / "do_eval.json", "--disable_progress_bar"])
    assert done.returncode == 0, done.stderr
    do_eval = final_record(tmp_path / "do_eval.json")
    (accuracy, nsp, loss), _ = printed_scores(by_file.stdout)
    assert [accuracy, nsp, loss] == pytest.approx([do_eval["eval_mlm_accuracy"], do_eval["eval_nsp_accuracy"],
                                                    do_eval["eval_loss"]], abs=1e-4)
    assert (tmp_path / "kept" / "dllogger.json").is_file()  # --output_dir keeps the run's log


@pytest.mark.parametrize("flags, problem", [
    ([], "name the checkpoint to score: --ckpt_dir (with --ckpt_step) or --init_checkpoint"),
    (["--ckpt_step", 4], "ckpt_4.pt: no such checkpoint; "),
])
def test_bad_input_is_one_line(corpus, trained, flags, problem):
    result = infer(corpus, *(["--ckpt_dir", trained] if flags else []), *flags)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and problem in lines[0], result.stderr
