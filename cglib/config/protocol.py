"""The paper as published and as corrected: every params key where what the authors' code did and our correction
(or our choice, where the paper is silent) differ, and the umbrella `run.protocol` that sets them all.

`run.protocol: as_published` gives each key below the authors' value, `corrected` (the default) ours; a key the
params file sets itself wins over the umbrella. Keys of the train section are filled when the file is read (so
`cglib validate` and the run's provenance show them); an objective's option (`train.runs[].options.<key>`) is left
null in the entry and filled by the objective when the run's spec is built (`Objective.resolve_options`), for
every run whose objective takes it. The evaluation needs no switch: every run scores both protocols
(`forced_choice_published`, `hierarcaps_published`). The guide's page "Paper fidelity" (book/fidelity.md) lists
each difference with its key; `tests/test_protocol.py` fails when a key here is missing from it.
`UNKEYED_DIFFERENCES` (at the end) names the smaller differences that no key switches, one per row of that page's
table "Differences that are not protocol keys"; the same test fails when a name and a row do not match.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

PROTOCOLS = ("corrected", "as_published")
OPTION_PREFIX = "train.runs[].options."


@dataclass(frozen=True)
class Difference:
    """One key where the published procedure and ours differ: its two values, what it changes, whose line it is."""

    key: str  # a params path; OPTION_PREFIX + name: an option of every run entry whose objective takes it
    as_published: Any
    corrected: Any
    what: str
    source: str


DIFFERENCES: tuple[Difference, ...] = (
    Difference("magic.generalize", "level", "image", "generalized captions (LLM_gen): one request per image and "
               "level, given that level's concept alone, one caption each at temperature 0.7 (the image's captions: "
               "its l1..l4 level captions) vs one request per image with its l1 concept and ancestors and "
               "llm.generalized_captions_per_image captions at llm.temperature",
               "authors' generate_new_caption.py (generate_level_captions, ChatOpenAI temperature 0.7); their "
               "generate.ipynb generates per l1 group and never fills the concept in (not an f-string)"),
    Difference("train.weight_decay", 4.5269353639276774e-05, 0.2, "AdamW weight decay (matrices only)",
               "authors' params.py: --wd default 4.53e-5; ours: open_clip's fine-tuning default"),
    Difference("train.warmup_steps", 1430, 100, "linear warmup steps before the cosine decay",
               "authors' params.py: --warmup default 1430"),
    Difference("train.adam_betas", (0.9, 0.999), (0.9, 0.98), "AdamW betas",
               "authors' params.py get_default_params: (0.9, 0.98) only when the model name contains 'vit', and "
               "'open_clip' does not"),
    Difference("train.adam_eps", 1e-8, 1e-6, "AdamW epsilon", "authors' params.py get_default_params (as betas)"),
    Difference("train.amp", "auto_fp16", "auto", "precision on GPU: fp16 autocast with GradScaler vs bf16 (CPU runs "
               "are fp32 under both)", "authors' main.py: precision amp with torch.cuda.amp.GradScaler"),
    Difference("train.epoch", "pairs_as_published", "pairs", "the image-text epoch: the authors' drops incomplete "
               "chunks and concepts with fewer than M-1 hard negatives, makes every remaining chunk the anchor of "
               "one step in a shuffled order, draws negatives with replacement, always their first chunk, and "
               "skips a step whose drawn negative concept was itself dropped (its item comes back empty); ours "
               "pads, keeps them with fallbacks, draws random chunks without replacement and trains every step",
               "authors' data.py TrainConceptDataset (an item is a whole batch: the anchor chunk and its M-1 "
               "negative chunks), train_collate_fn (M*N rows), get_dataset (the DataLoader's batch size "
               "args.batch_size, overridden to 1 for dataset_type train; drop_last) and train.py (the M groups of "
               "each collated item; `continue` on an empty one)"),
    Difference("train.mask_identical_texts", False, True, "whether identical texts of an image-text batch are kept "
               "from being each other's negatives (with M-1 hard-negative groups a caption can recur in a batch)",
               "authors' train.py and loss.py: open_clip ClipLoss and their group losses, labels = arange, no mask"),
    Difference("train.augment", "open_clip_train", "none", "the images of every image-text step: a random "
               "resized crop (90-100% of the area, aspect 3/4-4/3, bicubic: open_clip's training transform) vs the "
               "eval crop every time", "authors' main.py (create_model_and_transforms' preprocess_train feeds "
               "get_train_data)"),
    Difference("train.pretrain_pairs", "as_published", "distinct_targets", "textual pretraining's batches and "
               "temperature: every caption with every target in shuffled batches, unmasked, learned logit scale vs "
               "distinct targets (at most one per group) at the fixed tau", "authors' data.py PretrainDataset, "
               "pretrain.py (ClipLoss with model.logit_scale.exp(), clamp_(0, ln 100))"),
    Difference("train.pretrain_features", "raw", "normalized", "the features textual pretraining's loss sees: "
               "the text tower's unnormalized outputs (the logits scale with their norms) vs unit-norm embeddings",
               "authors' pretrain.py (model.encode_text outputs into open_clip's ClipLoss; encode_text does not "
               "normalize unless asked)"),
    Difference("train.pretrain_targets", "with_concepts", "leakage_free", "the texts the captions are pretrained "
               "against in a run entry with pretrain: true: generalized captions and the l1-l4 names (the evaluation "
               "queries: such rows are marked exposed) vs generalized captions only",
               "authors' data.py PretrainDataset (new_captions, then level1..level4)"),
    Difference("train.pretrain_epochs", 7, 1, "epochs of textual pretraining", "authors' pretrain_configuration.yml"),
    Difference("train.pretrain_lr", 1.8748186634898305e-05, 1e-5, "learning rate of textual pretraining",
               "authors' pretrain_configuration.yml"),
    Difference("train.tau_inner", 0.07, 0.1, "inner temperature tau' of the group losses (the paper gives none)",
               "authors' loss.py fixes 0.07"),
    Difference(OPTION_PREFIX + "logit_scale", "learned", "fixed", "the CLIP baseline's temperature: the model's "
               "logit scale trained with the towers (clamped at ln 100) vs the fixed tau of every loss here",
               "authors' train.py: open_clip ClipLoss with model.logit_scale.exp(), clamp_(0, ln 100)"),
    Difference(OPTION_PREFIX + "hierarcaps_features", "raw", "normalized", "the features the CLIP loss sees in a "
               "run that fine-tunes the HierarCaps model (its init chain reaches a loss: re run): the towers' "
               "unnormalized outputs vs unit-norm features, as in every other run and loss",
               "authors' train.py lines 133-138 and 162: their HierarCaps model is a transformers CLIPModel, whose "
               "get_image_features / get_text_features outputs go into open_clip's ClipLoss unnormalized (their "
               "open_clip models' forward normalizes)"),
    Difference(OPTION_PREFIX + "alpha_on", "outer", "inner", "which term alpha weighs in the group losses",
               "paper Eqs. 4, 8: alpha * inner; authors' loss.py: alpha * outer"),
    Difference(OPTION_PREFIX + "normalize_products", True, False, "the pairwise loss's group centroids: normalized "
               "mean of normalized combined vectors vs Eq. 1's mean of the raw ones", "paper Eq. 1; authors' loss.py"),
)


def protocol_value(key: str, protocol: str) -> Any:
    """The value `protocol` gives `key`."""
    if protocol not in PROTOCOLS:
        raise ValueError(f"run.protocol must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
    difference = next((d for d in DIFFERENCES if d.key == key), None)
    if difference is None:
        raise KeyError(f"{key} is not a protocol key; the keys are {', '.join(d.key for d in DIFFERENCES)}")
    return difference.as_published if protocol == "as_published" else difference.corrected


def apply_protocol(raw: Any) -> Any:
    """A params mapping with the train-section keys it leaves unset filled from its run.protocol."""
    if not isinstance(raw, dict):
        return raw
    run = raw.get("run")
    protocol = run.get("protocol", "corrected") if isinstance(run, dict) else "corrected"
    if protocol not in PROTOCOLS:
        return raw  # the run section's own validation names the problem
    out = dict(raw)
    for d in DIFFERENCES:
        section, _, name = d.key.partition(".")
        if d.key.startswith(OPTION_PREFIX) or not isinstance(out.get(section, {}), dict):
            continue
        given = dict(out.get(section) or {})
        if name not in given:
            given[name] = protocol_value(d.key, protocol)
            out[section] = given
    return out


def option_keys(options: type[BaseModel]) -> list[str]:
    """The fields of an objective's Options model that are protocol keys (null: the run.protocol's value)."""
    keys = {d.key[len(OPTION_PREFIX):] for d in DIFFERENCES if d.key.startswith(OPTION_PREFIX)}
    return [name for name in options.model_fields if name in keys]


def protocol_options(options: BaseModel, protocol: str) -> dict[str, Any]:
    """The protocol keys an objective's options leave null, with the values `protocol` gives them."""
    return {name: protocol_value(OPTION_PREFIX + name, protocol) for name in option_keys(type(options))
            if getattr(options, name) is None}


def protocol_lines(params: Any) -> list[str]:
    """What `cglib validate` prints: the run's protocol and each protocol key's value in these params, marked where
    the file sets another value than the protocol gives (an option key: the entries that set it themselves)."""
    protocol = params.run.protocol
    lines = [f"run.protocol: {protocol} (a key the file sets itself is marked 'set in the file')"]
    for d in DIFFERENCES:
        value = protocol_value(d.key, protocol)
        if d.key.startswith(OPTION_PREFIX):
            name = d.key[len(OPTION_PREFIX):]
            own = [f"{e.name}: {e.options[name]}" for e in params.train.runs
                   if isinstance(e.options, dict) and name in e.options and e.options[name] != value]
            note = f" (set in the file by {', '.join(own)})" if own else ""
            lines.append(f"  {d.key}: {value} for every run whose objective takes it{note}")
            continue
        section, _, name = d.key.partition(".")
        given = getattr(getattr(params, section), name)
        same = given == value or (isinstance(value, tuple) and tuple(given) == value)
        lines.append(f"  {d.key}: {given}{'' if same else ' (set in the file)'}")
    return lines


# The smaller differences between the authors' code and ours that no key switches (book/fidelity.md, "Differences
# that are not protocol keys": one row each, this name as its first cell): what each changes and why it is no key.
UNKEYED_DIFFERENCES: tuple[str, ...] = (
    "text phase warmup",
    "non-finite steps",
    "first chunk order",
    "missing images",
    "as-published MAGIC evaluation drops",
    "log floors",
    "fp16 losses",
)
