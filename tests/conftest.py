"""Shared test fixtures: the location of ../shared/data and small model configurations."""
import os
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = Path(os.environ.get("BERT_SHARED_DATA", REPO_ROOT.parent / "shared" / "data"))


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real data folder for tests; tests that need it are skipped, with the reason, where it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared test data not found at {SHARED_DATA} (set BERT_SHARED_DATA)")
    return SHARED_DATA


def write_formatted(articles, path: Path) -> Path:
    """Formatted text as text_formatting writes it: one article a line, a blank line after each."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(" ".join(a.split()) + "\n\n" for a in articles), encoding="utf-8")
    return path
