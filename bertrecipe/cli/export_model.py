"""Release a checkpoint: one folder that transformers (AutoTokenizer, AutoModelForMaskedLM, ...ForQuestionAnswering,
...ForSequenceClassification, pipeline), sentence-transformers and ONNX Runtime load with no code of ours, with a card.

    python scripts/export_model.py SRC OUT --vocab_file V [--do_lower_case] [--embedding --pooling mean|cls]
        [--onnx [--int8]] [--results FILE ...] [--license L] [--language L ...] [--datasets D ...]

SRC is any checkpoint the recipe loads, of either family: pre-trained (run_pretraining.py, general_distill.py), fine-
tuned (run_glue.py, run_squad.py, task_distill.py), a retrieval model (run_retrieval.py), NVIDIA's, or a Hugging Face
folder. OUT gets config.json (the class, the labels, the task), model.safetensors, the tokenizer files (casing,
special tokens, maximum length), for an embedding model the sentence-transformers files, with --onnx
onnx/model.onnx (and onnx/model_quantized.onnx with --int8), README.md (the model card) and release.json (the
source's sha256 and every file's). The card's figures come only from records: the checkpoint's own, the manifest of
its shards, and --results (run_downstream.py or run_retrieval.py results.json of this very checkpoint, matched by
sha256). Before OUT takes its name, the folder's weights are read back and must give the source's outputs.

OUT is written whole or not at all; an existing release is replaced only with --overwrite (and only one this
command wrote), and a failure leaves it whole. docs/release.md walks from a checkpoint to a published model.
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path
from typing import Any, NoReturn, Optional

from bertrecipe.cli.command_line import ArgumentParser, run_cli
from bertrecipe.common.errors import InputError
from bertrecipe.common.files import file_sha256
from bertrecipe.common.output_paths import inside, refuse_input_as_output
from bertrecipe.finetuning.embedding import POOLINGS
from bertrecipe.model.families import is_modern_config
from bertrecipe.model.weights import huggingface_parts, load_weights_into, model_for_weights, read_config, read_weights
from bertrecipe.pretraining.run_tokenizer import released_vocab_file
from bertrecipe.release.card import CardFacts, card_text
from bertrecipe.release.folder import check_release_target, release_folder, write_release_record
from bertrecipe.release.model_files import (
    NSP_FILE,
    ReleaseKind,
    release_config,
    release_kind,
    release_weights,
    sentence_transformers_files,
    weights_bytes,
)
from bertrecipe.release.records import Score, SourceRecords, read_release_scores, read_source_records, training_facts
from bertrecipe.release.signature import check_same_outputs, release_onnx_bytes
from bertrecipe.tokenization.vocab_files import (
    identity_from_record,
    identity_of,
    load_vocab_file,
    refuse_other_tokenizer,
    wordpiece_lower_case,
)
from bertrecipe.tokenization.wordpiece import ALLOW_VOCAB_MISMATCH, Vocab, check_vocab_for_model


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
    p = ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path, help="the checkpoint: a file (ours, NVIDIA's) or a Hugging Face folder")
    p.add_argument("out", type=Path, help="the release folder to write")
    p.add_argument("--vocab_file", type=Path, help="the model's vocab.txt or tokenizer.json (default: SRC's own)")
    p.add_argument("--do_lower_case", action=argparse.BooleanOptionalAction,
                   help="a WordPiece vocab's casing (default: what its tokens or its record tell)")
    p.add_argument("--config_file", type=Path, help="the model's config, where SRC carries none (NVIDIA's)")
    p.add_argument("--embedding", action="store_true", help="release the encoder as a sentence-transformers model")
    p.add_argument("--pooling", choices=POOLINGS, help="the embedding's pooling (default: the checkpoint's, or mean)")
    p.add_argument("--max_seq_length", type=int, help="the embedding's maximum length (default: the checkpoint's)")
    p.add_argument("--onnx", action="store_true", help="also onnx/model.onnx (transformers' input and output names)")
    p.add_argument("--int8", action="store_true", help="with --onnx: also onnx/model_quantized.onnx (int8, CPUs)")
    p.add_argument("--results", type=Path, nargs="+", default=[],
                   help="run_downstream.py or run_retrieval.py results.json files of this checkpoint")
    p.add_argument("--model_name", help="the name the card uses (default: OUT's folder name)")
    p.add_argument("--license", help="the licence to state, as given (e.g. apache-2.0)")
    p.add_argument("--language", nargs="+", default=[], help="languages to state, as given (e.g. en)")
    p.add_argument("--datasets", nargs="+", default=[], help="datasets to state, as given")
    p.add_argument("--base_model", help="the model this one was trained from, as given")
    p.add_argument("--overwrite", action="store_true", help="replace a release this command wrote at OUT")
    p.add_argument(ALLOW_VOCAB_MISMATCH, action="store_true", help="warn instead of refusing a vocab that does not "
                                                                  "fit the model")
    args = p.parse_args(argv)
    if args.int8 and not args.onnx:
        raise InputError("--int8 quantizes the ONNX export: add --onnx")
    if (args.pooling or args.max_seq_length) and not args.embedding:
        raise InputError("--pooling and --max_seq_length describe an embedding model: add --embedding")
    return args


def check_paths(args: argparse.Namespace, vocab_file: Path) -> None:
    """Before anything is read or written: SRC exists, OUT may be written, and no input lies in OUT."""
    if not args.src.exists():
        raise InputError(f"{args.src}: no such checkpoint file or folder")
    check_release_target(args.out, args.overwrite)
    inputs = [("SRC", args.src), ("--vocab_file", vocab_file), ("--config_file", args.config_file),
              *(("--results", path) for path in args.results)]
    refuse_input_as_output(args.out, "OUT", inputs, fix="choose another folder")
    for flag, path in inputs:
        if path is not None and inside(path, args.out):
            raise InputError(f"{args.out}: holds {flag} {path}, which a release there would replace; choose "
                             "another folder")


def vocab_description(vocab: Any, lower_case: Optional[bool]) -> str:
    if isinstance(vocab, Vocab):
        return f"{len(vocab):,} WordPiece tokens, {'uncased' if lower_case else 'cased'}"
    return f"{len(vocab):,} byte-level BPE tokens"


def release_files(args: argparse.Namespace, model: Any, kind: ReleaseKind, vocab_file: Path,
                  lower_case: Optional[bool]) -> tuple[dict[str, bytes], list[str], int]:
    """Every file of the release but the card and release.json, the card's notes, and the parameter count."""
    modern = is_modern_config(model.config)
    config, state, tokenizer_files = huggingface_parts(model, vocab_file, lower_case)
    state, side, notes = release_weights(state, kind, modern)
    files = {"config.json": (json.dumps(release_config(config, kind), indent=2) + "\n").encode("utf-8"),
             "model.safetensors": weights_bytes(state), **tokenizer_files}
    if side:
        files[NSP_FILE] = weights_bytes(side)
    if kind.is_embedding:
        files.update(sentence_transformers_files(kind, model.config.hidden_size))
    if args.onnx:
        files["onnx/model.onnx"] = release_onnx_bytes(model, kind)
        if args.int8:
            from bertrecipe.deploy.quantization import quantized_bytes

            files["onnx/model_quantized.onnx"] = quantized_bytes(files["onnx/model.onnx"], "the release's ONNX export")
    parameters = sum(tensor.numel() for tensor in state.values())
    return files, notes, parameters


def card_facts(args: argparse.Namespace, model: Any, kind: ReleaseKind, vocab: Any, lower_case: Optional[bool],
               records: SourceRecords, scores: list[Score], notes: list[str], parameters: int,
               files: list[str]) -> CardFacts:
    config = model.config
    sizes = {"layers": config.num_hidden_layers, "hidden": config.hidden_size, "heads": config.num_attention_heads,
             "intermediate": config.intermediate_size, "max_length": config.max_position_embeddings,
             "parameters": parameters}
    return CardFacts(name=args.model_name or args.out.resolve().name, kind=kind,
                     family="ModernBERT" if is_modern_config(config) else "BERT", sizes=sizes,
                     vocab=vocab_description(vocab, lower_case), training=training_facts(records),
                     manifest=records.manifest, scores=scores, notes=notes, files=files, license=args.license,
                     language=args.language, datasets=args.datasets, base_model=args.base_model)


def write_files(folder: Path, files: dict[str, bytes]) -> None:
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(content)


def main(argv: Optional[list[str]] = None) -> None:
    args = parse_args(argv)
    vocab_file = args.vocab_file or released_vocab_file(args.src)
    if vocab_file is None:
        raise InputError(f"{args.src}: holds no vocab.txt or tokenizer.json; pass --vocab_file (the model's vocab)")
    check_paths(args, vocab_file)
    weights = read_weights(args.src)
    config = read_config(args.config_file) if args.config_file else weights.config
    if config is None:
        raise InputError(f"{args.src}: carries no model config; pass --config_file bert_config.json")
    vocab = load_vocab_file(vocab_file)
    check_vocab_for_model(vocab, model_vocab_size=config.vocab_size, do_lower_case=args.do_lower_case,
                          allow_mismatch=args.allow_vocab_mismatch)
    refuse_other_tokenizer(identity_of(vocab), identity_from_record(weights.tokenizer, str(args.src)),
                           "pass the vocab the checkpoint was trained with", args.allow_vocab_mismatch)
    lower_case = wordpiece_lower_case(vocab, args.do_lower_case) if isinstance(vocab, Vocab) else None
    model = model_for_weights(weights, config)
    load_weights_into(model, weights, args.src)
    model.eval()
    records = read_source_records(args.src)
    kind = release_kind(model, records.payload.get("task"), args.embedding, args.pooling, args.max_seq_length)
    scores = [score for path in args.results for score in read_release_scores(path, records.sha256)]
    files, notes, parameters = release_files(args, model, kind, vocab_file, lower_case)
    facts = card_facts(args, model, kind, vocab, lower_case, records, scores, notes, parameters, sorted(files))
    files["README.md"] = card_text(facts).encode("utf-8")
    with release_folder(args.out, args.overwrite) as staging:
        write_files(staging, files)
        check_same_outputs(model, staging, kind)  # the folder's weights, read back, give the source's outputs
        write_release_record(staging, release_record(args, records, vocab_file, kind))
    print(f"{args.src} -> {args.out}: {kind.architecture} ({kind.pipeline_tag}), {len(files) + 1} files",
          flush=True)


def release_record(args: argparse.Namespace, records: SourceRecords, vocab_file: Path,
                   kind: ReleaseKind) -> dict[str, Any]:
    return {"created_by": "bertrecipe scripts/export_model.py", "date": datetime.date.today().isoformat(),
            "source": str(args.src), "source_sha256": records.sha256, "vocab_file": str(vocab_file),
            "vocab_sha256": file_sha256(vocab_file), "pipeline_tag": kind.pipeline_tag,
            "architecture": kind.architecture,
            "results": {str(path): file_sha256(path) for path in args.results}, "command": sys.argv}


def cli() -> NoReturn:
    """The command line (root script and console script): main's bad-input errors as one line and exit 2."""
    run_cli(main)
