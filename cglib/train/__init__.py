"""Training: group batches, open_clip models, AMP, checkpoints, textual pretraining, DDP (see loop.py's map).

Names are imported lazily, so `cglib.train.sampler` (pure Python + NumPy) loads without torch and open_clip.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "loop": ["LOG_COLUMNS", "ZERO_SHOT", "TrainInputs", "base_record", "ensure_initial", "load_trained",
             "model_image_size", "run_spec", "seed_label", "summary_table", "train_all", "train_one",
             "weights_moved_note"],
    "pretrain": ["TextPairSampler", "exposed_to_eval_strings"],
    "processes": ["train_runs"],
    "sampler": ["GroupBatch", "GroupBatchSampler"],
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}
__all__ = [name for names in _EXPORTS.values() for name in names]


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module 'cglib.train' has no attribute {name!r}")
    return getattr(importlib.import_module(f"cglib.train.{_WHERE[name]}"), name)


def __dir__() -> list[str]:
    return __all__
