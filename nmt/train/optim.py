"""Optimizers and learning-rate schedules.

Every schedule warms up linearly from 0 to `train.lr` over `warmup_steps`, then:
- `inverse_sqrt` (Vaswani et al., 2017, eq. 3): lr * sqrt(warmup / step);
- `cosine`: half a cosine from lr down to 0 at `max_steps`;
- `linear`: a straight line down to 0 at `max_steps`;
- `constant`: lr.
"""

from __future__ import annotations

import math

import torch

from nmt.config import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW; biases and norm weights get no weight decay; fused kernels on CUDA."""
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (no_decay if p.ndim < 2 else decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    extra = {"fused": True} if device.type == "cuda" else {}
    return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **extra)


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of `cfg.lr` at update `step` (0-based: the factor for the step about to run)."""
    step = step + 1
    warmup = cfg.warmup_steps
    if warmup and step <= warmup:
        return step / warmup
    if cfg.schedule == "inverse_sqrt":
        return math.sqrt(warmup / step) if warmup else 1.0 / math.sqrt(step)
    if cfg.schedule == "constant":
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, cfg.max_steps - warmup))
    if cfg.schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress  # linear


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> torch.optim.lr_scheduler.LambdaLR:
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, cfg))
