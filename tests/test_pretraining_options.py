"""The time-to-accuracy options of run_pretraining.py (issue 16), each off by default: --no_nsp, --masked_lm_prob
with dynamic masking, --train_budget_minutes and --eval_interval_minutes, --pretrain_dropout and --compile; and
the NVIDIA defaults that must stay what runs without them."""
import copy
import itertools
import math

import pytest
import torch

from bertrecipe.cli import run_pretraining as run_pretraining_command
from bertrecipe.model.bert import BertConfig, BertForPreTraining, BertForSequenceClassification
from bertrecipe.model.weights import load_weights_into, read_weights
from bertrecipe.pretraining import session
from bertrecipe.pretraining.data import BertPretrainingCriterion
from bertrecipe.pretraining.startup import build_pretraining_model
from bertrecipe.training.metric_logger import read_log
from bertrecipe.training.optimization import TimeBudgetScheduler
from bertrecipe.training.process_group import DistributedContext
from bertrecipe.training.stepper import seed_everything
from helpers import TINY, final_record, pretrain, step_records

REQUIRED = ["--input_dir", "in", "--config_file", "c.json", "--output_dir", "out", "--do_train"]
NSP_PARTS = ("bert.pooler.", "cls.seq_relationship.")


@pytest.fixture(scope="module")
def run_pretraining():
    return run_pretraining_command


def test_nvidia_defaults_are_pinned(run_pretraining):
    """NVIDIA DeepLearningExamples' run_pretraining.py defaults, and every time-to-accuracy option off."""
    args = run_pretraining.parse_args(REQUIRED)
    nvidia = {"max_seq_length": 512, "max_predictions_per_seq": 80, "train_batch_size": 32, "learning_rate": 5e-5,
              "num_train_epochs": 3.0, "max_steps": 1000, "warmup_proportion": 0.01, "seed": 42,
              "gradient_accumulation_steps": 1, "loss_scale": 0.0, "log_freq": 1, "num_steps_per_checkpoint": 100,
              "phase1_end_step": 7038, "init_loss_scale": 2.0**20, "fp16": False, "checkpoint_activations": False}
    assert {key: getattr(args, key) for key in nvidia} == nvidia
    options = {"no_nsp": False, "dynamic_masking": False, "masked_lm_prob": 0.15, "train_budget_minutes": 0.0,
               "eval_interval_minutes": 0.0, "pretrain_dropout": None, "compile": False,
               "compile_optimizer": None}  # None: the fused LAMB update where it pays (same numbers, see below)
    assert {key: getattr(args, key) for key in options} == options


@pytest.mark.parametrize("extra, fragment", [
    (["--masked_lm_prob", "0.3"], "add --dynamic_masking"),
    (["--dynamic_masking", "--masked_lm_prob", "0"], "--masked_lm_prob must lie in (0, 1]"),
    (["--pretrain_dropout", "1"], "--pretrain_dropout must lie in [0, 1)"),
    (["--train_budget_minutes", "-1"], "--train_budget_minutes must be a number of minutes >= 0"),
    (["--train_budget_minutes", "nan"], "--train_budget_minutes must be a number of minutes >= 0"),
    (["--eval_interval_minutes", "1"], "needs --do_train and --eval_dir"),
    (["--sharding", "fsdp", "--allreduce_post_accumulation_fp16"], "compresses DDP's all-reduce"),
    (["--sharding", "fsdp", "--compile_optimizer"], "updates shards"),
])
def test_bad_option_values_are_one_line_errors(run_pretraining, extra, fragment):
    from bertrecipe.common.errors import InputError

    with pytest.raises(InputError, match=fragment.replace("(", r"\(").replace("[", r"\[").replace(")", r"\)")):
        run_pretraining.parse_args(REQUIRED + extra)


def tiny_batch(config: BertConfig, batch: int = 4, seq: int = 32) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(5, config.vocab_size, (batch, seq), generator=generator)
    mask = torch.ones_like(ids)
    mask[1, 20:] = 0
    labels = torch.full_like(ids, -1)
    labels[:, 2:18:3] = ids[:, 2:18:3]
    return {"input_ids": ids, "segment_ids": torch.zeros_like(ids), "input_mask": mask, "masked_lm_labels": labels,
            "next_sentence_labels": torch.tensor([0, 1, 1, 0])[:batch]}


def test_no_nsp_loss_is_the_masked_lm_term_alone(run_pretraining):
    config = BertConfig(**TINY)
    model = BertForPreTraining(config).eval()
    batch = tiny_batch(config)
    torch.set_grad_enabled(False)
    output = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                   masked_lm_labels=batch["masked_lm_labels"], next_sentence_labels=batch["next_sentence_labels"])
    mlm_only = BertPretrainingCriterion(nsp=False)(model, batch)
    both = BertPretrainingCriterion()(model, batch)
    assert torch.equal(mlm_only, output.masked_lm_loss)
    assert torch.allclose(both, output.masked_lm_loss + output.next_sentence_loss)
    assert float(output.next_sentence_loss) > 0.1  # so that the two differ
    torch.set_grad_enabled(True)


def initial_weights(seed: int = 42) -> dict[str, torch.Tensor]:
    """The weights a fresh run starts from: run_pretraining seeds with --seed (+ rank) before building the model."""
    seed_everything(seed)
    return BertForPreTraining(BertConfig(**TINY)).state_dict()


@pytest.mark.slow
@pytest.mark.parametrize("nproc", [1, 2])
def test_no_nsp_trains_the_rest_keeps_the_nsp_head_and_loads_for_fine_tuning(corpus, tmp_path, nproc):
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 3, "--no_nsp", "--pretrain_dropout", 0,
             nproc=nproc)  # with 2 processes DDP must not wait for the frozen head's gradients
    checkpoint = torch.load(tmp_path / "ckpt_3.pt", weights_only=True)
    start = initial_weights()
    for name, value in checkpoint["model"].items():
        if name.startswith(NSP_PARTS):
            assert torch.equal(value, start[name]), name
    assert not torch.equal(checkpoint["model"]["bert.encoder.layer.0.attention.self.query.weight"],
                           start["bert.encoder.layer.0.attention.self.query.weight"])
    # The saved config keeps the file's dropout for fine-tuning, and a classifier loads the whole encoder.
    assert checkpoint["config"]["hidden_dropout_prob"] == TINY["hidden_dropout_prob"]
    classifier = BertForSequenceClassification(BertConfig(**TINY), num_labels=2)
    missing = load_weights_into(classifier, read_weights(tmp_path / "ckpt_3.pt"))
    assert set(missing) <= {"classifier.weight", "classifier.bias"}
    assert torch.equal(classifier.bert.pooler.dense.weight, start["bert.pooler.dense.weight"])


@pytest.mark.slow
def test_resume_refuses_a_change_of_no_nsp(corpus, tmp_path):
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 4, "--steps_this_run", 2)
    result = pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 4, "--resume_from_checkpoint",
                      "--no_nsp", check=False)
    assert result.returncode != 0
    assert "was trained without --no_nsp" in result.stderr and "Traceback" not in result.stderr


def model_settings(command, extra=()):
    """The model's settings that the command builds from REQUIRED and `extra` flags (a BERT config)."""
    return command.settings_for(command.parse_args(REQUIRED + list(extra)), BertConfig(**TINY)).model


def test_pretrain_dropout_replaces_the_configs_dropout_in_the_model_only(run_pretraining):
    config = BertConfig(**TINY)
    model = build_pretraining_model(model_settings(run_pretraining, ["--pretrain_dropout", "0"]), config,
                                    torch.device("cpu")).train()
    batch = tiny_batch(config)
    first, second = (model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                           masked_lm_labels=batch["masked_lm_labels"]).loss for _ in range(2))
    assert torch.equal(first, second)  # no dropout left in training mode
    assert config.hidden_dropout_prob == TINY["hidden_dropout_prob"]  # the run's (and checkpoint's) config
    default = build_pretraining_model(model_settings(run_pretraining), config, torch.device("cpu")).train()
    first, second = (default(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                             masked_lm_labels=batch["masked_lm_labels"]).loss for _ in range(2))
    assert not torch.equal(first, second)


@pytest.mark.slow
def test_masked_lm_prob_draws_more_predictions_than_the_shards_hold(corpus, tmp_path):
    # The shards hold 10 predictions of 64 tokens; at 0.3 a full row asks round(64 * 0.3) = 19.
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 2, "--dynamic_masking",
             "--masked_lm_prob", 0.3, "--max_predictions_per_seq", 19, "--log_freq", 1)
    assert (tmp_path / "ckpt_2.pt").exists()
    rp = run_pretraining_command
    args = rp.parse_args(["--input_dir", str(corpus / "p1"), "--config_file", "c", "--output_dir", "o", "--do_train",
                          "--max_seq_length", "64", "--dynamic_masking", "--masked_lm_prob", "0.3",
                          "--max_predictions_per_seq", "19"])
    config = BertConfig(**TINY)
    settings = rp.settings_for(args, config)
    shards, _ = session.inspect_inputs(settings, config, DistributedContext(0, 0, 1, torch.device("cpu")))
    spec = session.masking_spec(settings.stream, shards, config, None, settings.model.no_nsp)
    assert shards[0].max_predictions == 10 and spec.max_predictions == 19 and spec.masked_lm_prob == 0.3
    capped = pretrain(corpus, tmp_path / "capped", "--train_batch_size", 8, "--max_steps", 1, "--dynamic_masking",
                      "--masked_lm_prob", 0.3)
    assert "--max_predictions_per_seq 10 caps --masked_lm_prob 0.3" in capped.stderr


def test_time_budget_schedule_follows_the_clock():
    parameter = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([parameter], lr=2.0)
    scheduler = TimeBudgetScheduler(optimizer, warmup=0.25, budget_seconds=100)
    expected = {0.0: 0.0, 12.5: 1.0, 25.0: 2.0, 62.5: 1.0, 100.0: 0.0, 130.0: 0.0}
    for elapsed, lr in expected.items():
        scheduler.elapsed_seconds = elapsed
        scheduler.step()
        assert math.isclose(optimizer.param_groups[0]["lr"], lr, abs_tol=1e-12), elapsed
    # A resume builds it at the checkpoint's clock and loads the step count: the lr is the clock's.
    restored = TimeBudgetScheduler(torch.optim.SGD([parameter], lr=2.0), warmup=0.25, budget_seconds=100,
                                   elapsed_seconds=40.0)
    restored.load_state_dict(scheduler.state_dict())
    assert math.isclose(restored.get_last_lr()[0], 2.0 * 60 / 75)


def budget_stop(log_path):
    return [r["data"] for r in read_log(log_path) if r.get("step") == "PARAMETER" and "stopped_by" in r["data"]]


@pytest.mark.slow
def test_budget_stops_on_time_with_a_checkpoint_and_resumes_with_what_is_left(corpus, tmp_path):
    budget = 0.1  # minutes
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 100000, "--train_budget_minutes", budget,
             "--num_steps_per_checkpoint", 100000, "--log_freq", 1)
    steps, final = step_records(tmp_path / "log.json"), final_record(tmp_path / "log.json")
    last = max(step for _, step in steps)
    assert 3 <= last < 100000
    assert budget_stop(tmp_path / "log.json") == [{"stopped_by": "train_budget", "global_step": last}]
    step_seconds = max(8 / record["training_sequences_per_second"] for record in steps.values())
    assert budget * 60 <= final["train_minutes"] * 60 <= budget * 60 + step_seconds + 0.5
    checkpoint = torch.load(tmp_path / f"ckpt_{last}.pt", weights_only=True)
    assert checkpoint["train_seconds"] >= budget * 60
    lrs = [steps[key]["learning_rate"] for key in sorted(steps)]
    assert max(lrs) == pytest.approx(2e-2, rel=0.3) and lrs[-1] < 0.3 * max(lrs)  # warmed up, then decayed
    # The same budget again: nothing is left, no step is taken. A larger one goes on from the checkpoint.
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 100000, "--train_budget_minutes", budget,
             "--resume_from_checkpoint")
    assert max(step for _, step in step_records(tmp_path / "log.json")) == last
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 100000, "--train_budget_minutes",
             budget * 1.5, "--num_steps_per_checkpoint", 100000, "--resume_from_checkpoint")
    steps = step_records(tmp_path / "log.json")
    resumed_last = max(step for _, step in steps)
    assert resumed_last > last and (tmp_path / f"ckpt_{resumed_last}.pt").exists()
    finals = [r["data"] for r in read_log(tmp_path / "log.json") if r.get("step") == []]  # one a run
    assert len(finals) == 3 and finals[-1]["train_minutes"] >= budget * 1.5


@pytest.mark.slow
def test_evaluation_every_interval_of_training_time(corpus, tmp_path):
    pretrain(corpus, tmp_path, "--train_batch_size", 8, "--max_steps", 100000, "--train_budget_minutes", 0.1,
             "--eval_interval_minutes", 0.025, "--eval_dir", corpus / "eval", "--do_eval",
             "--num_steps_per_checkpoint", 100000)
    minutes = [r["data"]["train_minutes"] for r in read_log(tmp_path / "log.json")
               if isinstance(r.get("step"), list) and r["step"] and "eval_mlm_accuracy" in r["data"]]
    assert len(minutes) >= 3
    assert all(later - earlier >= 0.025 * 0.9 for earlier, later in itertools.pairwise(minutes))
    assert minutes[0] >= 0.025


@pytest.mark.slow
def test_compiled_and_eager_models_give_the_same_loss_and_gradients():
    config = BertConfig(**{**TINY, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0})
    eager = BertForPreTraining(config)
    compiled = copy.deepcopy(eager)
    compiled.compile()
    batch = tiny_batch(config)
    losses = []
    for model in (eager, compiled):
        loss = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                     masked_lm_labels=batch["masked_lm_labels"],
                     next_sentence_labels=batch["next_sentence_labels"]).loss
        loss.backward()
        losses.append(float(loss))
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    eager_grads = dict(eager.named_parameters())
    for name, param in compiled.named_parameters():
        assert torch.allclose(param.grad, eager_grads[name].grad, atol=1e-5, rtol=1e-4), name
    assert list(compiled.state_dict()) == list(eager.state_dict())  # checkpoints keep their names


@pytest.mark.slow
def test_compile_flag_compiles_the_model_in_place(run_pretraining):
    config = BertConfig(**TINY)
    compiled = build_pretraining_model(model_settings(run_pretraining, ["--compile"]), config, torch.device("cpu"))
    eager = build_pretraining_model(model_settings(run_pretraining), config, torch.device("cpu"))
    assert isinstance(compiled, BertForPreTraining) and compiled._compiled_call_impl is not None
    assert eager._compiled_call_impl is None


@pytest.mark.slow
def test_fused_lamb_is_the_default_for_large_models_on_cpu_and_falls_back_cleanly(monkeypatch, capsys):
    from bertrecipe.training import optimization

    small = [{"params": [torch.nn.Parameter(torch.zeros(1000))]}]
    large = [{"params": [torch.nn.Parameter(torch.zeros(optimization.COMPILE_LAMB_MIN_PARAMETERS))]}]
    assert optimization.compiled_lamb_works(torch.device("cpu")) is None  # this machine compiles (CI's too)
    assert optimization.choose_compiled_lamb(small, None) is False  # compiling would cost more than it saves
    assert optimization.choose_compiled_lamb(large, False) is False  # --no_compile_optimizer
    monkeypatch.setattr(optimization, "compiled_lamb_works", lambda device: None)
    assert optimization.choose_compiled_lamb(large, None) is True
    assert optimization.choose_compiled_lamb(small, True) is True  # --compile_optimizer
    monkeypatch.setattr(optimization, "compiled_lamb_works",
                        lambda device: "InvalidCxxCompiler: no working C++ compiler")
    assert optimization.choose_compiled_lamb(large, None) is False
    assert "cannot fuse the LAMB update here (InvalidCxxCompiler" in capsys.readouterr().err
