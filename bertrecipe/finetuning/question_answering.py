"""Answers to free questions about one context (not a SQuAD file), whatever computes the logits: the windows, the
document-only candidates and the result objects that inference.py (a PyTorch model or an ONNX export) and
triton/client.py (a Triton server) all print; and the logits of a fine-tuned PyTorch QA model (load_qa_model,
predict_logits, answer_questions).
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np
from torch import nn

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import model_loading, squad, squad_answers
from bertrecipe.finetuning.timed_inference import timed_inference
from bertrecipe.model.families import is_modern_config, question_answering_model
from bertrecipe.tokenization.basic_tokenizer import holds_no_text
from bertrecipe.tokenization.bpe import BpeVocab, FineTuningTokenizer
from bertrecipe.tokenization.wordpiece import Vocab
from bertrecipe.training.stepper import make_precision

# features -> start and end logits, float32 [N, L], of every window
LogitsFunction = Callable[[squad.SquadFeatures], tuple[np.ndarray, np.ndarray]]


# The defaults of NVIDIA's flags (both frozen dataclasses, so one instance serves every call).
DEFAULT_WINDOW = squad.WindowSettings()
DEFAULT_ANSWER = squad_answers.AnswerSettings()

def check_question(question: str, flag: str = "--question") -> None:
    """InputError for a question that tokenizes to nothing (empty, whitespace, control or zero-width characters):
    the model would answer "[CLS] [SEP] context [SEP]", an answer to nothing (SQuAD files refuse such questions
    too)."""
    if not question:
        raise InputError(f"{flag} is empty; ask a question")
    if holds_no_text(question):
        raise InputError(f"{flag} holds no text (only whitespace, control or zero-width characters, which tokenize "
                         "to nothing); ask a question")


def keep_document_logits(features: squad.SquadFeatures, logits: np.ndarray) -> np.ndarray:
    """Logits with every position outside the document part except [CLS] pushed to -10000, so that the n best
    starts and ends are all candidates. (run_squad.py ranks the question's tokens too, as the reference does;
    for a model whose logits there are not low, e.g. an untrained head, that can leave no valid span.)"""
    keep = features.token_to_orig >= 0
    keep[:, 0] = True
    return np.where(keep, logits, np.float32(-10000.0))


def answer_about_context(
    logits: LogitsFunction,
    tokenizer: Any,
    questions: Sequence[str],
    context: str,
    window: squad.WindowSettings = DEFAULT_WINDOW,
    answer: squad_answers.AnswerSettings = DEFAULT_ANSWER,
) -> list[dict[str, Any]]:
    """One result per question: {"question", "answer", "nbest", "windows"} (+ "null_odds" for SQuAD 2.0),
    the context covered by sliding windows, candidates taken from the document only. An empty question is an
    InputError (check_question)."""
    for question in questions:
        check_question(question, "the question")
    words, _ = squad.split_context(context)
    examples = [squad.SquadExample(str(i), q, words, [], context_id=0) for i, q in enumerate(questions)]
    features = squad.convert_examples_to_features(examples, tokenizer, window)
    if len(features) == 0:
        raise InputError("the context is empty (no word pieces); pass a non-empty --context or --context_file")
    start, end = logits(features)
    start, end = keep_document_logits(features, start), keep_document_logits(features, end)
    predictions = squad_answers.extract_answers(examples, features, start, end, tokenizer.vocab, answer)
    windows = np.bincount(features.example_index, minlength=len(examples))
    results = []
    for i, question in enumerate(questions):
        result: dict[str, Any] = {
            "question": question,
            "answer": predictions.answers[str(i)],
            "nbest": predictions.nbest[str(i)],
            "windows": int(windows[i]),
        }
        if answer.version_2_with_negative:
            result["null_odds"] = predictions.null_odds[str(i)]
        results.append(result)
    return results


def load_qa_model(
    init_checkpoint: Path, config_file: Optional[Path], vocab: Vocab | BpeVocab, max_seq_length: int,
    allow_vocab_mismatch: bool = False,
) -> nn.Module:
    """A question-answering model of the config's family (model/families.py) with the checkpoint's weights, in
    eval mode (run_squad's loading: the config comes from config_file or the checkpoint and must fit the vocab and
    the sequence length). A checkpoint without a QA head (e.g. a pre-trained one) loads with a warning: its answers
    are then meaningless."""
    config, weights = model_loading.config_and_weights(str(config_file) if config_file else None,
                                                       str(init_checkpoint))
    model = model_loading.build_model(question_answering_model, config, weights, str(init_checkpoint), vocab,
                                      max_seq_length, allow_vocab_mismatch)
    head = "classifier." if is_modern_config(config) else "qa_outputs."
    if weights is not None and not any(name.startswith(head) for name in weights.state_dict):
        print(f"warning: {init_checkpoint} has no QA head ({head.rstrip('.')}); answers come from an untrained head",
              file=sys.stderr)
    return model.eval()


def predict_logits(
    model: nn.Module, features: squad.SquadFeatures, batch_size: int, precision: str = "fp32"
) -> tuple[np.ndarray, np.ndarray]:
    """Start and end logits, float32 [N, L], of every window, batch_size windows at a time."""
    device = next(model.parameters()).device
    arrays = {"input_ids": features.input_ids, "segment_ids": features.segment_ids,
              "input_mask": features.input_mask}
    (start, end), _ = timed_inference(
        model, arrays, batch_size, make_precision(device, precision == "fp16", precision == "bf16"),
        lambda m, b: m(b["input_ids"], b["segment_ids"], b["input_mask"])[1:])
    return start, end


def answer_questions(
    model: nn.Module,
    tokenizer: FineTuningTokenizer,
    questions: Sequence[str],
    context: str,
    window: squad.WindowSettings = DEFAULT_WINDOW,
    answer: squad_answers.AnswerSettings = DEFAULT_ANSWER,
    batch_size: int = 8,
    precision: str = "fp32",
) -> list[dict[str, Any]]:
    """answer_about_context with this model's logits (predict_logits)."""
    return answer_about_context(lambda features: predict_logits(model, features, batch_size, precision),
                                tokenizer, questions, context, window, answer)
