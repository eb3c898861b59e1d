"""The forced choice on the MAGIC test images (cglib/evaluate/forced_choice.py): the paper's protocol fixed
(`forced_choice`) and as the authors' code ran it (`forced_choice_published`), both in every run."""

from __future__ import annotations

from dataclasses import dataclass

from cglib.evaluate.benchmarks.base import Benchmark, EvalContext, Key, Scored, image_vectors
from cglib.evaluate.embeddings import Embeddings
from cglib.evaluate.forced_choice import (
    ForcedChoiceSet,
    pooled_scores,
    sample_forced_choice,
    score_forced_choice,
)
from cglib.evaluate.gallery import MetricScores
from cglib.evaluate.items import TextField

DIRECTIONS = ("t2i", "i2t")


@dataclass
class ForcedChoiceItems:
    """Per text field, its forced-choice sets, one per evaluation seed."""

    fields: list[TextField]
    sets: dict[str, list[ForcedChoiceSet]]
    benchmark: str = "forced_choice"

    def key(self, f: TextField, direction: str) -> Key:
        return (self.benchmark, f.labels, direction, "accuracy", f.key)


class ForcedChoice(Benchmark):
    name = "forced_choice"
    sampling = "corrected"  # forced_choice.PROTOCOLS
    protocol = (
        "Each test image with one of its texts of a type is put against M-1 negatives (eval.choices = M), each "
        "from a different hard-negative group of its l1 group and bringing its own image and its own text of the "
        "same type; a negative may not carry the anchor's text, nor may its text be one of the anchor's; ties "
        "count as wrong; negatives are drawn at random without replacement, per seed. Text->image: the text must "
        "score its own image strictly highest; image->text likewise. Chance = 1/M. Items that cannot get M-1 "
        "valid negatives are counted in results.json (items.forced_choice_excluded). The authors' code instead "
        "resolves ties in the anchor's favour, samples negatives with replacement, always takes the first item of "
        "the negative concept, and allows negatives whose ancestor string at l2-l4 equals the anchor's.")

    def prepare(self, context: EvalContext) -> ForcedChoiceItems:
        """Sampled once per evaluation seed, shared by every model."""
        p = context.params.eval
        fields = context.items.fields
        return ForcedChoiceItems(fields, {f.name: [sample_forced_choice(context.items, f, p.choices, seed,
                                                                        p.negative_source, self.sampling)
                                                   for seed in p.seeds] for f in fields}, self.name)

    def texts(self, items: ForcedChoiceItems) -> list[str]:
        return sorted({t for f in items.fields for texts in f.texts for t in texts})

    def score(self, items: ForcedChoiceItems, emb: Embeddings, context: EvalContext) -> Scored:
        images = image_vectors(emb, context.items.image_ids)
        units = context.image_units
        out = Scored({})
        for f in items.fields:
            sets = items.sets[f.name]
            t2i, i2t = zip(*(score_forced_choice(s, images, emb.text_vectors, emb.text_index) for s in sets))
            chance = 1.0 / sets[0].choices
            for direction, correct in zip(DIRECTIONS, (t2i, i2t)):
                key = items.key(f, direction)
                out.scores[key] = MetricScores(pooled_scores(sets, list(correct), units), chance)
                out.per_seed[key] = [float(c.mean()) if c.size else float("nan") for c in correct]
        return out

    def excluded(self, items: ForcedChoiceItems, per_model: dict[str, dict]) -> dict[Key, int]:
        out = {}
        for f in items.fields:
            n_out = sum(sum(s.excluded.values()) for s in items.sets[f.name])  # (seed, item) queries left out
            out.update({items.key(f, direction): n_out for direction in DIRECTIONS})
        return out

    def describe(self, items: ForcedChoiceItems, per_model: dict[str, dict]) -> dict:
        return {"items": {
            f"{self.name}_excluded": {name: {str(s.seed): dict(s.excluded) for s in sets}
                                      for name, sets in items.sets.items()},
            f"{self.name}_items": {name: sets[0].anchors.size for name, sets in items.sets.items()}}}


class ForcedChoicePublished(ForcedChoice):
    """The same texts and M, sampled and scored as the authors' code did: the columns to compare with the paper."""

    name = "forced_choice_published"
    sampling = "as_published"
    protocol = (
        "As the authors' code ran the forced choice (their EvaluationDataset and evaluate_scores): each test image "
        "with the first of its texts of a type against M-1 negative concepts drawn with replacement from its l1 "
        "group's hard negatives that have test images, each bringing the concept's first test image and that "
        "image's first text of the type; no check that a negative differs from the anchor (at l2-l4 it often "
        "shares the anchor's name); ties go to the anchor. Chance = 1/M for a random scorer; identical texts "
        "score as correct.")
