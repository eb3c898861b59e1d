"""One optimizer step: the run's objective on a group batch, and AdamW + warmup-cosine + AMP + clipping.

Objectives (`train.runs[i].loss`): "clip" is CLIP's InfoNCE over the flattened M*N pairs of the group batch;
"clip_hn" the same with each image's keyword-permuted caption replacing one negative of its row (Rösch et al.);
"pairwise" (Eqs. 1-4) and "centroid" (Eqs. 5-8) take tau, tau_inner, alpha and the variant options; "mcc" (C3) is
"clip" + train.mcc_weight x `losses.mcc_loss` on the groups' concept-head vectors (cglib.related.mcc_head). Every
loss gets the batch's `text_ids` (equal ids = identical strings), so two identical texts are never each other's
negatives.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import nullcontext
from typing import TYPE_CHECKING, Any

import torch
from torch.nn.parallel import DistributedDataParallel

from cglib import losses
from cglib.models import ClipModel, Towers, pixels_to_tensor
from cglib.train.distributed import DistInfo
from cglib.train.faults import defer_interrupts, finite
from cglib.train.optim import build_optimizer, warmup_cosine

if TYPE_CHECKING:
    from cglib.related.memory import ConceptMemory


def batch_loss(loss: str, image: torch.Tensor, text: torch.Tensor, spec: dict[str, Any],
               text_ids: torch.Tensor | None = None, *, memory: ConceptMemory | None = None,
               group_index: torch.Tensor | None = None, concepts: torch.Tensor | None = None,
               hard_text: torch.Tensor | None = None, hard_columns: torch.Tensor | None = None
               ) -> dict[str, torch.Tensor]:
    """The run's objective on (M, N, L) features: {loss} for clip and clip_hn, {loss, inner, outer} for the group
    losses, {loss, clip, mcc} for mcc (CLIP + spec["mcc_weight"] x MCC; `concepts` (M, L): the groups' head outputs).

    `text_ids` (M, N): equal ids mark identical strings, which the loss never treats as each other's negatives.
    `hard_text` (M, N, L) and `hard_columns` (M, N): clip_hn's permuted captions and the columns they replace.
    A centroid run with `memory_momentum` needs `memory` and each group's memory row `group_index` (M,): the
    batch's centroids are staged in the memory, which the trainer commits after the optimizer step.
    """
    if spec.get("memory_momentum") is not None:
        if loss != "centroid" or memory is None or group_index is None:
            raise ValueError("a run with memory_momentum needs loss: centroid, its ConceptMemory and the batch's "
                             "group_index (cglib.related.memory; the trainer builds them)")
        parts = losses.memory_centroid_loss(image, text, memory.image, memory.text, group_index, spec["tau"],
                                            spec["tau_inner"], spec["alpha"], alpha_on=spec["alpha_on"],
                                            return_parts=True, text_ids=text_ids)
        memory.stage(parts.pop("group_index"), parts.pop("centroids"))
        return parts
    if loss == "mcc":
        if concepts is None:
            raise ValueError("loss mcc needs the groups' concept vectors (the concept head's outputs)")
        clip = losses.clip_loss(image, text, tau=spec["tau"], text_ids=text_ids)
        mcc = losses.mcc_loss(image, concepts, tau=spec["tau"])
        return {"loss": clip + spec["mcc_weight"] * mcc, "clip": clip, "mcc": mcc}
    if loss == "clip":
        return {"loss": losses.clip_loss(image, text, tau=spec["tau"], text_ids=text_ids)}
    if loss == "clip_hn":
        if hard_text is None or hard_columns is None:
            raise ValueError("loss clip_hn needs each pair's hard negative (hard_text, hard_columns); build the "
                             "batches with GroupBatchData(..., hard_negatives=plan)")
        return {"loss": losses.clip_hn_loss(image, text, hard_text, hard_columns, tau=spec["tau"], text_ids=text_ids)}
    if loss == "pairwise":
        return losses.pairwise_group_loss(image, text, spec["tau"], spec["tau_inner"], spec["alpha"],
                                          alpha_on=spec["alpha_on"], normalize_products=spec["normalize_products"],
                                          return_parts=True, text_ids=text_ids)
    if loss == "centroid":
        return losses.centroid_group_loss(image, text, spec["tau"], spec["tau_inner"], spec["alpha"],
                                          alpha_on=spec["alpha_on"], return_parts=True, text_ids=text_ids)
    raise ValueError(f"unknown loss {loss!r}; use clip, clip_hn, pairwise, centroid or mcc")


def group_step_loss(module: torch.nn.Module, bundle: ClipModel, item: dict[str, Any], run: dict[str, Any],
                    text_table: torch.Tensor | None, *, memory: ConceptMemory | None = None,
                    head: torch.nn.Module | None = None, bank: Callable[[list[str]], torch.Tensor] | None = None
                    ) -> dict[str, torch.Tensor]:
    """Loss of one group batch item (as built by GroupBatchData) on this rank's groups.

    `memory`: a memory_momentum run's concept memory (see batch_loss). loss mcc: `bank` maps the item's group ids
    to their frozen concept embeddings, `head` maps those to the conditioning vectors (cglib.related.mcc_head).
    """
    device = bundle.device
    images = pixels_to_tensor(item["pixels"].to(device, non_blocking=True), bundle)
    tokens = None if text_table is not None else item["tokens"].to(device, non_blocking=True)
    image, text = module(images, tokens)
    m, n = item["m"], item["n"]
    hard = columns = None
    if "hard_columns" in item:  # loss: clip_hn
        rows = item["hard_rows"] if text_table is not None else item["hard_inverse"]
        hard = (text_table if text_table is not None else text)[rows.to(device)].reshape(m, n, -1)
        columns = item["hard_columns"].to(device).reshape(m, n)
    if text_table is not None:
        text = text_table[item["text_rows"].to(device)]
    else:
        text = text[item["text_inverse"].to(device)]
    ids = item.get("text_ids")
    ids = None if ids is None else ids.to(device).reshape(m, n)
    concepts = None
    if run["loss"] == "mcc":
        if head is None or bank is None:
            raise ValueError("loss mcc needs its concept head and concept bank (see Trainer._mcc_head)")
        concepts = head(bank(item["groups"]).to(device))
    index = item.get("group_index") if memory is not None else None
    return batch_loss(run["loss"], image.reshape(m, n, -1), text.reshape(m, n, -1), run, ids, memory=memory,
                      group_index=None if index is None else index.to(device), concepts=concepts, hard_text=hard,
                      hard_columns=columns)


def set_trainable(bundle: ClipModel, image: bool, text: bool) -> None:
    """Which towers train in a phase; logit_scale is always frozen (fixed tau, see loop.py)."""
    for p in bundle.model.parameters():
        p.requires_grad_(image)
    bundle.set_text_trainable(text)
    bundle.freeze_logit_scale()


def wrap(towers: Towers, info: DistInfo) -> torch.nn.Module:
    """DDP around the encoders when running under torchrun, else the encoders themselves."""
    if not info.distributed:
        return towers
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(towers, device_ids=ids)


class Stepper:
    """AdamW + warmup-cosine + AMP + clipping + accumulation for one phase; `step` is one optimizer step."""

    def __init__(self, model: torch.nn.Module, module: torch.nn.Module, *, lr: float, weight_decay: float,
                 warmup_steps: int, total_steps: int, amp: torch.dtype | None, grad_clip: float,
                 device: torch.device, head: torch.nn.Module | None = None) -> None:
        """`head`: a training-only module (loss: mcc's concept head) optimized, clipped and saved with the model."""
        self.module, self.amp, self.grad_clip, self.device, self.head = module, amp, grad_clip, device, head
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.params += [p for p in head.parameters() if p.requires_grad] if head is not None else []
        self.optimizer = build_optimizer(model, lr, weight_decay, head)
        self.scheduler = warmup_cosine(self.optimizer, warmup_steps, total_steps)
        # fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op that still saves its state)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None)

    def step(self, items: list[Any], loss_fn: Callable[[Any], dict[str, torch.Tensor]],
             on_update: Callable[[dict[str, float]], None] | None = None) -> dict[str, float]:
        """Accumulate gradients over `items` (one micro-batch each), clip, update; mean loss parts and lr.

        A step with non-finite gradients changes no weight (`skipped` = 1.0 in the result; see faults.py).
        `on_update(result)` runs inside the same interrupt-proof section as the update, so bookkeeping
        (position, RNG snapshot) always matches the weights: an interruption lands before or after a whole step.
        """
        self.optimizer.zero_grad(set_to_none=True)
        totals: dict[str, torch.Tensor] = {}
        ddp = isinstance(self.module, DistributedDataParallel)
        for k, item in enumerate(items):
            sync = k == len(items) - 1
            with self.module.no_sync() if ddp and not sync else nullcontext():
                with self.autocast():
                    parts = loss_fn(item)
                self.scaler.scale(parts["loss"] / len(items)).backward()
            for key, value in parts.items():
                totals[key] = totals.get(key, 0.0) + value.detach().float() / len(items)
        lr = self.scheduler.get_last_lr()[0]
        with defer_interrupts():
            self.scaler.unscale_(self.optimizer)
            grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip)
            ok = finite(grad_norm)
            if self.scaler.is_enabled():
                self.scaler.step(self.optimizer)  # skips the update itself when gradients overflowed
                self.scaler.update()
            elif ok:
                self.optimizer.step()
            # the schedule advances either way, so a skipped step never shifts the lr of later steps
            with warnings.catch_warnings():  # torch warns when no optimizer.step() preceded it: intended here
                warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
                self.scheduler.step()
            result = {**{k: float(v) for k, v in totals.items()}, "grad_norm": float(grad_norm), "lr": lr,
                      "skipped": 0.0 if ok else 1.0}
            if on_update is not None:
                on_update(result)
        return result

    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                 "scaler": self.scaler.state_dict()}
        if self.head is not None:  # the head's weights change only with the optimizer's: saved together
            state["head"] = {k: v.detach().cpu().clone() for k, v in self.head.state_dict().items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.head is not None:
            if "head" not in state:
                raise ValueError("the checkpoint has no concept-head weights for this loss: mcc run; delete its "
                                 "last.pt (or set train.resume: false) to start over")
            self.head.load_state_dict(state["head"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
