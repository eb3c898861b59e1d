"""Training items of the HierarCaps Radial Embedding (RE) objective (`cglib.radial`): from HierarCaps or MAGIC.

An `REItem` holds K positives, general to specific, and K negatives, `negatives[i]` contradicting
`positives[i]` while entailing `positives[i - 1]`.

- `load_hierarcaps_train`: the authors' ~70k train hierarchies, `hierarcaps_train.csv.gz` (gzip CSV, columns
  `positive` and `negative`, four tiers each joined by " => ", general to specific; the last positive tier is
  a caption). Unusable rows are skipped and counted per reason, never dropped silently.

The same kind of items from a MAGIC DAG are built by `cglib.magic.re_items`. Both feed `loss: re` runs of
train.runs (`cglib.train.re_run`).
"""

from __future__ import annotations

import csv
import gzip
import logging
import zlib
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from cglib.data.coco import CaptionFileError, normalize_caption
from cglib.data.hierarcaps import LEVEL_SEPARATOR, N_LEVELS

logger = logging.getLogger(__name__)

TIER_SEPARATOR = LEVEL_SEPARATOR  # the train file joins its four tiers as the test CSV joins its levels
N_TIERS = N_LEVELS
REQUIRED_COLUMNS = ("positive", "negative")
TRAIN_FIX = "give the HierarCaps train file (`cglib download hierarcaps-train --dest DIR` fetches it)"


@dataclass(frozen=True)
class REItem:
    """One RE training item: K >= 2 positives general to specific, and one negative per tier."""

    positives: tuple[str, ...]
    negatives: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.positives) < 2 or len(self.positives) != len(self.negatives):
            raise ValueError(f"an REItem needs K >= 2 positives and as many negatives, got "
                             f"{len(self.positives)} and {len(self.negatives)}")


def _tiers(text: str | None) -> tuple[str, ...] | None:
    return None if text is None else tuple(normalize_caption(t) for t in text.split(TIER_SEPARATOR))


def load_hierarcaps_train(path: str | Path, limit: int | None = None) -> tuple[list[REItem], Counter]:
    """Read hierarcaps_train.csv.gz into REItems (file order, the first `limit` usable ones) and skip counts."""
    path = Path(path)
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise ValueError(f"limit must be a positive integer or None, got {limit!r}")
    if not path.is_file():
        raise FileNotFoundError(f"HierarCaps train file not found: {path}; {TRAIN_FIX}")
    items: list[REItem] = []
    skipped: Counter = Counter()
    try:
        with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
            reader = csv.DictReader(f)
            missing = [c for c in REQUIRED_COLUMNS if c not in (reader.fieldnames or [])]
            if missing:
                raise CaptionFileError(f"{path}: no column {missing[0]!r} (header: {reader.fieldnames}); "
                                       f"expected columns positive,negative; {TRAIN_FIX}")
            for row in reader:
                positives, negatives = _tiers(row["positive"]), _tiers(row["negative"])
                if positives is None or negatives is None:  # a short row leaves trailing fields as None
                    skipped["missing column"] += 1
                elif len(positives) != N_TIERS or len(negatives) != N_TIERS:
                    skipped["wrong number of tiers"] += 1
                elif not all(positives) or not all(negatives):
                    skipped["empty tier"] += 1
                else:
                    items.append(REItem(positives, negatives))
                    if limit is not None and len(items) == limit:
                        break
    except (OSError, EOFError, zlib.error, csv.Error, UnicodeDecodeError) as exc:
        raise CaptionFileError(f"{path} is not a readable gzip-compressed UTF-8 CSV ({exc}); delete it and "
                               f"{TRAIN_FIX}") from None
    message = (f"HierarCaps train {path.name}: kept {len(items)} items; skipped "
               f"{', '.join(f'{k}: {v}' for k, v in sorted(skipped.items())) or 'nothing'}")
    (logger.warning if skipped else logger.info)(message)
    if not items:
        raise ValueError(f"{path}: no usable row (skipped: {dict(skipped)}); {TRAIN_FIX}")
    return items, +skipped
