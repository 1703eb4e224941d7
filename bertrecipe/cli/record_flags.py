"""The flags that say which records of Parquet, JSON Lines and Arrow inputs are documents, shared by
create_pretraining_data.py and bertPrep.py (defined once, so both have the same names, defaults and help), and the
Selection they make (dataprep/records.py)."""
from __future__ import annotations

import argparse

from bertrecipe.common.errors import DataError
from bertrecipe.dataprep.records import Selection, parse_filter

RECORD_FLAGS = ("text_field", "filter", "min_chars", "max_chars", "dedup")  # their dests, left out of other settings


def add_record_arguments(p: argparse.ArgumentParser) -> None:
    records = p.add_argument_group("records (Parquet, JSON Lines, Arrow inputs)")
    records.add_argument("--text_field", default="text", help="the column or field that holds the text (default text)")
    records.add_argument("--filter", action="append", default=[], metavar="COLUMN OP VALUE",
                         help="keep a record only where it holds, e.g. 'score>=3.5' or language==en (OP: >= <= == != "
                              "> <; numbers compare as numbers); repeat for several")
    records.add_argument("--min_chars", type=int, default=0, help="drop documents of fewer characters")
    records.add_argument("--max_chars", type=int, help="drop documents of more characters")
    records.add_argument("--dedup", action="store_true",
                         help="drop a document whose text (Unicode NFC, whitespace runs as one space) came before")


def selection_from(a: argparse.Namespace) -> Selection:
    """The Selection of the parsed record flags; bounds that keep nothing are refused in one line."""
    if a.min_chars < 0 or (a.max_chars is not None and a.max_chars < max(a.min_chars, 1)):
        raise DataError("--min_chars/--max_chars", f"{a.min_chars}/{a.max_chars}: need 0 <= min <= max and max >= 1")
    return Selection(a.text_field, tuple(parse_filter(f) for f in a.filter), a.min_chars, a.max_chars, a.dedup)
