"""One optimizer step: the run's objective on a group batch, and AdamW + warmup-cosine + AMP + clipping.

`GroupTask` turns a batch item into features and hands them to the run's objective (cglib/train/objectives: one
module per objective, none named here). Every objective gets the batch's `text_ids` (equal ids = identical
strings), so two identical texts are never each other's negatives, unless train.mask_identical_texts is false
(the authors' code: no mask). The features are unit norm unless the objective asks for the towers' raw outputs
(`Objective.unit_features`: clip's `options.hierarcaps_features: raw`).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from cglib.distributed import DistInfo
from cglib.encoding import pixels_to_tensor
from cglib.models import ClipModel, Towers
from cglib.train.faults import defer_interrupts, finite
from cglib.train.objectives import GroupFeatures, Objective
from cglib.train.optim import build_optimizer, warmup_cosine


class GroupTask(torch.nn.Module):
    """The towers and the run's objective as one module: one group batch item (GroupBatchData) -> loss parts.

    DDP wraps this module, so whatever the objective trains (a concept head) is synchronized with the model, and
    the loop's step only ever calls `task(item)`. `text_table`: a frozen text tower's embeddings of every text a
    batch can hold (rows given by the item, normalized as the objective's `unit_features` says), else the texts are
    encoded by the trainable tower each step.
    `mask_identical_texts` false hands the objective no text_ids (the authors' unmasked losses).
    """

    def __init__(self, bundle: ClipModel, objective: Objective, text_table: torch.Tensor | None = None,
                 mask_identical_texts: bool = True) -> None:
        super().__init__()
        self.towers = Towers(bundle.model)
        self.objective = objective
        self.bundle, self.text_table = bundle, text_table
        self.mask_identical_texts = mask_identical_texts

    def forward(self, item: dict[str, Any]) -> dict[str, torch.Tensor]:
        device, table = self.bundle.device, self.text_table
        images = pixels_to_tensor(item["pixels"].to(device, non_blocking=True), self.bundle)
        tokens = None if table is not None else item["tokens"].to(device, non_blocking=True)
        image, text = self.towers(images, tokens, normalize=self.objective.unit_features)
        m, n = item["m"], item["n"]
        hard = columns = None
        if "hard_columns" in item:  # a replacement negative per pair (Objective.pair_replacements)
            rows = item["hard_rows"] if table is not None else item["hard_inverse"]
            hard = (table if table is not None else text)[rows.to(device)].reshape(m, n, -1)
            columns = item["hard_columns"].to(device).reshape(m, n)
        text = table[item["text_rows"].to(device)] if table is not None else text[item["text_inverse"].to(device)]
        ids = item.get("text_ids") if self.mask_identical_texts else None
        index = item.get("group_index")
        return self.objective(GroupFeatures(
            image.reshape(m, n, -1), text.reshape(m, n, -1), None if ids is None else ids.to(device).reshape(m, n),
            None if index is None else index.to(device), list(item.get("groups", [])), hard, columns))


def set_trainable(bundle: ClipModel, image: bool, text: bool) -> None:
    """Which towers train in a phase; logit_scale is always frozen (fixed tau, see loop.py)."""
    for p in bundle.model.parameters():
        p.requires_grad_(image)
    bundle.set_text_trainable(text)
    bundle.freeze_logit_scale()


def wrap(module: torch.nn.Module, info: DistInfo) -> torch.nn.Module:
    """DDP around the module (the towers, or a GroupTask) when running under torchrun, else the module itself."""
    if not info.distributed:
        return module
    ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=ids)


class Stepper:
    """AdamW + warmup-cosine + AMP + clipping + accumulation for one phase; `step` is one optimizer step."""

    def __init__(self, model: torch.nn.Module, module: torch.nn.Module, *, lr: float, weight_decay: float,
                 warmup_steps: int, total_steps: int, amp: torch.dtype | None, grad_clip: float,
                 device: torch.device, head: torch.nn.Module | None = None,
                 betas: tuple[float, float] = (0.9, 0.98), eps: float = 1e-6) -> None:
        """`head`: a training-only module (the objective, e.g. mcc's concept head) optimized and clipped with the
        model; its weights are saved with the objective's state (checkpoint.py), the optimizer's moments here."""
        self.module, self.amp, self.grad_clip, self.device, self.head = module, amp, grad_clip, device, head
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.params += [p for p in head.parameters() if p.requires_grad] if head is not None else []
        self.optimizer = build_optimizer(model, lr, weight_decay, head, betas, eps)
        self.scheduler = warmup_cosine(self.optimizer, warmup_steps, total_steps)
        # fp16 needs loss scaling; bf16 and fp32 do not (the scaler is then a no-op that still saves its state)
        self.scaler = torch.amp.GradScaler(device.type, enabled=amp == torch.float16)

    def autocast(self):
        return torch.autocast(self.device.type, dtype=self.amp or torch.float32, enabled=self.amp is not None)

    def step(self, items: list[Any], loss_fn: Callable[[Any], dict[str, torch.Tensor]],
             on_update: Callable[[dict[str, float]], None] | None = None) -> dict[str, float]:
        """Accumulate gradients over `items` (one micro-batch each), clip, update; mean loss parts and lr.

        A step with non-finite gradients changes no weight (`skipped` = 1.0 in the result; see faults.py).
        A step with no item (its micro-batches were the authors' empty loader items) changes no weight either
        (`empty` = 1.0) and draws nothing; its schedule position passes, as their loop sets the lr before skipping.
        `on_update(result)` runs inside the same interrupt-proof section as the update, so bookkeeping
        (position, RNG snapshot) always matches the weights: an interruption lands before or after a whole step.
        """
        if not items:
            lr = self.scheduler.get_last_lr()[0]
            with defer_interrupts():
                self._advance_schedule()
                result = {"loss": float("nan"), "grad_norm": float("nan"), "lr": lr, "skipped": 0.0, "empty": 1.0}
                if on_update is not None:
                    on_update(result)
            return result
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
            self._advance_schedule()
            result = {**{k: float(v) for k, v in totals.items()}, "grad_norm": float(grad_norm), "lr": lr,
                      "skipped": 0.0 if ok else 1.0}
            if on_update is not None:
                on_update(result)
        return result

    def _advance_schedule(self) -> None:
        """The schedule advances after every step, taken or skipped, so a skipped step never shifts later lrs."""
        with warnings.catch_warnings():  # torch warns when no optimizer.step() preceded it: intended here
            warnings.filterwarnings("ignore", message="Detected call of `lr_scheduler.step", category=UserWarning)
            self.scheduler.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.scaler.load_state_dict(state["scaler"])
