"""triton/deployer.py on a tiny seeded BERT with a QA head (the `tiny_bert` fixture: the export's plumbing does not
depend on pretrained weights): ONNX Runtime and TorchScript equal PyTorch on real SQuAD windows (an excerpt of
dev-v1.1 kept in tests/data/squad) at any batch size and length, config.pbtxt parses as Triton's ModelConfig and says
what the earlier hand-written one said (a misspelt field or label now fails), a difference above the tolerance is
refused and writes nothing; and the triton/ folder does not shadow OpenAI's `triton` for torch."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from bertrecipe.cli import inference
from bertrecipe.cli import triton_deployer as deployer
from bertrecipe.common.errors import InputError
from bertrecipe.deploy import model_repository
from bertrecipe.deploy.onnx_export import check_vocab_fits, open_qa_session
from bertrecipe.deploy.serving import INPUTS, SAMPLE_CONTEXT, make_infer, runner_for
from bertrecipe.finetuning.model_loading import load_tokenizer
from bertrecipe.finetuning.question_answering import load_qa_model
from helpers import REPO_ROOT, SEQ, copy_squad_excerpt, deploy, feature_arrays, make_qa_checkpoint


@pytest.fixture(scope="module")
def setup(tiny_bert, tmp_path_factory):
    root = tmp_path_factory.mktemp("deploy")
    checkpoint = make_qa_checkpoint(tiny_bert, root / "finetuned")
    predict = copy_squad_excerpt(root / "predict.json")
    tokenizer = load_tokenizer(tiny_bert / "vocab.txt", True)
    model = load_qa_model(checkpoint, None, tokenizer.vocab, SEQ)
    return {"root": root, "checkpoint": checkpoint, "predict": predict, "tokenizer": tokenizer, "model": model,
            "vocab": tiny_bert / "vocab.txt", "encoder": tiny_bert}


@pytest.fixture(scope="module")
def onnx_repo(setup):
    repository = setup["root"] / "repo_onnx"
    deploy(setup, repository, "--format", "onnx", "--max_batch_size", "16", "--dynamic_batching",
           "--preferred_batch_sizes", "4", "8", "--max_queue_delay_us", "200", "--instance_count", "2",
           "--instance_kind", "KIND_CPU")
    return repository


def pytorch_logits(model, arrays):
    with torch.no_grad():
        _, start, end = model(*(torch.from_numpy(a.astype(np.int64)) for a in arrays))
    return start.numpy(), end.numpy()


@pytest.mark.slow
def test_onnx_runtime_equals_pytorch_on_squad_windows_at_other_batch_sizes_and_lengths(setup, onnx_repo):
    import onnxruntime

    session = onnxruntime.InferenceSession(str(onnx_repo / "bert" / "1" / "model.onnx"),
                                           providers=["CPUExecutionProvider"])
    ids, segments, mask = feature_arrays(setup)
    worst = 0.0
    for rows, length in ((slice(0, 13), SEQ), (slice(13, 14), SEQ), (slice(20, 25), 96)):
        arrays = [np.ascontiguousarray(a[rows, :length], dtype=np.int64) for a in (ids, segments, mask)]
        got = session.run(["output__0", "output__1"], dict(zip(INPUTS, arrays, strict=True)))
        expected = pytorch_logits(setup["model"], arrays)
        assert got[0].shape == expected[0].shape == (arrays[0].shape[0], length)
        real = arrays[2].astype(bool)  # PyTorch skips padded positions (model.BertModel.skip_padding); the export not
        worst = max(worst, *(float(np.abs(g[real] - e[real]).max()) for g, e in zip(got, expected, strict=True)))
    print(f"ONNX Runtime vs PyTorch, max abs difference: {worst:.3g}")
    assert worst < 1e-4


def test_onnx_inputs_and_outputs_have_dynamic_batch_and_sequence_axes(onnx_repo):
    import onnx

    graph = onnx.load(str(onnx_repo / "bert" / "1" / "model.onnx")).graph
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        assert [d.dim_param for d in dims] == ["batch", "sequence"], value.name
    assert [i.name for i in graph.input] == ["input__0", "input__1", "input__2"]
    assert [o.name for o in graph.output] == ["output__0", "output__1"]
    assert all(i.type.tensor_type.elem_type == onnx.TensorProto.INT64 for i in graph.input)


def parse_text(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def parse_config(path: Path):
    return parse_text(path.read_text())


def test_config_pbtxt_parses_as_a_triton_model_config(onnx_repo):
    from tritonclient.grpc import model_config_pb2 as pb

    config = parse_config(onnx_repo / "bert" / "config.pbtxt")
    assert (config.name, config.platform, config.max_batch_size) == ("bert", "onnxruntime_onnx", 16)
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        (f"input__{k}", pb.TYPE_INT64, [-1]) for k in range(3)]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [
        (f"output__{k}", pb.TYPE_FP32, [-1]) for k in range(2)]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert config.dynamic_batching.max_queue_delay_microseconds == 200
    [group] = config.instance_group
    assert (group.count, group.kind) == (2, pb.ModelInstanceGroup.KIND_CPU)


# deployer.py's config.pbtxt, byte for byte, from before it was built from tritonclient's ModelConfig message.
SQUAD_SETTINGS = dict(max_batch_size=16, dynamic_batching=True, preferred_batch_sizes=(4, 8), max_queue_delay_us=200,
                      instance_count=2, instance_kind="KIND_CPU")
HAND_WRITTEN_INPUTS = """input [
  {
    name: "input__0"
    data_type: TYPE_INT64
    dims: [ -1 ]
  },
  {
    name: "input__1"
    data_type: TYPE_INT64
    dims: [ -1 ]
  },
  {
    name: "input__2"
    data_type: TYPE_INT64
    dims: [ -1 ]
  }
]
"""  # the same three int64 tensors in every config
HAND_WRITTEN_SQUAD = """name: "bert"
platform: "onnxruntime_onnx"
max_batch_size: 16
""" + HAND_WRITTEN_INPUTS + """output [
  {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ -1 ]
  },
  {
    name: "output__1"
    data_type: TYPE_FP32
    dims: [ -1 ]
  }
]
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 200
}
"""
HAND_WRITTEN_GLUE = """name: "mnli"
platform: "pytorch_libtorch"
max_batch_size: 8
""" + HAND_WRITTEN_INPUTS + """output [
  {
    name: "output__0"
    data_type: TYPE_FP32
    dims: [ 3 ]
  }
]
instance_group [
  {
    count: 1
    kind: KIND_GPU
  }
]
"""  # TritonSettings() and --num_labels 3
HAND_WRITTEN = [
    (("bert", "onnxruntime_onnx", "squad", 2, SQUAD_SETTINGS), HAND_WRITTEN_SQUAD),
    (("mnli", "pytorch_libtorch", "glue", 3, {}), HAND_WRITTEN_GLUE),
    # dynamic batching with every field at its default: the block was written, and must still be there
    (("bert", "onnxruntime_onnx", "squad", 2, {**SQUAD_SETTINGS, "preferred_batch_sizes": (), "max_queue_delay_us": 0}),
     HAND_WRITTEN_SQUAD.replace("  preferred_batch_size: [ 4, 8 ]\n  max_queue_delay_microseconds: 200\n",
                                "  max_queue_delay_microseconds: 0\n")),
]


@pytest.mark.parametrize("arguments, hand_written", HAND_WRITTEN, ids=["squad", "glue", "default_batching"])
def test_config_pbtxt_from_the_message_says_what_the_hand_written_one_said(arguments, hand_written):
    name, platform, task, num_labels, settings = arguments
    settings = model_repository.TritonSettings(**settings)
    written = model_repository.config_pbtxt(name, platform, task, num_labels, settings)
    assert parse_text(written) == parse_text(hand_written)
    assert parse_text(written).HasField("dynamic_batching") == ("dynamic_batching" in hand_written)


def test_a_misspelt_instance_kind_fails_at_export_where_the_hand_written_text_passed():
    # The template wrote any instance kind as given; Triton would have refused the file only when loading it.
    with pytest.raises(ValueError, match="KIND_TPU"):
        model_repository.config_pbtxt("bert", "onnxruntime_onnx", "squad", 2,
                                      model_repository.TritonSettings(instance_kind="KIND_TPU"))


def test_torchscript_export_equals_pytorch_and_targets_libtorch(setup):
    repository = setup["root"] / "repo_ts"
    deploy(setup, repository, "--format", "torchscript", "--model_name", "bert_ts", "--model_version", "3")
    loaded = torch.jit.load(str(repository / "bert_ts" / "3" / "model.pt"))
    arrays = [np.ascontiguousarray(a[:6, :100], dtype=np.int64) for a in feature_arrays(setup)]
    with torch.no_grad():
        got = [t.numpy() for t in loaded(*(torch.from_numpy(a) for a in arrays))]
    expected = pytorch_logits(setup["model"], arrays)
    real = arrays[2].astype(bool)  # as for ONNX: padded positions differ (PyTorch skips them); some rows have them
    assert real.all(axis=1).any() and not real.all()
    assert max(float(np.abs(g[real] - e[real]).max()) for g, e in zip(got, expected, strict=True)) < 1e-4
    config = parse_config(repository / "bert_ts" / "config.pbtxt")
    assert (config.platform, config.max_batch_size) == ("pytorch_libtorch", 8)
    assert not config.HasField("dynamic_batching")


def test_glue_classifier_exports_one_logits_output(setup):
    repository = setup["root"] / "repo_glue"
    deployer.main(["--init_checkpoint", str(setup["encoder"]), "--vocab_file", str(setup["vocab"]),
                   "--do_lower_case", "--task", "glue", "--num_labels", "3", "--max_seq_length", str(SEQ),
                   "--model_repository", str(repository), "--model_name", "mnli"])
    config = parse_config(repository / "mnli" / "config.pbtxt")
    assert [(o.name, list(o.dims)) for o in config.output] == [("output__0", [3])]
    with pytest.raises(InputError, match="not a SQuAD export"):  # inference.py --onnx_model refuses it
        open_qa_session(repository / "mnli" / "1" / "model.onnx")


def test_a_difference_above_the_tolerance_is_refused_and_nothing_is_written(setup, monkeypatch, capsys):
    honest = model_repository.runner_for

    def skewed(path, fmt):
        run = honest(path, fmt)
        return lambda arrays: [out + 0.01 for out in run(arrays)]

    monkeypatch.setattr(model_repository, "runner_for", skewed)
    repository = setup["root"] / "repo_refused"
    with pytest.raises(InputError, match="differs from PyTorch"):
        deploy(setup, repository, "--tolerance", "1e-3")
    assert "max abs difference" in capsys.readouterr().out
    assert not (repository / "bert" / "1").exists() and not (repository / "bert" / "config.pbtxt").exists()
    assert not [p for p in (repository / "bert").iterdir()]  # no staging folder left behind


@pytest.mark.slow
def test_importing_triton_from_the_repository_root_never_yields_this_folder(tmp_path):
    # torch imports `triton` (OpenAI's compiler) when it can; the repository's triton/ must not stand in for it.
    probe = ("import torch._dynamo, importlib.util, sys\n"
             "try:\n import triton\n print(triton.MARK)\nexcept ImportError:\n print('absent')")
    env = {**os.environ, "PYTHONPATH": ""}
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO_ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.stdout.strip() == "absent", done.stderr[-2000:]
    fake = tmp_path / "site" / "triton"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("MARK = 'installed triton'\n")
    env["PYTHONPATH"] = str(tmp_path / "site")
    done = subprocess.run([sys.executable, "-c", "import triton; print(triton.MARK)"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "installed triton", done.stderr[-2000:]


def test_server_function_pads_gathered_requests_of_different_lengths_and_cuts_answers_back(setup, onnx_repo):
    run = runner_for(onnx_repo / "bert" / "1" / "model.onnx", "onnx")
    infer = make_infer(run, outputs=2, max_seq_length=SEQ)
    ids, segments, mask = feature_arrays(setup)
    requests = [dict(zip(INPUTS, (a[rows, :length].astype(np.int64) for a in (ids, segments, mask)), strict=True))
                for rows, length in ((slice(0, 3), SEQ), (slice(3, 4), 90))]
    answers = infer(requests)
    for request, answer in zip(requests, answers, strict=True):
        alone = run([request[name] for name in INPUTS])
        assert answer["output__0"].shape == request["input__0"].shape
        assert max(float(np.abs(answer[f"output__{i}"] - alone[i]).max()) for i in range(2)) < 1e-4
    too_long = {name: np.zeros((1, SEQ + 1), dtype=np.int64) for name in INPUTS}
    with pytest.raises(ValueError, match="exceeds"):
        infer([too_long])


def answer_json(capsys, *model_flags: str, setup) -> dict:
    inference.main([*model_flags, "--vocab_file", str(setup["vocab"]), "--do_lower_case", "--max_seq_length",
                    str(SEQ), "--doc_stride", "64", "--max_query_length", "32", "--predict_batch_size", "3",
                    "--question", "Who came to the house that morning?", "--context", SAMPLE_CONTEXT])
    return json.loads(capsys.readouterr().out)


@pytest.mark.slow
def test_inference_on_the_deployed_onnx_model_answers_as_pytorch(setup, onnx_repo, capsys):
    expected = answer_json(capsys, "--init_checkpoint", str(setup["checkpoint"]), setup=setup)
    got = answer_json(capsys, "--onnx_model", str(onnx_repo / "bert" / "1" / "model.onnx"), setup=setup)
    assert expected["windows"] == got["windows"] > 1  # several windows, in batches of 3
    assert got["answer"] == expected["answer"]
    assert [e["text"] for e in got["nbest"]] == [e["text"] for e in expected["nbest"]]
    for ours, theirs in zip(got["nbest"], expected["nbest"], strict=True):
        assert ours["probability"] == pytest.approx(theirs["probability"], abs=1e-5)


@pytest.mark.slow
def test_inference_refuses_a_vocab_larger_than_the_onnx_models_embeddings(setup, onnx_repo, tmp_path):
    model = onnx_repo / "bert" / "1" / "model.onnx"
    session = open_qa_session(model)
    rows = len(setup["tokenizer"].vocab)  # the tiny model's vocab is its embedding table
    check_vocab_fits(session, model, rows)
    with pytest.raises(InputError, match=f"{model}: the model cannot embed id {rows} of a {rows + 1}-token vocab"):
        check_vocab_fits(session, model, rows + 1)
    longer = tmp_path / "vocab.txt"
    longer.write_text(setup["vocab"].read_text(encoding="utf-8").rstrip("\n") + "\nzzzextra\n", encoding="utf-8")
    result = subprocess.run([sys.executable, str(REPO_ROOT / "inference.py"), "--onnx_model", str(model),
                             "--vocab_file", str(longer), "--do_lower_case", "--question", "Who?", "--context",
                             SAMPLE_CONTEXT], capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.strip().splitlines() == [
        f"error: {longer}: the vocab has {rows + 1:,} tokens but the model embeds only {rows:,}: ids from {rows:,} on "
        "have no embedding; pass the model's own vocab.txt"]


@pytest.mark.slow
@pytest.mark.parametrize("tokens, refused", [(4000, True), (8952, True), (8953, False)])
def test_inference_refuses_a_vocab_far_smaller_than_the_onnx_models_embeddings(setup, onnx_repo, tmp_path, capsys,
                                                                               tokens, refused):
    """The export's embedding rows are found by embedding single ids (its weights are not parsed): 8,960 here. A
    vocab of 8,953 tokens, padded to a multiple of 8, is 8,960 and fits; 8,952 and 4,000 are refused."""
    model = onnx_repo / "bert" / "1" / "model.onnx"
    rows = len(setup["tokenizer"].vocab)
    shorter = tmp_path / "vocab.txt"
    shorter.write_text("\n".join(setup["vocab"].read_text(encoding="utf-8").splitlines()[:tokens]) + "\n")
    flags = ["--onnx_model", str(model), "--vocab_file", str(shorter), "--do_lower_case", "--question", "Who?",
             "--context", SAMPLE_CONTEXT]
    if refused:
        with pytest.raises(InputError, match=f"{shorter}: the vocab has {tokens:,} tokens but the model embeds "
                                             f"{rows:,} "):
            inference.main(flags)
        flags.append("--allow_vocab_mismatch")
    inference.main(flags)
    assert ("warning: " in capsys.readouterr().err) == refused


def test_onnx_model_that_is_no_squad_export_is_an_input_error_naming_it(setup, tmp_path):
    not_onnx = tmp_path / "model.onnx"
    not_onnx.write_bytes(b"not a protobuf")
    with pytest.raises(InputError, match=str(not_onnx)):
        open_qa_session(not_onnx)
    with pytest.raises(SystemExit):  # the export is fp32 and carries its own config
        inference.parse_args(["--onnx_model", str(not_onnx), "--vocab_file", "v", "--context", "c", "--bf16"])
    with pytest.raises(SystemExit):  # one model source, not two
        inference.parse_args(["--onnx_model", str(not_onnx), "--init_checkpoint", "x", "--vocab_file", "v",
                              "--context", "c"])


def test_a_version_folder_holding_an_input_or_a_foreign_file_is_never_replaced(setup, tmp_path):
    """A deploy replaces <repository>/<name>/<version> whole; what it did not write there is refused before any
    work, never deleted."""
    version = tmp_path / "repo" / "bert" / "1"
    version.mkdir(parents=True)
    vocab = version / "vocab.txt"
    shutil.copyfile(setup["vocab"], vocab)
    arguments = ["--init_checkpoint", str(setup["checkpoint"]), "--vocab_file", str(vocab), "--do_lower_case",
                 "--model_repository", str(tmp_path / "repo")]
    with pytest.raises(InputError, match=r"bert/1: this deploy replaces the folder, which holds --vocab_file"):
        deployer.main(arguments)
    shutil.copyfile(setup["vocab"], tmp_path / "vocab.txt")
    arguments[arguments.index(str(vocab))] = str(tmp_path / "vocab.txt")
    (version / "model.onnx").write_bytes(b"an earlier export")
    with pytest.raises(InputError, match=r"holds files it did not write \(vocab.txt\)"):
        deployer.main(arguments)
    assert sorted(p.name for p in version.iterdir()) == ["model.onnx", "vocab.txt"]
