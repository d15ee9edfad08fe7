import copy
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
def test_decaying_schedules_fall_from_the_full_rate_towards_zero_at_max_steps(schedule):
    cfg = TrainConfig(warmup_steps=10, max_steps=110, schedule=schedule)
    assert lr_factor(9, cfg) == pytest.approx(1.0)  # warm-up's last update
    assert lr_factor(10, cfg) == pytest.approx(1.0)  # the decay starts at the full rate
    assert lr_factor(60, cfg) == pytest.approx(0.5)  # half way from update 10 to 110
    assert lr_factor(110, cfg) == pytest.approx(0.0)  # at max_steps, which no update reaches
    decay = [lr_factor(s, cfg) for s in range(10, 110)]
    assert all(a > b for a, b in zip(decay, decay[1:]))


@pytest.mark.parametrize("schedule", ["cosine", "linear"])
def test_the_last_update_of_a_decaying_schedule_still_moves_the_weights(schedule):
    """Update max_steps - 1 is the last a run makes: at rate 0 it would be spent for nothing."""
    cfg = TrainConfig(lr=1.0, warmup_steps=10, max_steps=110, schedule=schedule)
    sched = build_scheduler(build_optimizer(torch.nn.Linear(2, 2), cfg, torch.device("cpu")), cfg)
    for _ in range(cfg.max_steps - 1):
        sched.step()
    expected = 1 / 100 if schedule == "linear" else 0.5 * (1 + math.cos(math.pi * 99 / 100))
    assert sched.lr == pytest.approx(expected) and sched.lr > 0


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


def test_plateau_lowers_the_rate_after_patience_and_its_state_round_trips():
    model = torch.nn.Linear(2, 2)
    cfg = TrainConfig(lr=1.0, warmup_steps=2, schedule="plateau", plateau_factor=0.5, plateau_patience=1)
    opt = build_optimizer(model, cfg, torch.device("cpu"))
    sched = build_scheduler(opt, cfg)
    for _ in range(3):
        sched.step()
    assert sched.get_last_lr() == [1.0, 1.0]  # warmed up, then constant
    lowered = [sched.observe(bleu, higher_is_better=True) for bleu in (10.0, 12.0, 11.0, 12.0, 11.5)]
    assert lowered == [False, False, False, True, False]  # 2 validations without beating 12.0 > patience 1
    assert opt.param_groups[0]["lr"] == 0.5
    restored = build_scheduler(build_optimizer(model, cfg, torch.device("cpu")), cfg)
    restored.load_state_dict(sched.state_dict())
    assert restored.get_last_lr() == [0.5, 0.5] and restored.state_dict() == sched.state_dict()
    assert sched.observe(1.0, higher_is_better=False) is False  # loss: lower is better, and a new best


def test_other_schedules_ignore_validation_and_lambda_lr_states_load():
    model = torch.nn.Linear(2, 2)
    cfg = TrainConfig(lr=1.0, warmup_steps=4)
    sched = build_scheduler(build_optimizer(model, cfg, torch.device("cpu")), cfg)
    assert not any(sched.observe(0.0, higher_is_better=True) for _ in range(5))
    sched.load_state_dict({"last_epoch": 3, "base_lrs": [1.0, 1.0], "_step_count": 4})  # a checkpoint of an earlier version
    assert sched.get_last_lr()[0] == pytest.approx(lr_factor(3, cfg))


@pytest.mark.parametrize("saved_fused", [None, False])
def test_optimizer_state_saved_without_the_fused_kernel_resumes_with_it(saved_fused):
    """A checkpoint from a torch or device without a fused kernel: the live optimizer keeps its own, and its
    first update after loading is the one the saved optimizer would have made."""
    from nmt.config import TrainConfig
    from nmt.train.optim import build_optimizer, load_optimizer_state
    from nmt.train.step import step_unless

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    x = torch.randn(5, 3)
    saved_opt = torch.optim.Adam([{"params": [model[0].weight], "weight_decay": 0.0},
                                  {"params": [model[0].bias, model[1].weight, model[1].bias], "weight_decay": 0.0}],
                                 lr=1e-3, betas=(0.9, 0.98), eps=1e-9, foreach=False, fused=saved_fused)
    for _ in range(2):
        saved_opt.zero_grad()
        model(x).square().sum().backward()
        saved_opt.step()
    saved = copy.deepcopy(saved_opt.state_dict())  # as read from a checkpoint: no tensor shared with saved_opt
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert [g["fused"] for g in saved["param_groups"]] == [saved_fused] * 2

    live = build_optimizer(model, TrainConfig(lr=1e-3, eps=1e-9), torch.device("cpu"))
    assert live.defaults["fused"]  # this torch has a fused CPU kernel
    load_optimizer_state(live, model, saved, weights)
    assert [g["fused"] for g in live.param_groups] == [True, True]
    live.zero_grad()
    model(x).square().sum().backward()
    step_unless(live, torch.tensor(False))  # raised before: foreach Adam given the fused kernel's found_inf
    after_live = [p.detach().clone() for p in model.parameters()]

    model.load_state_dict(weights)
    saved_opt.zero_grad()
    model(x).square().sum().backward()
    saved_opt.step()
    for got, expected in zip(after_live, model.parameters(), strict=True):
        torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("progress", [0.25, 0.75])
def test_each_schedule_follows_its_own_curve_after_warm_up(progress):
    """Where the curves part: a quarter and three quarters of the way from the end of warm-up to `max_steps`,
    cosine is half a cosine period, 0.5 * (1 + cos(pi * progress)), linear 1 - progress, and the others ignore
    `max_steps`: inverse_sqrt is sqrt(warmup / step) (Vaswani et al., 2017, eq. 3, steps counted from 1),
    constant and plateau (before any validation) 1."""
    warmup, max_steps = 10, 110
    step = warmup + round(progress * (max_steps - warmup))  # 0-based: the update about to run
    expected = {
        "cosine": 0.5 * (1 + math.cos(math.pi * progress)),
        "linear": 1 - progress,
        "inverse_sqrt": math.sqrt(warmup / (step + 1)),
        "constant": 1.0,
        "plateau": 1.0,
    }
    assert expected["cosine"] != pytest.approx(expected["linear"])  # the point tells them apart
    for schedule, factor in expected.items():
        cfg = TrainConfig(warmup_steps=warmup, max_steps=max_steps, schedule=schedule)
        assert lr_factor(step, cfg) == pytest.approx(factor, rel=1e-12), schedule
