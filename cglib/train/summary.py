"""What a finished run reports: summary.json, final weights, whether the weights moved, and the runs' table."""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from cglib import distributed
from cglib.config import Params
from cglib.models import ClipModel, resolve_activation
from cglib.run import provenance, write_json
from cglib.train.checkpoint import FINAL, LAST, text_keys
from cglib.train.inputs import exposure, related_methods, text_source
from cglib.train.setup import RunSetup
from cglib.train.state import TrainState

ZERO_SHOT = "zero-shot"  # the initial weights' name in results (loop.ZERO_SHOT)
MOSTLY_STILL = 0.5  # below this fraction of changed parameters a trained tower "did not move"


def weights_moved(model: torch.nn.Module, initial: dict[str, torch.Tensor], trained: dict[str, bool],
                  text_projection_only: bool = False) -> dict[str, dict[str, Any]]:
    """Per tower (image, text): fraction of parameter entries changed at all and ||w - w0|| / ||w0||.

    With `text_projection_only` (train.text_trains: projection) the text entry covers the projection alone, the
    part that trained: the frozen tower would otherwise make it look as if the text side never moved.
    """
    params = dict(model.named_parameters())
    text = set(text_keys(model))
    towers = {"image": [k for k in params if k.startswith("visual.")],
              "text": [k for k in params if k in text and (not text_projection_only or k.startswith("text.proj."))]}
    out = {}
    for tower, keys in towers.items():
        changed = total = 0
        diff_sq, base_sq = 0.0, 0.0
        for key in keys:
            w = params[key].detach().to("cpu", torch.float64)
            w0 = initial[key].to(torch.float64)
            changed += int((w != w0).sum())
            total += w.numel()
            diff_sq += float(((w - w0) ** 2).sum())
            base_sq += float((w0 ** 2).sum())
        out[tower] = {"trained": trained[tower], "parameters": total,
                      "fraction_changed": changed / total if total else 0.0,
                      "relative_update": (diff_sq / base_sq) ** 0.5 if base_sq > 0 else 0.0}
    return out


def weights_moved_note(summaries: dict[str, dict[str, Any]]) -> str | None:
    """A sentence naming the runs whose trained towers mostly did not move (None when every tower moved)."""
    still = []
    for name, s in summaries.items():
        for tower, m in (s.get("weights_moved") or {}).items():
            if m["trained"] and m["fraction_changed"] < MOSTLY_STILL:
                still.append(f"{name} ({tower} tower: {m['fraction_changed']:.0%} of parameters changed, "
                             f"relative update {m['relative_update']:.1e})")
    if not still:
        return None
    return ("Most weights did not move in " + "; ".join(still) + ". At a learning rate this small in fp32, most "
            "AdamW updates round away (at lr 1e-8 an update of about lr is below half a unit in the last place of "
            "every weight of magnitude above 0.25, LayerNorm gains near 1 among them), so such a run is close to its "
            "initial model: compare it with zero-shot before reading its numbers as an effect of the objective.")


def model_info(params: Params, bundle: Any) -> dict[str, Any]:
    """The trained model's description, with the activation's reason taken from params.model as written.

    The trainer rebuilds the model from `architecture_params` (activation pinned, tag dropped), so the bundle
    alone would give "model.force_activation" as the reason even when the pretrained tag decided it.
    """
    m = params.model
    if m.source == "hf":  # the checkpoint's config decides, whatever the weights
        return bundle.info()
    return {**bundle.info(), "activation_source": resolve_activation(m.name, m.pretrained, m.force_activation).source}


def training_account(state: TrainState) -> dict[str, Any]:
    """This attempt's account of the run: optimizer steps and epochs kept from a checkpoint plus those done now
    (counted as they were done) against the run's totals, and the steps an earlier, killed attempt did past its
    checkpoint, lost and done again now (read from its log.csv)."""
    kept, now = state.kept, state.trained_now
    total = {"steps": state.progress.global_step, "epochs": state.epochs_done()}
    return {"steps": {"total": total["steps"], "kept": kept["steps"], "trained_now": now["steps"],
                      "repeated": state.repeated_steps},
            "epochs": {"total": total["epochs"], "kept": kept["epochs"], "trained_now": now["epochs"]},
            "adds_up": all(total[k] == kept[k] + now[k] for k in total)}


def finish(setup: RunSetup, state: TrainState, bundle: ClipModel,
           initial: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Write final weights and summary.json (rank 0), drop the resume checkpoint; return the summary.

    `initial`: the model's weights before this run trained (for `weights_moved`)."""
    s, entry, t, files, objective = state.progress, setup.entry, setup.t, setup.files, setup.objective
    params, inputs, info = setup.params, setup.inputs, setup.info
    # what the phases described (phases.py): their samplers, the pretraining, the RE items, precomputed texts
    phases = {"sampler": None, "pretraining": None, "re_training": None, "precomputed_texts": 0, **state.described}
    re = not entry.trains_images()  # a text objective (re): no image-text phase
    trained = {"image": not re, "text": files.text_phase or not files.freeze_text}
    exposed = exposure(params, entry)
    summary = {
        "name": entry.name, "loss": entry.loss, "pretrain": entry.pretrain,
        "text_source": text_source(params, entry), "related": related_methods(entry),
        # the roles evaluation reads (report.ModelRole), from the objective: an re run is the HierarCaps baseline,
        # not a MAGIC fine-tune; Table 3's gain rows compare objective families, never names
        "objective": objective.name or entry.loss, "objective_family": objective.family,
        "objective_label": objective.label, "fine_tuned_on_magic": not re, "init": entry.init or ZERO_SHOT,
        "exposed_to_eval_strings": bool(exposed), "exposure": exposed,
        "re_training": phases["re_training"],
        # what the objective reports of its run, e.g. clip_hn's hard negatives per epoch (pairs without a keyword
        # to permute have none), a memory's size, mcc's concept head
        "hard_negatives": None, **(objective.describe() or {}),
        # the HierarCaps row: the authors' released weights when present (train.runs[i].options.released), else trained here
        "weights_source": state.weights_source,
        "spec": setup.spec, "spec_hash": files.hash, "data_fingerprint": inputs.fingerprint,
        # train.seeds: which training seed, and the seed it gave initialization and batch order
        "training_seed": setup.run.training_seed, "init_and_order_seed": setup.run.train_seed,
        "epoch_kind": "re items" if re else t.epoch, "epochs": getattr(objective.options, "epochs", t.epochs) if re else t.epochs,
        "steps_per_epoch": (phases["sampler"] or {}).get("optimizer_steps_per_epoch"),
        "pretrain_steps_per_epoch": (phases["pretraining"] or {}).get("batches_per_epoch"),
        "steps": s.step, "pretrain_steps": s.pretrain_steps, "skipped_steps": s.skipped_steps,
        # train.epoch: pairs_as_published: steps (counted in `steps`) whose loader item came back empty, skipped
        "empty_steps": s.empty_steps,
        "images_seen": s.images, "wall_time_s": round(state.elapsed_s(), 2),
        "images_per_s": s.images / s.compute_s if s.compute_s else None,
        "images_per_s_with_data": s.images / (s.compute_s + s.data_wait_s) if s.compute_s else None,
        "data_wait_s": round(s.data_wait_s, 3),
        "epoch_loss": s.epoch_losses, "final_loss": s.epoch_losses[-1] if s.epoch_losses else None,
        "pretrain_epoch_loss": s.pretrain_losses,
        "fallback_batches": s.fallback_batches, "repeated_images": s.repeated_images,
        "sampler": phases["sampler"], "pretraining": phases["pretraining"],
        "text_frozen": params.model.freeze_text and not re, "precomputed_texts": phases["precomputed_texts"],
        # what the text phase (pretraining, re) trained: the whole tower, or the projection on the frozen tower
        "text_phase_trained": t.text_trains if files.text_phase else None,
        "weights_moved": weights_moved(bundle.model, initial, trained,
                                       text_projection_only=files.text_phase and files.projection_only
                                       and files.freeze_text),
        "tau_note": "fixed train.tau / tau_inner (clip with options.logit_scale: learned: its own scale, in "
                    "objective.logit_scale); model.logit_scale frozen and unused",
        "image_cache": {"size": inputs.cache.size, "images": len(inputs.cache),
                        "skipped": dict(inputs.cache.skipped), "account": inputs.cache.account()},
        "account": training_account(state),
        "model": model_info(params, bundle),
        "device": str(setup.device), "world_size": info.world_size,
        "amp": files.precision["amp"],
        "resumed_from_step": state.resumed_from, "warmup_steps_used": state.warmup_used,
        # a callback that ended the run early (callbacks.py): its reason and where; None: the run ran to its end
        "stopped": state.stopped,
    }
    if info.is_main:
        files.save_weights(bundle, files.out / FINAL)
        summary["provenance"] = provenance(params, run=entry.name)
        write_json(files.out / "summary.json", summary)
        (files.ckpt_dir / LAST).unlink(missing_ok=True)
        if files.ckpt_dir.is_dir() and not any(files.ckpt_dir.iterdir()):
            files.ckpt_dir.rmdir()
    distributed.barrier(info)
    return summary


def summary_table(summaries: dict[str, dict[str, Any]]):
    """One row per run (a pandas DataFrame): objective, pretraining, exposure, steps, time, losses, weights moved."""
    rows = []
    for name, s in summaries.items():
        losses_ = s.get("epoch_loss") or [float("nan")]
        sampler = s.get("sampler") or {}
        moved = s.get("weights_moved") or {}
        row = {"run": name, "loss": s["loss"], "pretrain": s["pretrain"],
               "exposed to eval strings": s["exposed_to_eval_strings"], "epoch": s.get("epoch_kind", "groups"),
               "steps per epoch": s.get("steps_per_epoch", sampler.get("batches_per_epoch")), "steps": s["steps"],
               "skipped steps": s.get("skipped_steps", 0), "pretrain steps": s["pretrain_steps"],
               "wall time (s)": s["wall_time_s"], "images/s": round(s["images_per_s"] or float("nan"), 1),
               "loss, first epoch": round(losses_[0], 4), "loss, last epoch": round(losses_[-1], 4),
               "batches with fallback negatives": s["fallback_batches"]}
        if s.get("empty_steps"):  # the authors' epoch: steps skipped on an empty loader item
            row["empty steps (skipped)"] = s["empty_steps"]
        if s.get("hard_negatives"):  # loss: clip_hn: pairs of all epochs without a keyword (no hard negative)
            row["pairs without keyword"] = s["hard_negatives"]["pairs_without_keyword"]
        for tower in ("image", "text"):
            m = moved.get(tower)
            row[f"{tower} params changed"] = round(m["fraction_changed"], 4) if m else float("nan")
            row[f"{tower} relative update"] = float(f"{m['relative_update']:.3g}") if m else float("nan")
        rows.append(row)
    return pd.DataFrame(rows).set_index("run")
