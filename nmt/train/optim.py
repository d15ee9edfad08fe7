"""Optimizers and learning-rate schedules.

Every schedule warms up linearly from 0 to `train.lr` over `warmup_steps`, then:
- `inverse_sqrt` (Vaswani et al., 2017, eq. 3): lr * sqrt(warmup / step);
- `cosine`: half a cosine from lr towards 0 at `max_steps` (the last update, one before, is above 0);
- `linear`: a straight line from lr towards 0 at `max_steps` (likewise);
- `constant`: lr;
- `plateau`: lr, multiplied by `plateau_factor` each time the validation metric
  has not improved for more than `plateau_patience` validations (as
  `torch.optim.lr_scheduler.ReduceLROnPlateau`, but after warm-up and with its
  state in the same `state_dict` as the step).
"""

from __future__ import annotations

import copy
import math
from typing import Any

import torch
from torch import Tensor, nn

from nmt.config import TrainConfig


def build_optimizer(model: torch.nn.Module, cfg: TrainConfig, device: torch.device) -> torch.optim.Optimizer:
    """Adam or AdamW; biases and norm weights get no weight decay.

    The fused kernel (one pass per tensor) is used wherever torch has one for
    `device`: CUDA, and CPU and MPS in recent versions (on CPU about 8x faster
    than the per-tensor loop).
    """
    decay, no_decay = [], []
    for p in model.parameters():
        if p.requires_grad:
            (decay if _decays(p) else no_decay).append(p)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    cls = torch.optim.AdamW if cfg.optimizer == "adamw" else torch.optim.Adam
    try:
        return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, fused=True)
    except (RuntimeError, TypeError):  # no fused kernel for this device in this torch
        return cls(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps)


def _decays(p: Tensor) -> bool:
    """Whether `build_optimizer` puts `p` in its group with weight decay: matrices do, vectors don't."""
    return p.ndim >= 2


def load_optimizer_state(optimizer: torch.optim.Optimizer, model: nn.Module, saved: dict[str, Any],
                         saved_model: dict[str, Tensor]) -> None:
    """Load `saved`, the state dict of `build_optimizer`'s optimizer, saved beside the weights `saved_model`.

    The weights may be of an older layout of `model`'s parameters, one that `model.load_state_dict`
    upgrades (e.g. separate projections since merged into one matrix). The optimizer state is then
    numbered after the older parameters; each of its per-parameter tensors goes through the same
    upgrade as the weights, so the run goes on where it stopped: Adam's moments are elementwise,
    and its step count is the same for every part.

    Only the state (Adam's moments and step counts) comes from `saved`. Every group setting stays the live
    optimizer's, which `build_optimizer` made from this run's config and for this device and torch: the weight
    decay, betas, eps and the kind (adamw's decoupled decay) are what the resumed run's config says, not what
    the checkpoint's run said; and how it runs (the fused kernel or not, ...) fits this machine, where a
    checkpoint written without a fused kernel would turn it off, with step counts left on the CPU, and the
    first update would fail. (The rate is the schedule's, which sets it before every update.)

    Raises:
        ValueError: `saved` does not fit the parameters of `saved_model`.
    """
    if len(saved["param_groups"]) != len(optimizer.param_groups):
        raise ValueError(f"its optimizer has {len(saved['param_groups'])} parameter groups, this run's "
                         f"{len(optimizer.param_groups)}")
    saved = {**saved, "param_groups": [{**{k: v for k, v in live.items() if k != "params"}, "params": old["params"]}
                                       for old, live in zip(saved["param_groups"], optimizer.param_groups)]}
    first = {id(p): n for n, p in model.named_parameters()}
    tied = {n: first[id(p)] for n, p in model.named_parameters(remove_duplicate=False)}  # every name -> the first
    buffers = {n for n, _ in model.named_buffers()}
    saved_names = [n for n in saved_model if n not in buffers and tied.get(n, n) == n]  # the model's order then
    if saved_names == list(first.values()):
        optimizer.load_state_dict(saved)
        return
    states = _states_by_name(saved, saved_names, saved_model)
    upgraded: dict[str, dict[str, Tensor]] = {}
    scratch = copy.deepcopy(model)
    for field, like in (states[saved_names[0]].items() if states else ()):
        per_element = like.shape == saved_model[saved_names[0]].shape  # moments; else one number (the step)
        values = dict(saved_model)  # the buffers as they are, every parameter's entry (tied ones too) replaced
        for n, t in saved_model.items():
            if n not in buffers:
                value = states[tied.get(n, n)][field]
                values[n] = value if per_element else torch.full_like(t, value.item())
        scratch.load_state_dict(values)  # the upgrade, on this field's values
        for n, p in scratch.named_parameters():
            value = p.detach().clone()
            if not per_element:
                if not torch.all(value == value.flatten()[0]):
                    raise ValueError(f"its optimizer's {field} differs between the parts of {n}")
                value = like.new_tensor(value.flatten()[0].item())
            upgraded.setdefault(n, {})[field] = value.to(like.dtype)
    state = optimizer.state_dict()
    order = [first[id(p)] for group in optimizer.param_groups for p in group["params"]]
    state["state"] = {i: upgraded[n] for i, n in enumerate(order) if n in upgraded}  # the live groups' settings
    optimizer.load_state_dict(state)


def _states_by_name(saved: dict[str, Any], names: list[str], weights: dict[str, Tensor]) -> dict[str, dict[str, Tensor]]:
    """The per-parameter state of optimizer state dict `saved`, by the names of the parameters `names` (in the
    order the model held them) of the weights `weights`, numbered as `build_optimizer` groups them."""
    groups = [[n for n in names if _decays(weights[n])], [n for n in names if not _decays(weights[n])]]
    sizes = [len(g["params"]) for g in saved["param_groups"]]
    if sizes != [len(g) for g in groups]:
        raise ValueError(f"its optimizer holds {sizes} parameters per group where the weights beside it "
                         f"have {[len(g) for g in groups]}")
    number = {i: n for g, group in zip(saved["param_groups"], groups) for i, n in zip(g["params"], group)}
    states = {number[i]: state for i, state in saved["state"].items()}
    fields = next(iter(states.values()), {}).keys()
    if states and any(states.get(n, {}).keys() != fields for n in names):
        raise ValueError("its optimizer has state for some parameters and not for others")
    return states


def lr_factor(step: int, cfg: TrainConfig) -> float:
    """Multiplier of `cfg.lr` for update `step` (0-based: the factor for the update about to run).

    Warm-up takes updates 0 .. warmup - 1 up to the full rate (1/warmup, 2/warmup, ..., 1). Cosine and
    linear then fall from 1 at update `warmup` towards 0 at update `max_steps`, which never runs: the last
    update, `max_steps - 1`, still moves the weights (linear: at lr / (max_steps - warmup)).
    """
    warmup = cfg.warmup_steps
    if warmup and step < warmup:
        return (step + 1) / warmup
    if cfg.schedule == "inverse_sqrt":  # the paper counts updates from 1
        return math.sqrt(warmup / (step + 1)) if warmup else 1.0 / math.sqrt(step + 1)
    if cfg.schedule in ("constant", "plateau"):
        return 1.0
    progress = min(1.0, (step - warmup) / max(1, cfg.max_steps - warmup))
    if cfg.schedule == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    return 1.0 - progress  # linear


class Schedule:
    """Sets every parameter group's rate to `lr * lr_factor(step) * plateau_scale` before each update.

    Call `step()` after each optimizer update and, for `schedule: plateau`,
    `observe(metric)` after each validation. A group whose rate is a tensor
    (`nmt.train.graphs`) gets the new rate written into that tensor, on its device.

    Attributes:
        lr: the rate set for the next update (a float, whatever the groups hold).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> None:
        self.optimizer, self.cfg = optimizer, cfg
        self.steps = 0  # updates done
        self.scale = 1.0  # product of the plateau reductions so far
        self.best: float | None = None
        self.bad = 0  # validations since `best`
        self._apply()

    def step(self) -> None:
        self.steps += 1
        self._apply()

    def unstep(self) -> None:
        """Take back one `step()`: the training loop learns of a skipped update after stepping.

        It learns of it one update late unless the next step logs, validates or saves (`nmt.train.loop`),
        so the update queued meanwhile has already run at the rate of the step after: one update a skip.
        """
        self.steps -= 1
        self._apply()

    def observe(self, metric: float, *, higher_is_better: bool) -> bool:
        """Feed one validation result; True when the plateau schedule lowered the rate. Validations during
        warm-up are not counted: the rate is still rising to `train.lr` there."""
        if self.cfg.schedule != "plateau" or self.steps < self.cfg.warmup_steps:
            return False
        if self.best is None or (metric > self.best if higher_is_better else metric < self.best):
            self.best, self.bad = metric, 0
            return False
        self.bad += 1
        if self.bad <= self.cfg.plateau_patience:
            return False
        self.scale *= self.cfg.plateau_factor
        self.bad = 0
        self._apply()
        return True

    def get_last_lr(self) -> list[float]:
        return [self.lr for _ in self.optimizer.param_groups]

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "scale": self.scale, "best": self.best, "bad": self.bad}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if "last_epoch" in state:  # a LambdaLR state, from checkpoints of earlier versions
            state = {"steps": state["last_epoch"]}
        self.steps = state["steps"]
        self.scale = state.get("scale", 1.0)
        self.best = state.get("best")
        self.bad = state.get("bad", 0)
        self._apply()

    def _apply(self) -> None:
        self.lr = self.cfg.lr * lr_factor(self.steps, self.cfg) * self.scale
        filled = set()
        for group in self.optimizer.param_groups:
            rate = group["lr"]
            if not isinstance(rate, Tensor):
                group["lr"] = self.lr
            elif id(rate) not in filled:  # read where it lies by recorded updates (`nmt.train.graphs`)
                rate.fill_(self.lr)
                filled.add(id(rate))


def build_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig) -> Schedule:
    return Schedule(optimizer, cfg)
