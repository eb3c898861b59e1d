"""AdamW with open_clip's weight-decay split, linear warmup then cosine decay, and the AMP dtype choice."""

from __future__ import annotations

import math

import torch
from torch.optim.lr_scheduler import LambdaLR


def _no_decay(name: str, param: torch.nn.Parameter) -> bool:
    """open_clip's rule: biases, norm gains, embeddings' 1-d vectors and the logit scale get no weight decay."""
    return param.ndim < 2 or "bn" in name or "ln" in name or "bias" in name or "logit_scale" in name


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float,
                    head: torch.nn.Module | None = None, betas: tuple[float, float] = (0.9, 0.98),
                    eps: float = 1e-6) -> torch.optim.AdamW:
    """AdamW over the trainable parameters (and a training-only `head`'s, after the model's), weight decay on
    matrices only (no biases, norms, logit scale). The default betas and eps are open_clip's fine-tuning recipe
    for ViT models (train.adam_betas, train.adam_eps; the authors' code ran (0.9, 0.999) and 1e-8)."""
    decay, no_decay = [], []
    named = list(model.named_parameters()) + (list(head.named_parameters(prefix="head")) if head else [])
    for name, param in named:
        if param.requires_grad:
            (no_decay if _no_decay(name, param) else decay).append(param)
    if not decay and not no_decay:
        raise ValueError("no trainable parameters: check model.freeze_text and the run's phase")
    groups = [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=lr, betas=tuple(betas), eps=eps)


def warmup_cosine(optimizer: torch.optim.Optimizer, warmup_steps: int, total_steps: int) -> LambdaLR:
    """Linear warmup from 0 to the peak over `warmup_steps`, then cosine decay to 0 at `total_steps`."""
    if total_steps < 1:
        raise ValueError(f"a schedule needs at least one optimizer step, got {total_steps}")
    if warmup_steps >= total_steps:
        raise ValueError(f"train.warmup_steps ({warmup_steps}) must be below the run's optimizer steps "
                         f"({total_steps}); lower warmup_steps or train longer")

    def factor(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return LambdaLR(optimizer, factor)


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """Autocast dtype for train.amp: auto = bf16 on CUDA (fp16 where bf16 is unsupported), off on CPU;
    auto_fp16 = fp16 with loss scaling on CUDA (the authors' precision), off on CPU."""
    if amp == "off":
        return None
    if amp == "auto_fp16":
        return torch.float16 if device.type == "cuda" else None
    if amp == "auto":
        if device.type != "cuda":
            return None
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    if amp == "fp16" and device.type != "cuda":
        raise ValueError("train.amp: fp16 needs a CUDA device; use bf16 or off on CPU")
    return torch.bfloat16 if amp == "bf16" else torch.float16
