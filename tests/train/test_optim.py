import math

import pytest
import torch

from nmt.config import TrainConfig
from nmt.train.optim import build_optimizer, build_scheduler, lr_factor


def test_inverse_sqrt_warms_up_linearly_then_decays():
    cfg = TrainConfig(warmup_steps=100, lr=1.0)
    factors = [lr_factor(s, cfg) for s in range(400)]
    assert factors[0] == pytest.approx(0.01)
    assert factors[99] == pytest.approx(1.0)
    assert factors[399] == pytest.approx(math.sqrt(100 / 400))
    assert all(a < b for a, b in zip(factors[:99], factors[1:100]))


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_decaying_schedules_end_at_zero(schedule):
    cfg = TrainConfig(warmup_steps=10, max_steps=110, schedule=schedule)
    assert lr_factor(9, cfg) == pytest.approx(1.0)
    assert lr_factor(59, cfg) == pytest.approx(0.5)
    assert lr_factor(109, cfg) == pytest.approx(0.0)


def test_scheduler_drives_optimizer_lr_and_no_decay_on_biases():
    model = torch.nn.Linear(4, 4)
    cfg = TrainConfig(lr=0.1, warmup_steps=4, weight_decay=0.01, optimizer="adamw")
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg)
    assert opt.param_groups[0]["lr"] == pytest.approx(0.025)
    for _ in range(3):
        opt.step()
        sched.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(0.1)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.01, 0.0]
    assert opt.param_groups[1]["params"][0] is model.bias
