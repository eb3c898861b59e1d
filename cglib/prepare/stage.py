"""The preparation stage: everything the named runs will read, built (or found built) before any of them trains.

`prepare_inputs(run, names, seeds)` loads magic.json and the image cache of its images (rank 0 builds the cache,
the others open it), the n-gram groups when a run has `groups: ngram` (magic/ngram.json, built by rank 0 when
absent or out of date), the RE items of the `loss: re` runs, and, when the initial weights of a training seed
must still be trained, the base corpus with its image cache (rank 0 alone trains the base, so only it prepares
it). Training receives the result (`PreparedInputs`) and builds no data of its own.

Its account, `training/prepare.json`, says what it built now and what it found built, the counts (images cached,
skipped by reason, groups, RE items, base images) and its wall and CPU seconds; `cglib status` shows it as the
stage line "prepare".
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from cglib import distributed
from cglib.config import Params, TrainRunParams
from cglib.distributed import DistInfo
from cglib.magic.ngram import ngram_path
from cglib.prepare.base import BaseCorpus, initial_is_current, prepare_base
from cglib.prepare.inputs import TrainInputs, keyword_permuter, load_inputs, model_image_size
from cglib.prepare.re_items import re_items
from cglib.run import RunContext, provenance, training_dir, write_json

ACCOUNT = "prepare.json"  # training/prepare.json: the preparation stage's account


@dataclass
class PreparedInputs:
    """What `prepare_inputs` built for training: per groups (magic, ngram) the inputs of the runs that train on
    them, and the base corpus when the initial weights of a training seed must still be trained (rank 0 only).
    `names` holds the runs it was prepared for (with the runs their `init` trains first), `seeds` the training
    seeds; `account` is what training/prepare.json holds."""

    names: list[str]
    seeds: list[int]
    by_groups: dict[str, TrainInputs]
    base: BaseCorpus | None = None
    account: dict[str, Any] = field(default_factory=dict)

    def for_entry(self, entry: TrainRunParams) -> TrainInputs:
        """The inputs run `entry` trains on; ValueError naming the fix when it was not prepared."""
        if entry.name not in self.names or entry.groups not in self.by_groups:
            raise ValueError(f"the inputs of run {entry.name!r} were not prepared (prepared for {self.names}); "
                             f"call cglib.prepare.prepare_inputs(run, names=[{entry.name!r}, ...]) first")
        return self.by_groups[entry.groups]

    def check_covers(self, names: list[str], seeds: list[int]) -> None:
        """ValueError naming the fix when runs `names` or training seeds `seeds` were not prepared."""
        missing = [n for n in names if n not in self.names]
        other_seeds = [k for k in seeds if k not in self.seeds]
        if missing or other_seeds:
            raise ValueError(f"these inputs were prepared for runs {self.names} and training seeds {self.seeds}, "
                             f"not for {missing + [f'seed {k}' for k in other_seeds]}; call "
                             f"cglib.prepare.prepare_inputs(run, names={names}, seeds={seeds})")


def with_inits(params: Params, names: list[str]) -> list[TrainRunParams]:
    """The run entries `names`, each preceded by the runs of its `init` chain (trained first when needed);
    ValueError listing the names on a typo."""
    entries = {r.name: r for r in params.train.runs}
    out: dict[str, TrainRunParams] = {}

    def add(name: str) -> None:
        if name not in entries:
            raise ValueError(f"no run named {name!r} in train.runs; choose one of {list(entries)}")
        if entries[name].init is not None:
            add(entries[name].init)
        out.setdefault(name, entries[name])

    for name in names:
        add(name)
    return list(out.values())


def prepare_inputs(run: RunContext, names: list[str] | None = None, seeds: list[int] | None = None,
                   progress: bool = True, info: DistInfo | None = None) -> PreparedInputs:
    """Build or load everything runs `names` (default: every train.runs entry) read under training seeds `seeds`
    (default: train.seeds): magic.json and its image cache, the n-gram groups of `groups: ngram` runs, the RE
    items of `loss: re` runs, and the base corpus when a seed's initial weights must still be trained. Rank 0
    builds, the others wait and open; rank 0 writes the account to training/prepare.json."""
    started, cpu_started = time.perf_counter(), time.process_time()
    params = run.params
    entries = with_inits(params, names or [r.name for r in params.train.runs])
    info = info or distributed.current(run.device())
    seeds = list(seeds if seeds is not None else params.train.seeds)
    built: list[str] = []
    reused: list[str] = []

    by_groups = {"magic": load_inputs(run, progress=progress, info=info)}
    (built if by_groups["magic"].cache.built_now else reused).append("image cache of the MAGIC images")
    for groups in dict.fromkeys(e.groups for e in entries if e.groups != "magic"):
        before = _mtime(ngram_path(run)) if groups == "ngram" else None
        by_groups[groups] = load_inputs(run, progress=progress, info=info, groups=groups)
        if groups == "ngram":
            (reused if before is not None and before == _mtime(ngram_path(run)) else built).append(
                "n-gram groups (magic/ngram.json)")

    permuter = keyword_permuter(params, entries)
    for inputs in by_groups.values():
        inputs.permuter = permuter
    if permuter is not None:
        built.append(f"keyword relations ({permuter.source or params.data.source})")

    re_accounts: dict[str, dict[str, Any]] = {}
    for entry in entries:  # the RE alignment's items (a run with released weights loads them instead)
        if entry.objective().phase != "re" or _released_present(entry):
            continue
        inputs, data = by_groups[entry.groups], entry.options.data
        if data not in inputs.re_items:
            inputs.re_items[data] = re_items(params, data, inputs.magic)
            built.append(f"RE items ({data})")
        re_accounts[entry.name] = {"data": data, "items": len(inputs.re_items[data].items)}

    base, base_account = None, {"needed_for_seeds": []}
    if params.train.base.corpus != "none":
        needed = [k for k in seeds if not initial_is_current(run.for_training_seed(k))]
        base_account = {"corpus": params.train.base.corpus, "needed_for_seeds": needed}
        if needed and info.is_main:  # rank 0 alone trains the base (cglib.train.loop.ensure_initial)
            base = prepare_base(run, model_image_size(params), progress)
            built.append(f"base corpus ({params.train.base.corpus}, rendered or read now)")
            (built if base.cache.built_now else reused).append("image cache of the base corpus")
            base_account.update(record=base.record, images=len(base.dataset), cache=base.cache.account())
        elif not needed:
            reused.append("initial weights of every training seed (no base corpus needed)")
    distributed.barrier(info)

    account = {
        "runs": [e.name for e in entries], "training_seeds": seeds, "built": built, "reused": reused,
        "image_cache": by_groups["magic"].cache.account(),
        "groups": {g: {"l1_groups": len(i.magic.nodes_at(1)), "images": len(i.magic.images)}
                   for g, i in by_groups.items()},
        "re_items": re_accounts, "base": base_account,
        "wall_s": round(time.perf_counter() - started, 2), "cpu_s": round(time.process_time() - cpu_started, 2),
    }
    if info.is_main:
        write_json(training_dir(run.dir) / ACCOUNT, {**account, "provenance": provenance(params)})
    return PreparedInputs([e.name for e in entries], seeds, by_groups, base, account)


def _mtime(path) -> int | None:
    return path.stat().st_mtime_ns if path.is_file() else None


def _released_present(entry: TrainRunParams) -> bool:
    """A loss: re run whose released weights file exists (options.released) loads it instead of training."""
    path = getattr(entry.options, "released", None)
    return path is not None and path.is_file()


def account_rows(account: dict[str, Any]) -> list[dict[str, str]]:
    """The preparation account as (what, account) rows: what notebook 05 shows of training/prepare.json."""
    cache = account["image_cache"]
    skipped = ", ".join(f"{k}: {v}" for k, v in cache["skipped_by_reason"].items()) or "none"
    groups = "; ".join(f"{g}: {a['l1_groups']} l1 groups over {a['images']} images"
                       for g, a in account["groups"].items())
    re_items = "; ".join(f"{name}: {a['items']} ({a['data']})" for name, a in account["re_items"].items())
    base = account["base"]
    if base.get("needed_for_seeds"):
        described = (f"{base['corpus']}, {base['images']} images, for training seeds {base['needed_for_seeds']}"
                     if "images" in base else f"{base['corpus']}, prepared by rank 0 for training seeds "
                     f"{base['needed_for_seeds']}")
    else:
        described = "not needed: the initial weights of every training seed are current" \
            if base.get("corpus") else "none (train.base.corpus: none)"
    cached = (f"{cache['images'] - cache['skipped']} at {cache['size']}px ({cache['from_earlier_build']} from an "
              f"earlier build, {cache['built_now']} built now)")
    rows = [("runs", ", ".join(account["runs"])), ("training seeds", ", ".join(map(str, account["training_seeds"]))),
            ("built now", "; ".join(account["built"]) or "nothing"),
            ("found built", "; ".join(account["reused"]) or "nothing"), ("images cached", cached),
            ("images skipped", skipped), ("groups", groups), ("RE items", re_items or "none (no loss: re run)"),
            ("base corpus", described), ("seconds", f"{account['wall_s']} wall, {account['cpu_s']} CPU")]
    return [{"what": what, "account": value} for what, value in rows]
