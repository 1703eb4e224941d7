"""Dense retrieval: an embedding model of either family (BERT or ModernBERT; mean or [CLS] pooling, L2-normalised)
scored as BEIR scores it on a folder in BEIR's layout, optionally fine-tuned first with in-batch negatives, or
distilled from a teacher embedding model (--teacher_model: the MSE of the two models' embeddings of the training
pairs' texts, sentence-transformers' distillation).

    python run_retrieval.py --init_checkpoint DIR --vocab_file V [--do_lower_case] --data_dir BEIR_DIR
        --pooling mean --do_eval --output_dir OUT [--do_train --train_file PAIRS] [--export_embeddings]
        [--export_onnx]
    python run_retrieval.py --teacher_model TEACHER --student_layers 3 --vocab_file V [--do_lower_case]
        --data_dir BEIR_DIR --do_train --train_file PAIRS --do_eval --output_dir OUT

--data_dir holds corpus.jsonl, queries.jsonl and qrels/<--split>.tsv. --train_file is JSON Lines of {"query",
"positive"[, "negative"]} texts (a hard negative on every row or none), or a BEIR qrels file (a folder's
qrels/train.tsv: each judged-relevant pair). --init_checkpoint is our checkpoint, NVIDIA's, a pytorch_model.bin
or a Hugging Face folder (a sentence-transformers model's folder too: its encoder); --teacher_model takes the
same, and --student_layers N starts the student from N of the teacher's layers instead. Writes OUT/results.json
(ndcg@10, mrr@10, recall@100, the counts, pooling, checkpoint) after --do_eval; OUT/pytorch_model.bin +
bert_config.json (the encoder) after --do_train; corpus_embeddings.safetensors + corpus_ids.json with
--export_embeddings; model.onnx (encoder and pooling) with --export_onnx, its int8 form with --int8 as well
(for CPUs; docs/benchmarks.md has its speed and how close its embeddings stay). Every input is read and checked before
the first write (a refused run writes nothing) and the outputs are renamed into place together at the end.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any, NoReturn, Optional

from tqdm import tqdm

from bertrecipe.cli import finetuning_flags
from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.deploy.embedding_export import embeddings_safetensors, ids_json, onnx_bytes
from bertrecipe.deploy.quantization import quantized_bytes
from bertrecipe.distillation.embedding import EmbeddingDistillation
from bertrecipe.finetuning import beir_data
from bertrecipe.finetuning.embedding import (
    POOLINGS,
    EmbeddingModel,
    embedding_task_record,
    encode_texts,
    load_embedding_model,
)
from bertrecipe.finetuning.model_loading import config_and_weights, load_tokenizer
from bertrecipe.finetuning.retrieval_metrics import CUTOFFS, exact_search, retrieval_scores
from bertrecipe.finetuning.retrieval_training import RetrievalObjective, train_embeddings
from bertrecipe.finetuning.staged_outputs import MODEL_FILES, StagedOutputs, stage_finetuned
from bertrecipe.model.families import ModelConfig
from bertrecipe.model.weights import LoadedWeights, checkpoint_identity
from bertrecipe.tokenization.bpe import FineTuningTokenizer
from bertrecipe.training.metric_logger import MetricLogger
from bertrecipe.training.process_group import DistributedContext, init_distributed, shutdown
from bertrecipe.training.stepper import Precision, make_precision, seed_everything

EMBEDDING_FILES = ("corpus_embeddings.safetensors", "corpus_ids.json")
OUTPUTS = (*MODEL_FILES, "results.json", *EMBEDDING_FILES, "model.onnx")


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data_dir", required=True, help="a BEIR folder: corpus.jsonl, queries.jsonl, qrels/")
    p.add_argument("--split", default="test", help="the qrels file scored: qrels/<split>.tsv")
    p.add_argument("--pooling", default="mean", choices=POOLINGS)
    p.add_argument("--train_file", help="JSON Lines of query/positive[/negative], or a BEIR qrels/train.tsv")
    finetuning_flags.add_common_arguments(p, batch_size=32, learning_rate=2e-5, epochs=1.0, warmup=0.1)
    p.add_argument("--do_eval", action="store_true", help="nDCG@10, MRR@10 and recall@100 on --split")
    p.add_argument("--symmetric_loss", action="store_true", help="also pick each positive's query in the batch")
    p.add_argument("--max_seq_length", type=int, default=256, help="tokens of a query or document, [CLS]/[SEP] in")
    p.add_argument("--eval_batch_size", type=int, default=64)
    p.add_argument("--export_embeddings", action="store_true", help="corpus_embeddings.safetensors + corpus_ids.json")
    p.add_argument("--export_onnx", action="store_true", help="model.onnx: the encoder and its pooling")
    p.add_argument("--int8", action="store_true",
                   help="--export_onnx writes the int8 model (ONNX Runtime dynamic quantization of the linear layers, "
                        "for CPUs)")
    add_distillation_arguments(p)
    args = p.parse_args(argv)
    if not (args.do_train or args.do_eval or args.export_embeddings or args.export_onnx):
        raise InputError("nothing to do: pass --do_train, --do_eval, --export_embeddings and/or --export_onnx")
    check_distillation_flags(args)
    if not args.init_checkpoint and args.student_layers is None:
        raise InputError("--init_checkpoint is needed: the encoder to score or fine-tune")
    if args.int8 and not args.export_onnx:
        raise InputError("--int8 quantizes the ONNX export: add --export_onnx")
    if args.do_train and not args.train_file:
        raise InputError("--do_train needs --train_file (JSON Lines of pairs, or a BEIR qrels/train.tsv)")
    finetuning_flags.check_common_arguments(args)
    finetuning_flags.check_positive(args, "eval_batch_size")
    if args.max_seq_length < 3:
        raise InputError(f"--max_seq_length {args.max_seq_length} is too small: [CLS], [SEP] and a token need 3")
    check_retrieval_outputs(args)
    args.max_steps = int(args.max_steps)
    args.log_freq = max(1, args.log_freq)
    return args


def add_distillation_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--teacher_model", help="with --do_train: distil this embedding model (any checkpoint "
                   "--init_checkpoint takes) into the student, the MSE of their embeddings of the training pairs' "
                   "queries and documents, instead of in-batch negatives")
    p.add_argument("--teacher_pooling", choices=POOLINGS, help="the teacher's pooling (default: --pooling)")
    p.add_argument("--teacher_config_file", help="the teacher's config, where its checkpoint records none")
    p.add_argument("--student_layers", type=int, help="instead of --init_checkpoint: the student is the teacher "
                   "with this many of its layers (the uniform choice: every other one for half) and its embeddings")


def check_distillation_flags(args: argparse.Namespace) -> None:
    """--teacher_model and the flags that go with it (InputError naming them)."""
    if not args.teacher_model:
        given = [flag for flag in ("--teacher_pooling", "--teacher_config_file", "--student_layers")
                 if getattr(args, flag.removeprefix("--")) is not None]
        if given:
            raise InputError(f"{', '.join(given)} {'is a flag' if len(given) == 1 else 'are flags'} of embedding "
                             "distillation: add --teacher_model (the teacher to distil)")
        return
    if not args.do_train:
        raise InputError("--teacher_model distils during --do_train: add --do_train and --train_file")
    if args.symmetric_loss:
        raise InputError("--symmetric_loss is in-batch negatives' option, and --teacher_model trains by the MSE of "
                         "the embeddings: drop one of them")
    if args.student_layers is not None:
        if args.init_checkpoint or args.config_file:
            raise InputError("--student_layers starts the student from the teacher's layers, --init_checkpoint or "
                             "--config_file from a checkpoint of its own: give one of the two")
        finetuning_flags.check_positive(args, "student_layers")


def run_outputs(args: argparse.Namespace) -> list[str]:
    return [*(MODEL_FILES if args.do_train else ()), *(("results.json",) if args.do_eval else ()),
            *(EMBEDDING_FILES if args.export_embeddings else ()), *(("model.onnx",) if args.export_onnx else ())]


def check_retrieval_outputs(args: argparse.Namespace) -> None:
    """No output may be an input: the BEIR folder and its files, --train_file, the model's files."""
    data_dir = Path(args.data_dir)
    teacher = finetuning_flags.checkpoint_inputs("--teacher_model", args.teacher_model) if args.teacher_model else []
    inputs = [*finetuning_flags.model_inputs(args), *teacher, ("--teacher_config_file", args.teacher_config_file),
              ("--data_dir", data_dir), ("--train_file", args.train_file),
              *((f"the {name} of --data_dir", path)
                for name, path in beir_data.beir_files(data_dir, args.split).items())]
    if args.train_file and Path(args.train_file).suffix == ".tsv":  # a qrels file reads its folder's texts
        inputs += [(f"the {name} beside --train_file", path)
                   for name, path in beir_data.beir_files(Path(args.train_file).parent.parent, "train").items()]
    finetuning_flags.check_run_outputs(args, inputs, run_outputs(args))


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    ctx = init_distributed(args.no_cuda)
    try:
        if ctx.world_size != 1:
            raise InputError("run_retrieval.py runs in one process; launch it without torchrun")
        run(args, ctx)
    finally:
        shutdown(ctx)


def run(args: argparse.Namespace, ctx: DistributedContext) -> dict[str, Any]:
    """Reads every input, then trains, scores and exports as the flags ask; returns results.json's content. It
    writes nothing before every input has been read and checked."""
    precision = make_precision(ctx.device, args.fp16, args.bf16)
    objective = retrieval_objective(args)
    tokenizer = load_tokenizer(args.vocab_file, args.do_lower_case, args.allow_vocab_mismatch)
    config, weights, source = student_source(args, objective)
    needs_corpus = args.do_eval or args.export_embeddings
    split = beir_data.read_beir(Path(args.data_dir), args.split) if needs_corpus else None
    pairs = beir_data.read_training_pairs(Path(args.train_file)) if args.do_train else None
    seed_everything(args.seed)
    model = load_embedding_model(config, weights, source, tokenizer, args.max_seq_length, args.pooling,
                                 args.allow_vocab_mismatch).to(ctx.device)
    if pairs is not None:
        objective.check(model, tokenizer, args.max_seq_length, args.allow_vocab_mismatch)
    bar = not args.disable_progress_bar
    with finetuning_flags.locked_output_dir(args, ctx):
        log = MetricLogger(args.json_summary, printer=tqdm.write if bar else print)
        log.log("PARAMETER", {k: v for k, v in vars(args).items() if not k.startswith("_")}, echo=False)
        results: dict[str, Any] = {"pooling": args.pooling, "checkpoint": source,
                                   "checkpoint_sha256": checkpoint_identity(source)["sha256"] if source else None}
        with StagedOutputs(args.output_dir, OUTPUTS) as stage:
            if pairs is not None:
                model, trained = train(args, ctx, objective, model, tokenizer, pairs, precision, log)
                results.update(trained)
                weights_file = stage_finetuned(stage, model.encoder, config, tokenizer.vocab,
                                               embedding_task_record(args.pooling, args.max_seq_length))
                results["checkpoint_sha256"] = file_sha256(weights_file)  # the model these scores are of
            if split is not None:
                results.update(score_and_export(args, model, tokenizer, split, precision, stage))
            if args.do_eval:
                stage.write_json("results.json", results)
            if args.export_onnx:
                exported = onnx_bytes(model, args.max_seq_length)
                if args.int8:
                    exported = quantized_bytes(exported, "the embedding model's ONNX export")
                stage.write("model.onnx", lambda f: f.write(exported))
            stage.commit()
        log.log([], results)
        log.close()
    return results


def retrieval_objective(args: argparse.Namespace) -> RetrievalObjective:
    """Embedding distillation with --teacher_model (its teacher read here, before anything is written), else in-batch
    negatives."""
    if args.teacher_model:
        return EmbeddingDistillation(args.teacher_model, args.teacher_pooling or args.pooling,
                                     args.teacher_config_file)
    return RetrievalObjective(args.symmetric_loss)


def student_source(args: argparse.Namespace, objective: RetrievalObjective
                   ) -> tuple[ModelConfig, Optional[LoadedWeights], str]:
    """The model's config and weights and what to call them: --init_checkpoint's, or --student_layers of the
    teacher's."""
    if args.student_layers is not None and isinstance(objective, EmbeddingDistillation):
        return objective.student_start(args.student_layers)
    config, weights = config_and_weights(args.config_file, args.init_checkpoint)
    return config, weights, str(args.init_checkpoint)


def train(args: argparse.Namespace, ctx: DistributedContext, objective: RetrievalObjective, model: EmbeddingModel,
          tokenizer: FineTuningTokenizer, pairs: beir_data.TrainingPairs, precision: Precision, log: MetricLogger
          ) -> tuple[EmbeddingModel, dict[str, Any]]:
    """The objective's trainable model, trained on the pairs, and what results.json records of the training."""
    settings = finetuning_flags.finetuning_loop_settings(args, not args.disable_progress_bar)
    arrays = objective.arrays(tokenizer, pairs, args.max_seq_length)
    trained = objective.trainable(model)
    results = train_embeddings(trained, arrays, settings, precision, ctx, log, objective)
    results.update(objective.record())
    results["hard_negatives"] = pairs.negatives is not None
    return trained, results


def score_and_export(args: argparse.Namespace, model: EmbeddingModel, tokenizer: FineTuningTokenizer,
                     split: beir_data.BeirSplit, precision: Precision, stage: StagedOutputs) -> dict[str, Any]:
    """The corpus and the queries embedded; the scores (with --do_eval) and the corpus embeddings (with
    --export_embeddings) staged."""
    progress = None if args.disable_progress_bar else "corpus"
    start = time.perf_counter()
    corpus = encode_texts(model, tokenizer, split.corpus_texts, args.max_seq_length, args.eval_batch_size,
                          precision, progress)
    results: dict[str, Any] = {"corpus_documents": len(split.corpus_ids),
                               "corpus_encode_time": time.perf_counter() - start}
    if args.export_embeddings:
        stage.write("corpus_embeddings.safetensors", lambda f: f.write(embeddings_safetensors(corpus, args.pooling)))
        stage.write_text("corpus_ids.json", ids_json(split.corpus_ids))
    if args.do_eval:
        queries = encode_texts(model, tokenizer, split.query_texts, args.max_seq_length, args.eval_batch_size,
                               precision, None if progress is None else "queries")
        ranking = exact_search(queries, corpus, split.query_ids, split.corpus_ids, max(CUTOFFS.values()))
        results.update(retrieval_scores(split.qrels, ranking))
        results.update({"queries": len(split.query_ids), "split": args.split,
                        "dataset": Path(args.data_dir).resolve().name})  # the BEIR folder's name, e.g. scifact
    return results


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
