"""SQuAD as a fine-tuning task, beside the features it reads (squad.py): the arrays, loss and logits the loops and
timed inference take, the answers of a predict file's features, the check that a file can be scored, and the
scores of predictions (squad_metrics.py's official metric, or an evaluation script)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import numpy as np
import torch

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import squad, squad_answers
from bertrecipe.finetuning.squad_metrics import prediction_scores
from bertrecipe.finetuning.timed_inference import latency_summary, timed_inference
from bertrecipe.tokenization.bpe import FineTuningTokenizer
from bertrecipe.training.stepper import Precision

PREDICTION_FILES = ("predictions.json", "nbest_predictions.json", "null_odds.json")  # the last one: SQuAD 2.0


def squad_task_record(version_2: bool) -> dict[str, Any]:
    """What a SQuAD-fine-tuned model does, as its checkpoint records it."""
    return {"kind": "question-answering", "name": "squad-v2.0" if version_2 else "squad-v1.1"}


def qa_arrays(features: squad.SquadFeatures, with_positions: bool) -> dict[str, np.ndarray]:
    """The model's inputs of every window (with the answer positions, for training)."""
    arrays = {"input_ids": features.input_ids, "segment_ids": features.segment_ids,
              "input_mask": features.input_mask}
    if with_positions:
        arrays.update(start_positions=features.start_positions, end_positions=features.end_positions)
    return arrays


def qa_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """A batch's loss: the mean of the start and end positions' cross-entropies."""
    return model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                 batch["start_positions"], batch["end_positions"])[0]


def qa_logits(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch's start and end logits."""
    _, start, end = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    return start, end


def predict_answers(model: torch.nn.Module, tokenizer: FineTuningTokenizer, examples: list[squad.SquadExample],
                    features: squad.SquadFeatures, batch_size: int, precision: Precision,
                    settings: squad_answers.AnswerSettings, progress_bar: bool
                    ) -> tuple[squad_answers.SquadPredictions, dict[str, Any]]:
    """The answers of the features' questions, and the timings of the inference that gave them."""
    (start, end), latencies = timed_inference(model, qa_arrays(features, False), batch_size, precision, qa_logits,
                                              progress_bar)
    predictions = squad_answers.extract_answers(examples, features, start, end, tokenizer.vocab, settings)
    return predictions, {**latency_summary(latencies, len(features)), "predict_features": len(features)}


def prediction_contents(predictions: squad_answers.SquadPredictions, version_2: bool) -> dict[str, Any]:
    """The prediction files' contents by name, as squad_answers.write_predictions lays them out."""
    files = {"predictions.json": predictions.answers, "nbest_predictions.json": predictions.nbest}
    if version_2:
        files["null_odds.json"] = predictions.null_odds
    return files


def check_scorable(squad_file: squad.SquadFile) -> None:
    """--do_eval scores with the metric of the file's own version, as the official scripts do: any file needs a
    question, a SQuAD 1.1 file a gold answer for every question. Checked before a run writes anything."""
    data, path = squad_file.data, squad_file.path
    try:
        questions = [qa for article in data["data"] for paragraph in article["paragraphs"]
                     for qa in paragraph["qas"]]
        unanswered = [] if squad.is_squad_v2(data) else [qa["id"] for qa in questions if not qa["answers"]]
    except (KeyError, TypeError, AttributeError) as error:
        raise InputError(f"{path}: not a SQuAD file ({type(error).__name__}: {error})") from None
    if not questions:
        raise InputError(f"{path}: no questions to score; --do_eval needs at least one")
    if unanswered:
        raise InputError(f"{path}: question {unanswered[0]!r} ({len(unanswered)} in all) has no gold "
                         "answer, which the SQuAD 1.1 metric cannot score; mark such questions "
                         '"is_impossible": true (SQuAD 2.0) or drop --do_eval')


def score_prediction_files(squad_file: squad.SquadFile, files: dict[str, Path], version_2: bool,
                           eval_script: Optional[str] = None) -> dict[str, float]:
    """exact_match and F1 of the prediction files (by name: predictions.json, and null_odds.json for SQuAD 2.0
    where it exists) against the SQuAD file, by the official metric or by eval_script."""
    null_odds = files.get("null_odds.json") if version_2 else None
    na_file = null_odds if null_odds is not None and null_odds.is_file() else None
    return prediction_scores(squad_file, files["predictions.json"], na_file, eval_script)
