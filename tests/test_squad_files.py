"""Reading SQuAD files (words, character offsets, v2 questions, bad input) and the feature cache."""
import json
import zipfile

import numpy as np
import pytest

from bertrecipe.common.errors import InputError
from bertrecipe.finetuning import squad
from bertrecipe.tokenization.wordpiece import BertTokenizer, load_vocab
from helpers import TEST_DATA

EXCERPT = TEST_DATA / "squad"  # a few real dev articles of each version (README.md there)


def write_squad(path, paragraphs, version="1.1"):
    path.write_text(json.dumps({"version": version, "data": [{"title": "t", "paragraphs": paragraphs}]}), "utf-8")
    return path


PARAGRAPH = {
    "context": " The  quick\u202fbrown fox\n(jumped) over.",
    "qas": [
        {"id": "a", "question": "What jumped?", "answers": [{"text": "brown fox", "answer_start": 12}]},
        {"id": "b", "question": "What did it do?", "answers": [{"text": "jumped", "answer_start": 23},
                                                               {"text": "(jumped)", "answer_start": 22}]},
    ],
}


def test_split_context_gives_words_and_the_word_of_every_character():
    words, char_to_word = squad.split_context(PARAGRAPH["context"])
    assert words == ["The", "quick", "brown", "fox", "(jumped)", "over."]
    assert len(char_to_word) == len(PARAGRAPH["context"])
    assert char_to_word[0] == -1  # leading space
    for index, char in enumerate(PARAGRAPH["context"]):
        if not char.isspace() and char != "\u202f":
            assert char in words[char_to_word[index]]


def test_read_examples_locates_every_answer_in_words(tmp_path):
    examples = squad.read_squad_examples(write_squad(tmp_path / "d.json", [PARAGRAPH]), is_training=False)
    assert [e.qas_id for e in examples] == ["a", "b"]
    assert examples[0].doc_tokens is examples[1].doc_tokens and examples[0].context_id == examples[1].context_id
    first = examples[0].answers[0]
    assert (first.start_word, first.end_word) == (2, 3)
    assert [(a.start_word, a.end_word) for a in examples[1].answers] == [(4, 4), (4, 4)]


def test_training_skips_an_answer_that_is_not_in_its_words(tmp_path, caplog):
    bad = {"id": "c", "question": "?", "answers": [{"text": "cat", "answer_start": 12}]}
    paragraph = dict(PARAGRAPH, qas=PARAGRAPH["qas"] + [bad])
    path = write_squad(tmp_path / "d.json", [paragraph])
    assert [e.qas_id for e in squad.read_squad_examples(path, is_training=True)] == ["a", "b"]
    assert "'c'" in caplog.text
    assert len(squad.read_squad_examples(path, is_training=False)) == 3


def test_v2_impossible_questions(tmp_path):
    impossible = {"id": "n", "question": "Why?", "answers": [], "is_impossible": True}
    path = write_squad(tmp_path / "d.json", [dict(PARAGRAPH, qas=PARAGRAPH["qas"] + [impossible])], "v2.0")
    examples = squad.read_squad_examples(path, is_training=True, version_2_with_negative=True)
    assert [e.is_impossible for e in examples] == [False, False, True]
    with pytest.raises(InputError, match="'n' has no answer .*version_2_with_negative"):
        squad.read_squad_examples(path, is_training=True, version_2_with_negative=False)
    assert squad.is_squad_v2(squad.read_squad_file(path).data)


def test_squad_version_is_recognized_from_the_file():
    assert not squad.is_squad_v2(squad.read_squad_file(EXCERPT / "dev-v1.1.json").data)
    v2 = squad.read_squad_file(EXCERPT / "dev-v2.0.json").data
    assert squad.is_squad_v2(v2)
    del v2["version"]
    assert squad.is_squad_v2(v2)  # from is_impossible


def read_dev_files(squad_dir) -> tuple[list, list]:
    """Both dev files of squad_dir, every example checked against the JSON it was read from."""
    read = []
    for version, v2 in (("1.1", False), ("2.0", True)):
        path = squad_dir / f"dev-v{version}.json"
        examples = squad.read_squad_examples(path, is_training=False, version_2_with_negative=v2)
        qas = [qa for a in json.loads(path.read_text("utf-8"))["data"] for p in a["paragraphs"] for qa in p["qas"]]
        assert [e.qas_id for e in examples] == [qa["id"] for qa in qas]
        assert [e.is_impossible for e in examples] == [qa.get("is_impossible", False) for qa in qas]
        assert [[a.text for a in e.answers] for e in examples] == [[a["text"] for a in qa["answers"]] for qa in qas]
        read.append(examples)
    return read[0], read[1]


def test_real_dev_excerpts_read_completely():
    v1, v2 = read_dev_files(EXCERPT)
    assert len(v1) == 90 and len(v2) == 92  # as tests/data/squad/README.md counts them
    assert sum(e.is_impossible for e in v2) == 62


def test_real_dev_files_read_completely(shared_data):
    v1, v2 = read_dev_files(shared_data / "squad")
    assert len(v1) == 10570 and len(v2) == 11873
    assert sum(e.is_impossible for e in v2) == 5945


@pytest.mark.parametrize(
    "content, message",
    [
        ('{"data": [', "malformed JSON"),
        ('{"version": "1.1"}', "expected an object with a 'data' list"),
        ('{"data": [{"paragraphs": [{"qas": []}]}]}', "article 0 paragraph 0: missing key 'context'"),
        ('{"data": [{"paragraphs": [{"context": "abc", "qas": [{"id": "x", "question": "q", "answers": '
         '[{"text": "bcd", "answer_start": 1}]}]}]}]}', "question 'x': answer 'bcd' at 1 lies outside the context"),
    ],
)
def test_bad_squad_files_are_input_errors_naming_the_file(tmp_path, content, message):
    path = tmp_path / "bad.json"
    path.write_text(content, "utf-8")
    with pytest.raises(InputError) as error:
        squad.read_squad_examples(path, is_training=False)
    assert str(error.value).startswith(str(path)) and message in str(error.value)


@pytest.mark.parametrize("question", ["", "   ", "\n\t\u3000", None, "\u200b\ufeff", "\x00\x1b"])
@pytest.mark.parametrize("is_training", [True, False])
def test_empty_question_is_an_input_error_naming_the_file_and_the_question(tmp_path, question, is_training):
    # Before, "" was read as a question and became windows "[CLS] [SEP] context [SEP]" without a word of it.
    empty = {"id": "q-empty", "question": question, "answers": [{"text": "brown fox", "answer_start": 12}]}
    path = write_squad(tmp_path / "d.json", [dict(PARAGRAPH, qas=PARAGRAPH["qas"] + [empty])])
    with pytest.raises(InputError) as error:
        squad.read_squad_examples(path, is_training=is_training)
    message = str(error.value)
    assert message.startswith(f"{path}: question 'q-empty': the question text is {question!r}")
    assert "\n" not in message
    assert [e.question_text for e in squad.read_squad_examples(write_squad(path, [PARAGRAPH]), is_training)] == [
        "What jumped?", "What did it do?"]  # real questions are read as they are


@pytest.mark.parametrize("is_training", [True, False])
def test_one_id_for_two_questions_is_refused_naming_both_places(tmp_path, is_training):
    """Predictions are keyed by id: the second question of an id took the first one's answer, and both were scored
    against it (issue 48: records that contradict each other inside one input)."""
    other = {"context": "A lazy dog slept.", "qas": [
        {"id": "a", "question": "Who slept?", "answers": [{"text": "A lazy dog", "answer_start": 0}]}]}
    path = write_squad(tmp_path / "d.json", [PARAGRAPH, other])
    with pytest.raises(InputError) as error:
        squad.read_squad_examples(path, is_training=is_training)
    assert str(error.value) == (f"{path}: question 'a': given twice, in article 0 paragraph 0 and in article 0 "
                                "paragraph 1, for different questions or contexts; predictions are keyed by id: give "
                                "each question an id of its own")
    same = write_squad(tmp_path / "same.json", [PARAGRAPH, PARAGRAPH])  # one entry twice: one question
    assert len(squad.read_squad_examples(same, is_training=is_training)) == 4


def test_missing_and_non_utf8_files(tmp_path):
    with pytest.raises(InputError, match="file not found"):
        squad.read_squad_examples(tmp_path / "absent.json", is_training=False)
    (tmp_path / "latin1.json").write_bytes('{"data": ["café"]}'.encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        squad.read_squad_examples(tmp_path / "latin1.json", is_training=False)


# ---------------------------------------------------------------------------------------------------------
# Cache
# ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tokenizer(vocab_file):
    return BertTokenizer(load_vocab(vocab_file), do_lower_case=True)


def test_cache_key_changes_with_everything_that_affects_features(tokenizer):
    base = dict(data_sha256="0" * 64, vocab=tokenizer.vocab, do_lower_case=True,
                settings=squad.WindowSettings(), is_training=True, version_2_with_negative=False)
    key = squad.features_cache_key(**base)
    changes = [
        dict(data_sha256="1" * 64), dict(do_lower_case=False), dict(is_training=False),
        dict(version_2_with_negative=True), dict(settings=squad.WindowSettings(max_seq_length=256)),
        dict(settings=squad.WindowSettings(doc_stride=64)), dict(settings=squad.WindowSettings(max_query_length=32)),
    ]
    keys = {squad.features_cache_key(**{**base, **change}) for change in changes}
    assert key not in keys and len(keys) == len(changes)
    assert squad.features_cache_key(**base) == key
    other_vocab = squad.features_cache_key(**{**base, "vocab": type(tokenizer.vocab)(
        tokenizer.vocab.path, tokenizer.vocab.tokens, tokenizer.vocab.ids, "f" * 64)})
    assert other_vocab != key


def test_cache_round_trip_without_pickle(tmp_path, tokenizer):
    path = write_squad(tmp_path / "d.json", [PARAGRAPH])
    examples = squad.read_squad_examples(path, is_training=True)
    settings = squad.WindowSettings(max_seq_length=32, doc_stride=4, max_query_length=8)
    cache_dir = tmp_path / "cache"
    built = squad.cached_features(examples, tokenizer, settings, True, path, False, cache_dir)
    [cache_file] = list(cache_dir.iterdir())
    with np.load(cache_file, allow_pickle=False) as npz:  # plain arrays only
        assert {"input_ids", "token_to_orig", "cache_key"} <= set(npz.files)
    loaded = squad.cached_features([], tokenizer, settings, True, path, False, cache_dir)  # no examples needed
    for name in ("input_ids", "input_mask", "segment_ids", "start_positions", "end_positions",
                 "example_index", "token_to_orig", "token_is_max_context"):
        assert np.array_equal(getattr(loaded, name), getattr(built, name))
        assert getattr(loaded, name).dtype == getattr(built, name).dtype
    # Changed data: a new key, so a new file, not the old features.
    write_squad(path, [dict(PARAGRAPH, context=PARAGRAPH["context"] + " More.")])
    squad.cached_features(examples, tokenizer, settings, True, path, False, cache_dir)
    assert len(list(cache_dir.iterdir())) == 2


def test_damaged_or_foreign_cache_is_rebuilt(tmp_path, tokenizer):
    path = write_squad(tmp_path / "d.json", [PARAGRAPH])
    examples = squad.read_squad_examples(path, is_training=False)
    settings = squad.WindowSettings(max_seq_length=32, doc_stride=4, max_query_length=8)
    built = squad.cached_features(examples, tokenizer, settings, False, path, False, tmp_path)
    [cache_file] = list(tmp_path.glob("*.npz"))
    cache_file.write_bytes(cache_file.read_bytes()[:100])  # truncated
    assert squad.load_features(cache_file, "any") is None
    rebuilt = squad.cached_features(examples, tokenizer, settings, False, path, False, tmp_path)
    assert np.array_equal(rebuilt.input_ids, built.input_ids)
    assert zipfile.is_zipfile(cache_file)  # rewritten whole
    assert squad.load_features(cache_file, "another key") is None
