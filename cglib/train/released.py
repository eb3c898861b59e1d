"""HierarCaps' released weights as the Table 3 HierarCaps row (`train.runs[i].options.released` of a loss: re run).

Alper and Averbuch-Elor released their RE-aligned CLIP as transformers CLIPModel state dicts over
`openai/clip-vit-base-patch32`; RE trains the text tower and its projection only, so the row is the base with
their text tower. An HF model (`model.source: hf`) takes the state dict's text keys as they are; the paper
profile's open_clip ViT-B-32 takes them through `hf_clip.open_clip_text_state`. A file that does not exist means
"not present": the run trains its own RE model instead, and every summary says which it is (`weights_source`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cglib import hf_clip
from cglib.config import TrainRunParams
from cglib.models import ClipModel
from cglib.run import file_digest

TRAINED_HERE = "trained here"


def released_file(entry: TrainRunParams) -> Path | None:
    """The run's released-weights file (options.released of a loss: re run; None for any other)."""
    return getattr(entry.options, "released", None)


def released_present(entry: TrainRunParams) -> bool:
    path = released_file(entry)
    return path is not None and path.is_file()


def load_released(bundle: ClipModel, entry: TrainRunParams) -> dict[str, Any]:
    """Put the released text tower into `bundle` (in place); the record for the run summary."""
    key, path = f"train.runs[{entry.name}].options.released", released_file(entry)
    state = hf_clip.read_state_dict(path, key=key)
    if bundle.text_tower == "hf":
        text = {k: v for k, v in state.items() if k.startswith(("text_model.", "text_projection."))
                and not k.endswith("position_ids")}
    else:
        text = hf_clip.open_clip_text_state(state, source=f"{key} {path}")
    own = bundle.model.state_dict()
    wrong = sorted(k for k in text if k not in own or tuple(own[k].shape) != tuple(text[k].shape))
    if wrong:
        raise ValueError(f"{key} {path} does not fit the model's text tower ({len(wrong)} keys missing or "
                         f"of another shape, e.g. {wrong[:2]}); HierarCaps' weights are OpenAI's ViT-B/32: set "
                         "model.name: ViT-B-32 with pretrained: openai (or source: hf, openai/clip-vit-base-patch32)")
    bundle.model.load_state_dict(text, strict=False)
    return {"kind": "released", "path": str(path), "sha256": file_digest(path, "sha256"),
            "text_keys_loaded": len(text), "of_state_dict_keys": len(state)}
