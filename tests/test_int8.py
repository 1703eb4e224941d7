"""int8 models (bertrecipe/deploy/quantization.py) on tiny seeded models of both families and the real excerpts in
tests/data: the int8 export holds int8 MatMuls and its logits, answers and accuracy stay within stated tolerances of
the fp32 export's; every command that takes an ONNX model takes the int8 one (inference.py, run_squad.py and
run_glue.py --onnx_model, the Triton entry as the server binds it, run_retrieval.py --export_onnx --int8); bad input
is one line and writes nothing. Speed is measured by benchmarks/int8_inference.py, never here."""
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertrecipe.cli import inference, run_glue, run_squad
from bertrecipe.cli import triton_deployer as deployer
from bertrecipe.common.errors import InputError
from bertrecipe.deploy import model_repository
from bertrecipe.deploy.embedding_export import onnx_embeddings, open_embedding_session
from bertrecipe.deploy.onnx_export import onnx_qa_logits, open_qa_session
from bertrecipe.deploy.quantization import is_int8, load_onnx, onnx_precision, quantize_file, quantized_bytes
from bertrecipe.deploy.serving import INPUTS, make_infer, runner_for
from bertrecipe.finetuning.embedding import tokenize_texts
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.training.metric_logger import read_log
from helpers import (
    GLUE_EXCERPTS,
    REPO_ROOT,
    SEQ,
    TINY_BERT,
    TINY_MODERN,
    copy_squad_excerpt,
    feature_arrays,
    glue,
    in_process,
    make_qa_checkpoint,
    run_command,
)

# int8 weights move every logit a little: the largest move stays under this share of the largest fp32 logit.
RELATIVE_TOLERANCE = 0.05


@pytest.fixture(scope="module")
def modern_encoder(tiny_bert, tmp_path_factory):
    """A seeded 3-layer ModernBERT saved by transformers, with the tiny BERT's WordPiece vocab."""
    import transformers

    vocab = (tiny_bert / "vocab.txt").read_text(encoding="utf-8")
    torch.manual_seed(0)
    config = transformers.ModernBertConfig(vocab_size=len(vocab.splitlines()), bos_token_id=101, eos_token_id=102,
                                           cls_token_id=101, sep_token_id=102, **TINY_MODERN)
    folder = tmp_path_factory.mktemp("int8_modern")
    transformers.ModernBertModel(config).save_pretrained(folder)
    (folder / "vocab.txt").write_text(vocab, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def setup(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("int8")
    tokenizer = load_tokenizer(tiny_bert / "vocab.txt", True)
    return {"root": root, "checkpoint": make_qa_checkpoint(tiny_bert, root / "finetuned"),
            "predict": copy_squad_excerpt(root / "predict.json"), "tokenizer": tokenizer,
            "vocab": tiny_bert / "vocab.txt", "encoder": tiny_bert}


def deploy_args(setup, repository: Path, checkpoint, *extra: str) -> list[str]:
    return ["--init_checkpoint", str(checkpoint), "--vocab_file", str(setup["vocab"]), "--do_lower_case",
            "--predict_file", str(setup["predict"]), "--max_seq_length", str(SEQ), "--doc_stride", "64",
            "--max_query_length", "32", "--model_repository", str(repository), *extra]


@pytest.fixture(scope="module")
def squad_models(setup):
    """The QA checkpoint deployed twice: fp32 (version 1) and --int8 (version 2)."""
    repository = setup["root"] / "repo"
    deployer.main(deploy_args(setup, repository, setup["checkpoint"]))
    deployer.main(deploy_args(setup, repository, setup["checkpoint"], "--int8", "--model_version", "2"))
    return {"fp32": repository / "bert" / "1" / "model.onnx", "int8": repository / "bert" / "2" / "model.onnx",
            "repository": repository}


def largest_relative_difference(got: list[np.ndarray], expected: list[np.ndarray]) -> float:
    scale = max(float(np.abs(e).max()) for e in expected)
    return max(float(np.abs(g - e).max()) for g, e in zip(got, expected, strict=True)) / scale


def test_the_int8_export_holds_int8_matmuls_and_is_smaller(squad_models):
    fp32, int8 = load_onnx(squad_models["fp32"]), load_onnx(squad_models["int8"])
    assert not is_int8(fp32) and is_int8(int8)
    assert (onnx_precision(squad_models["fp32"]), onnx_precision(squad_models["int8"])) == ("fp32", "int8")
    kinds = {node.op_type for node in int8.graph.node}
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= kinds
    # every MatMul became MatMulInteger: the weight products and each layer's two activation products in attention
    assert sum(n.op_type == "MatMulInteger" for n in int8.graph.node) == sum(n.op_type == "MatMul"
                                                                             for n in fp32.graph.node)
    assert not any(n.op_type == "MatMul" for n in int8.graph.node)
    assert squad_models["int8"].stat().st_size < squad_models["fp32"].stat().st_size


def test_the_bert_export_attends_with_three_products_and_the_scale_in_the_query_weights(squad_models):
    """Q, K and V each a product of its own weights (a fused product's Split copies at run time) and no scale
    computed from the activations (it is folded into Q's weights): 6 weight products a layer, 2 of activations."""
    fp32 = load_onnx(squad_models["fp32"])
    weights = {t.name for t in fp32.graph.initializer}
    matmuls = [n for n in fp32.graph.node if n.op_type == "MatMul"]
    layers = TINY_BERT["num_hidden_layers"]
    assert sum(n.input[1] in weights for n in matmuls) == 6 * layers + 1  # and the answer-span head
    assert sum(n.input[1] not in weights for n in matmuls) == 2 * layers
    attention = [n for n in fp32.graph.node if "/attention/" in n.name]
    assert attention and not any(n.op_type in ("Split", "Sqrt") for n in attention)


def test_int8_squad_logits_stay_close_to_fp32_on_real_windows(setup, squad_models):
    arrays = feature_arrays(setup)
    fp32 = onnx_qa_logits(open_qa_session(squad_models["fp32"]), arrays, 8)
    int8 = onnx_qa_logits(open_qa_session(squad_models["int8"]), arrays, 8)
    relative = largest_relative_difference(list(int8), list(fp32))
    print(f"int8 vs fp32 SQuAD logits: {relative:.4f} of the largest logit, {len(arrays[0])} windows")
    assert 0 < relative < RELATIVE_TOLERANCE


def test_run_squad_predicts_with_the_int8_model_as_with_the_fp32_one(setup, squad_models, tmp_path):
    """The same command scores either export; on the excerpt's questions the int8 answers are the fp32 answers but
    for at most a tenth of them (near-ties of a random tiny model's spans), and F1 within 5 points."""
    scores, answers = {}, {}
    for precision, model in squad_models.items():
        if precision == "repository":
            continue
        out = tmp_path / precision
        result = in_process(run_squad.cli, ["run_squad.py", "--onnx_model", model, "--vocab_file", setup["vocab"],
                                            "--do_lower_case", "--predict_file", setup["predict"], "--do_predict",
                                            "--do_eval", "--max_seq_length", SEQ, "--doc_stride", "64",
                                            "--max_query_length", "32", "--output_dir", out,
                                            "--json-summary", out / "log.json", "--disable_progress_bar"])
        assert result.returncode == 0, result.stderr[-2000:]
        scores[precision] = read_log(out / "log.json")[-1]["data"]
        answers[precision] = json.loads((out / "predictions.json").read_text())
    assert scores["int8"]["precision"] == "int8" and scores["fp32"]["precision"] == "fp32"
    differing = sum(answers["int8"][q] != answers["fp32"][q] for q in answers["fp32"])
    print(f"answers differing: {differing} of {len(answers['fp32'])}; F1 fp32 {scores['fp32']['F1']:.2f}, "
          f"int8 {scores['int8']['F1']:.2f}")
    assert differing <= len(answers["fp32"]) // 10
    assert abs(scores["int8"]["F1"] - scores["fp32"]["F1"]) <= 5


def test_inference_answers_with_the_int8_model(setup, squad_models):
    answers = []
    for precision in ("fp32", "int8"):
        result = in_process(inference.cli, ["inference.py", "--onnx_model", squad_models[precision], "--vocab_file",
                                            setup["vocab"], "--do_lower_case", "--question", "Who came to the house?",
                                            "--context", "That morning a young man of large fortune came to the "
                                            "house from the north of England in a chaise and four."])
        assert result.returncode == 0, result.stderr
        answers.append(json.loads(result.stdout))
    assert answers[1]["answer"] == answers[0]["answer"] and answers[1]["answer"]
    assert abs(answers[1]["nbest"][0]["start_logit"] - answers[0]["nbest"][0]["start_logit"]) < 0.05


def test_the_int8_triton_entry_serves_as_the_server_binds_it(setup, squad_models):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    config = text_format.Parse((squad_models["repository"] / "bert" / "config.pbtxt").read_text(),
                               model_config_pb2.ModelConfig())
    assert config.platform == "onnxruntime_onnx"
    assert [group.kind for group in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_CPU]
    infer = make_infer(runner_for(squad_models["int8"], "onnx"), outputs=2, max_seq_length=SEQ)
    ids, segments, mask = (a.astype(np.int64) for a in feature_arrays(setup))
    requests = [{name: a[:3] for name, a in zip(INPUTS, (ids, segments, mask), strict=True)},
                {name: a[3:5, :96] for name, a in zip(INPUTS, (ids, segments, mask), strict=True)}]
    answers = infer(requests)
    fp32 = runner_for(squad_models["fp32"], "onnx")
    for request, answer in zip(requests, answers, strict=True):
        expected = fp32([request[name] for name in INPUTS])
        got = [answer["output__0"], answer["output__1"]]
        assert got[0].shape == request["input__0"].shape
        real = request["input__2"].astype(bool)  # the batcher pads the shorter request; compare real tokens
        assert largest_relative_difference([g[real] for g in got], [e[real] for e in expected]) < RELATIVE_TOLERANCE


@pytest.mark.parametrize("extra, message", [
    (("--format", "torchscript"), "--format torchscript has no int8 form"),
    (("--instance_kind", "KIND_GPU"), "use --instance_kind KIND_CPU"),
    (("--int8_tolerance", "0"), "--int8_tolerance must be positive"),
])
def test_int8_deploy_flags_that_cannot_work_are_one_line_and_write_nothing(setup, extra, message):
    repository = setup["root"] / "refused_flags"
    result = in_process(deployer.cli, ["deployer.py", *deploy_args(setup, repository, setup["checkpoint"], "--int8",
                                                                    *extra)])
    assert result.returncode == 2 and message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not repository.exists()


def test_an_int8_difference_above_its_tolerance_is_refused_and_nothing_is_written(setup, monkeypatch):
    honest = model_repository.runner_for
    monkeypatch.setattr(model_repository, "runner_for",
                        lambda path, fmt: (lambda arrays: [out * 1.5 for out in honest(path, fmt)(arrays)]))
    repository = setup["root"] / "refused_int8"
    with pytest.raises(InputError, match="--int8_tolerance 0.25; nothing written"):
        deployer.main(deploy_args(setup, repository, setup["checkpoint"], "--int8"))
    assert not [p for p in (repository / "bert").iterdir()]


def test_a_modern_model_deploys_as_int8_within_the_tolerance(setup, modern_encoder, capsys):
    """Within the deployer's tolerance, and its attention exported as BERT's: three products of Wqkv's slices, no
    Split or scale computed at run time, every MatMul int8."""
    repository = setup["root"] / "repo_modern"
    deployer.main(deploy_args(setup, repository, modern_encoder))
    deployer.main(deploy_args(setup, repository, modern_encoder, "--int8", "--model_version", "2"))
    printed = capsys.readouterr().out
    assert "max abs difference int8 onnx vs PyTorch fp32" in printed
    fp32, int8 = (load_onnx(repository / "bert" / version / "model.onnx") for version in ("1", "2"))
    assert is_int8(int8) and not any(n.op_type == "MatMul" for n in int8.graph.node)
    weights = {t.name for t in fp32.graph.initializer}
    matmuls = [n for n in fp32.graph.node if n.op_type == "MatMul"]
    assert sum(n.input[1] not in weights for n in matmuls) == 2 * TINY_MODERN["num_hidden_layers"]
    attention = [n for n in fp32.graph.node if "/attn/" in n.name]
    assert attention and not any(n.op_type in ("Split", "Sqrt") for n in attention)


@pytest.fixture(scope="module")
def sst2_models(setup):
    """The tiny BERT fine-tuned on the SST-2 excerpt's 40 training rows, deployed fp32 and int8 (GLUE heads)."""
    root = setup["root"] / "sst2"
    data = root / "SST-2"
    shutil.copytree(GLUE_EXCERPTS / "SST-2", data)
    glue(setup["vocab"], data, root / "trained", "--task_name", "sst-2", "--init_checkpoint", str(setup["encoder"]),
         "--do_train", "--num_train_epochs", "4", "--learning_rate", "1e-3", "--train_batch_size", "8",
         "--max_seq_length", "64")
    models = {}
    for version, extra in ((1, ()), (2, ("--int8",))):
        deployer.main(["--init_checkpoint", str(root / "trained" / "pytorch_model.bin"), "--vocab_file",
                       str(setup["vocab"]), "--do_lower_case", "--task", "glue", "--max_seq_length", "64",
                       "--model_repository", str(root / "repo"), "--model_version", str(version), *extra])
        models["int8" if extra else "fp32"] = root / "repo" / "bert" / str(version) / "model.onnx"
    return {"data": data, **models}


def glue_eval(setup, sst2_models, model: Path, out: Path, *extra: str):
    return in_process(run_glue.cli, ["run_glue.py", "--task_name", "sst-2", "--data_dir", sst2_models["data"],
                                     "--onnx_model", model, "--vocab_file", setup["vocab"], "--do_lower_case",
                                     "--do_eval", "--max_seq_length", "64", "--output_dir", out,
                                     "--disable_progress_bar", *extra])


def test_run_glue_scores_the_int8_model_as_the_fp32_one_on_real_sst2_rows(setup, sst2_models, tmp_path):
    """On the 40 real dev rows the int8 predictions are the fp32 ones but for at most 2 (5 %), so the accuracy
    is within 5 points."""
    results, predictions = {}, {}
    for precision in ("fp32", "int8"):
        out = tmp_path / precision
        result = glue_eval(setup, sst2_models, sst2_models[precision], out)
        assert result.returncode == 0, result.stderr[-2000:]
        results[precision] = json.loads((out / "results.json").read_text())
        predictions[precision] = (out / "eval_predictions.tsv").read_text().splitlines()
    assert results["int8"]["precision"] == "int8" and results["int8"]["eval_examples"] == 40
    differing = sum(a != b for a, b in zip(predictions["fp32"], predictions["int8"], strict=True))
    print(f"SST-2 excerpt: accuracy fp32 {results['fp32']['eval_acc']:.3f}, int8 {results['int8']['eval_acc']:.3f}, "
          f"{differing} predictions differ")
    assert differing <= 2
    assert abs(results["int8"]["eval_acc"] - results["fp32"]["eval_acc"]) <= 0.05


@pytest.mark.parametrize("extra, message", [
    (("--do_train",), "--do_train do not apply"),
    (("--bf16",), "--bf16 do not apply"),
    (("--task_name", "mnli"), "gives 2 logits a row, the task has 3 labels"),
])
def test_run_glue_refuses_what_an_onnx_model_cannot_do_in_one_line(setup, sst2_models, tmp_path, extra, message):
    result = glue_eval(setup, sst2_models, sst2_models["int8"], tmp_path / "out", *extra)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_run_glue_refuses_a_squad_export(setup, sst2_models, squad_models, tmp_path):
    result = glue_eval(setup, sst2_models, squad_models["int8"], tmp_path / "out")
    assert result.returncode == 2 and "not a GLUE export" in result.stderr
    assert not (tmp_path / "out").exists()


def test_quantizing_refuses_what_it_cannot_quantize_and_never_overwrites_unasked(squad_models, tmp_path):
    target = tmp_path / "int8.onnx"
    target.write_bytes(b"earlier")
    with pytest.raises(InputError, match="exists; pass --overwrite"):
        quantize_file(squad_models["fp32"], target)
    assert target.read_bytes() == b"earlier"
    quantize_file(squad_models["fp32"], target, overwrite=True)
    assert is_int8(load_onnx(target))
    with pytest.raises(InputError, match="already quantized"):
        quantize_file(squad_models["int8"], tmp_path / "twice.onnx")
    with pytest.raises(InputError, match="is the fp32 model being quantized"):
        quantize_file(squad_models["fp32"], squad_models["fp32"], overwrite=True)
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    with pytest.raises(InputError, match="not an ONNX model"):
        quantize_file(text, tmp_path / "out.onnx")
    with pytest.raises(InputError, match="ONNX model not found"):
        quantize_file(tmp_path / "missing.onnx", tmp_path / "out.onnx")
    assert not (tmp_path / "twice.onnx").exists() and not (tmp_path / "out.onnx").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporaries left


@pytest.mark.parametrize("family", ["bert", "modern"])
def test_run_retrieval_exports_int8_embeddings_close_to_pytorch(setup, modern_encoder, family, tmp_path):
    from bertrecipe.finetuning.embedding import load_embedding_model
    from bertrecipe.finetuning.model_loading import config_and_weights

    encoder = setup["encoder"] if family == "bert" else modern_encoder
    out = tmp_path / "out"
    result = run_command([sys.executable, REPO_ROOT / "run_retrieval.py", "--init_checkpoint", encoder,
                          "--vocab_file", encoder / "vocab.txt", "--do_lower_case", "--data_dir", tmp_path / "unused",
                          "--export_onnx", "--int8", "--output_dir", out, "--max_seq_length", "64",
                          "--disable_progress_bar"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert is_int8(load_onnx(out / "model.onnx"))
    texts = [line.split("\t")[0] for line in (GLUE_EXCERPTS / "SST-2" / "dev.tsv").read_text().splitlines()[1:]]
    tokenizer = load_tokenizer(encoder / "vocab.txt", True)
    ids, mask = tokenize_texts(tokenizer, texts, 64)
    int8 = onnx_embeddings(open_embedding_session(out / "model.onnx"), ids, mask)
    config, weights = config_and_weights(None, str(encoder))
    model = load_embedding_model(config, weights, str(encoder), tokenizer, 64, "mean").eval()
    with torch.no_grad():
        expected = model(torch.from_numpy(ids).long(), torch.from_numpy(mask).long()).numpy()
    cosine = (int8 * expected).sum(axis=1)  # both are unit vectors
    print(f"{family}: cosine of int8 and PyTorch embeddings, lowest {cosine.min():.4f} over {len(texts)} rows")
    assert cosine.min() > 0.99


def test_quantized_bytes_names_its_source_when_given_no_model():
    with pytest.raises(InputError, match="the export: not an ONNX model"):
        quantized_bytes(b"\x00\x01 not protobuf", "the export")
