"""What users and students read names no tracker item: the project's issues are not theirs to look up."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# "issue #32", "issues #21 and #32", "(#44)", "task 12": the project's own tracker. Another project's issue named
# with its project ("ipywidgets issue 3270") is a reference a reader can follow and stays.
TRACKER = re.compile(r"\b(?:issues?|tasks?)\s+#?\d+|\(#\d+\)|#\d+ item", re.IGNORECASE)
OTHER_PROJECT = re.compile(r"\b(?:ipywidgets|jupyterlab|open_clip|optuna|papermill|pytorch|torch)\s+(?:issue|pull)",
                           re.IGNORECASE)


def reader_files() -> list[Path]:
    files = [REPO / "README.md", *REPO.glob("book/**/*.md"), *REPO.glob("params/*.yaml"),
             *REPO.glob("notebooks/*.ipynb"), *REPO.glob("cglib/**/*.py"), *REPO.glob("cglib/**/*.yaml"),
             *REPO.glob("outputs/README.md")]
    return sorted(f for f in files if f.is_file())


def tracker_mentions(text: str) -> list[str]:
    """The tracker references in a text, once another project's "<project> issue N" is taken out."""
    return [m.group(0) for line in text.splitlines() for m in TRACKER.finditer(OTHER_PROJECT.sub("", line))]


def test_no_reader_facing_file_names_a_tracker_item():
    """README, the book, params, notebooks and the library's own text (docstrings, comments, messages)."""
    files = reader_files()
    assert len(files) > 100
    hits = {str(f.relative_to(REPO)): found for f in files if (found := tracker_mentions(f.read_text(encoding="utf-8")))}
    assert not hits, hits


def test_the_check_finds_tracker_items_and_keeps_other_projects_references():
    assert tracker_mentions('"""What changes (issue #32 item 3, the training side)."""') == ["issue #32"]
    assert tracker_mentions("related: bool = False  # a related method (issue #21): a row") == ["issue #21"]
    assert tracker_mentions("as asked in (#44)") == ["(#44)"]
    assert tracker_mentions("(ipywidgets issue 3270; the fix, ipywidgets pull request 4015)") == []
    assert tracker_mentions("notebook 05 trains 3 seeds; step 7 of 9") == []
