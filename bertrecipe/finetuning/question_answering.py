"""Answers to free questions about one context (not a SQuAD file), whatever computes the logits: the windows, the
document-only candidates and the result objects that inference.py (a PyTorch model) and triton/client.py (a
Triton server) both print.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from bertrecipe.finetuning import squad
from bertrecipe.finetuning import squad_answers
from bertrecipe.common.errors import InputError

# features -> start and end logits, float32 [N, L], of every window
LogitsFunction = Callable[[squad.SquadFeatures], tuple[np.ndarray, np.ndarray]]


def check_question(question: str, flag: str = "--question") -> None:
    """InputError for an empty or whitespace-only question: the model would answer "[CLS] [SEP] context [SEP]",
    an answer to nothing (SQuAD files refuse such questions too)."""
    if not question.strip():
        raise InputError(f"{flag} is {'only whitespace' if question else 'empty'}; ask a question")


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
    window: squad.WindowSettings = squad.WindowSettings(),
    answer: squad_answers.AnswerSettings = squad_answers.AnswerSettings(),
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
