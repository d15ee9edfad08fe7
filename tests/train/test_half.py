"""bf16 (and fp16) training on a half copy of the model: no casts in the passes, fp32 master weights, autocast's
gradients; fp16's gradient scaler on the fp32 gradients."""

from __future__ import annotations

import logging
import math

import pytest
import torch

from nmt.checkpoint import load_checkpoint
from nmt.config import TrainConfig, config_from_dict
from nmt.data.collate import collate
from nmt.data.tokenizer import PAD_ID
from nmt.distributed import Dist
from nmt.runtime import HALF_DTYPES, autocast, grad_scaler
from nmt.train.half import HalfCopy
from nmt.train.loop import train
from nmt.train.loss import Objective
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.setup import prepare_step
from nmt.train.step import Trainable, train_step
from tests.models.tiny import tiny_model
from tests.op_counts import OpCounter
from tests.train.helpers import random_rows, tiny_raw, weights

CPU = torch.device("cpu")


def _model(kind: str = "transformer", seed: int = 0, tie: str = "none") -> torch.nn.Module:
    return tiny_model(kind, seed=seed, vocab=23, transformer=dict(max_positions=64), tie_embeddings=tie).train()


def _batch(seed: int = 0, n: int = 6) -> list[dict]:
    return random_rows(seed, n)


def _trainable(model: torch.nn.Module, tc: TrainConfig, optimizer: torch.optim.Optimizer | None = None) -> Trainable:
    optimizer = optimizer or build_optimizer(model, tc, CPU)
    t = Trainable(model=model, objective=Objective(model, pad_id=PAD_ID, smoothing=0.1), optimizer=optimizer,
                  scheduler=build_scheduler(optimizer, tc), scaler=grad_scaler(CPU, tc.precision))
    prepare_step(t, tc, CPU, Dist())
    return t


def _casts_in_one_pass(objective: torch.nn.Module, precision: str) -> int:
    b = collate(_batch())
    with OpCounter() as ops:
        with autocast(CPU, precision):
            loss, _ = objective(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
        loss.backward()
    return ops.counts["_to_copy"]


def test_the_bf16_copy_runs_forward_and_backward_without_weight_casts():
    model = _model()
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    autocast_casts = _casts_in_one_pass(Objective(model, pad_id=PAD_ID, smoothing=0.1), "bf16")
    half = HalfCopy(model, torch.bfloat16)
    half_casts = _casts_in_one_pass(Objective(half.copy, pad_id=PAD_ID, smoothing=0.1), "fp32")
    assert autocast_casts >= 3 * linears  # weight and bias cast forward, gradient cast back, per layer
    assert half_casts <= 3  # the loss's fp32 rows and mask only, whatever the model's size


def test_the_copy_shares_the_models_tying_and_follows_its_weights():
    model = _model(tie="all")
    half = HalfCopy(model, torch.bfloat16)
    assert len(half.halves) == len(half.masters) == len(list(model.parameters()))
    assert all(h.dtype == torch.bfloat16 for h in half.halves)
    embeddings = {n: p for n, p in half.copy.named_parameters(remove_duplicate=False) if "weight" in n}
    tied = [n for n, p in model.named_parameters(remove_duplicate=False)
            if any(p is q for m, q in model.named_parameters(remove_duplicate=False) if m != n)]
    assert tied  # the tiny model does tie its embeddings
    for n in tied:
        twins = [m for m in tied if m != n and model.get_parameter(m) is model.get_parameter(n)]
        assert all(embeddings[m] is embeddings[n] for m in twins)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    half.refresh()
    for p, h in zip(half.masters, half.halves, strict=True):
        assert torch.equal(h, p.detach().to(torch.bfloat16))


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
@pytest.mark.parametrize("half", ["bf16", "fp16"])
def test_a_half_step_on_the_copy_is_as_close_to_fp32_as_autocast(kind, half):
    """The gradients reaching the fp32 weights match fp32 training's as well as autocast's do (in fp16, through
    the gradient scaler, which scales the loss and unscales the fp32 gradients)."""
    batch = [collate(_batch(1))]
    grads = {}
    for name, precision, half_weights in (("fp32", "fp32", True), ("half", half, True), ("autocast", half, False)):
        tc = TrainConfig(precision=precision, half_weights=half_weights, clip_norm=0.0, warmup_steps=0, lr=1.0)
        model = _model(kind)
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        t = _trainable(model, tc, torch.optim.SGD(model.parameters(), lr=1.0))  # the update is minus the gradient
        assert (t.half is not None) == (name == "half")
        result = train_step(t, batch, tc, CPU)
        assert result.updated and math.isfinite(float(result.loss))
        assert all(p.dtype == torch.float32 for p in model.parameters())
        grads[name] = torch.cat([(before[n] - p.detach()).flatten() for n, p in model.named_parameters()])
        if t.half is not None:  # the copy holds the updated weights, and no gradients of its own
            for p, h in zip(t.half.masters, t.half.halves, strict=True):
                assert torch.equal(h, p.detach().to(HALF_DTYPES[half])) and h.grad is None
        if half == "fp16" and name != "fp32":
            assert t.scaler.is_enabled() and t.scaler.get_scale() == 2.0**16  # scaled, no overflow
    exact = grads["fp32"]
    half_error = float((grads["half"] - exact).norm() / exact.norm())
    autocast_error = float((grads["autocast"] - exact).norm() / exact.norm())
    assert 0 < half_error < 0.05  # bf16's or fp16's rounding, nothing worse
    assert half_error < 2 * autocast_error


def test_accumulated_bf16_batches_add_up_in_fp32():
    """Two accumulated micro-batches update as the one batch holding both (single process: fp32 sums), to
    bf16's rounding (0.3% of the update's norm); averaging the two micro-batches' mean losses instead of
    weighting each token alike (30 and 24 target tokens here) would be off by far more than the bound."""
    rows = _batch(2, n=8)
    halves, whole = [collate(rows[:4]), collate(rows[4:])], [collate(rows)]

    def update(batches: list, accumulate: int) -> torch.Tensor:  # SGD at rate 1: the update is the gradient
        tc = TrainConfig(precision="bf16", clip_norm=0.0, warmup_steps=0, lr=1.0, accumulate=accumulate)
        model = _model()
        before = [p.detach().clone() for p in model.parameters()]
        train_step(_trainable(model, tc, torch.optim.SGD(model.parameters(), lr=1.0)), batches, tc, CPU)
        return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, model.parameters(), strict=True)])

    exact = update(whole, 1)
    accumulated = update(halves, 2)
    mean_of_means = (update(halves[:1], 1) + update(halves[1:], 1)) / 2
    assert float((accumulated - exact).norm() / exact.norm()) < 0.01
    assert float((mean_of_means - exact).norm() / exact.norm()) > 0.05
    torch.testing.assert_close(accumulated, exact, rtol=0.05, atol=2e-3)


def test_each_update_writes_over_the_last_updates_fp32_gradients_in_the_same_tensors():
    """The fp32 gradients stay allocated from one update to the next: an update's first backward writes over
    them, its later ones add to them, and a weight that got no gradient in an update has none."""
    torch.manual_seed(0)
    model = torch.nn.ModuleDict(dict(a=torch.nn.Linear(3, 4), b=torch.nn.Linear(3, 4)))
    half = HalfCopy(model, torch.bfloat16)
    x = torch.randn(5, 3, dtype=torch.bfloat16)

    def backward(branch: str) -> torch.Tensor:  # the copy's gradient of one branch's weight
        half.copy[branch](x).square().sum().backward()
        grad = half.copy[branch].weight.grad.float()
        half.grads_to_master()
        return grad

    first = backward("a")
    kept = model.a.weight.grad
    assert torch.equal(kept, first) and model.b.weight.grad is None
    half.refresh()  # after the optimizer: a new update
    again = backward("a")
    assert model.a.weight.grad is kept and torch.equal(kept, again)  # written over, not added to
    half.refresh()
    only_b = backward("b")
    assert model.a.weight.grad is None and torch.equal(model.b.weight.grad, only_b)  # nothing left of update 2
    more = backward("b")  # a second micro-batch of the same update adds to the first
    torch.testing.assert_close(model.b.weight.grad, only_b + more)
    assert all(h.grad is None for h in half.halves)


@pytest.mark.parametrize("half", ["bf16", "fp16"])
def test_a_skipped_half_update_leaves_weights_and_copy_alone(half):
    tc = TrainConfig(precision=half, half_weights=True, lr=1e-3, warmup_steps=0, clip_norm=1.0)
    model = _model()
    t = _trainable(model, tc)
    assert train_step(t, [collate(_batch(1))], tc, CPU).updated
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    t.half.copy.output.weight.register_hook(lambda g: torch.full_like(g, math.nan))  # a poisoned gradient
    assert not train_step(t, [collate(_batch(2))], tc, CPU).updated
    for n, p in model.named_parameters():
        assert torch.equal(p.detach(), before[n]), n
    for p, h in zip(t.half.masters, t.half.halves, strict=True):
        assert torch.equal(h, p.detach().to(HALF_DTYPES[half]))
    if half == "fp16":
        assert t.scaler.get_scale() == 2.0**15  # lowered once


def test_fp16_gradients_that_overflow_on_the_copy_skip_the_update_and_lower_the_scale_until_they_fit():
    """A loss scale far too large makes the copy's fp16 gradients inf; they reach the fp32 gradients as inf, the
    scaler skips those updates and halves its scale each time, and the first update that fits is applied."""
    tc = TrainConfig(precision="fp16", half_weights=True, lr=1e-3, warmup_steps=0)
    model = _model()
    t = _trainable(model, tc)
    t.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**40)
    batch = [collate(_batch(1))]
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    updated = [train_step(t, batch, tc, CPU).updated for _ in range(40)]
    skipped = updated.index(True)
    assert skipped > 10 and all(updated[skipped:])  # halved until the scaled gradients fit in fp16
    assert t.scaler.get_scale() == 2.0 ** (40 - skipped)
    assert not any(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters() if p.ndim > 1)


def test_half_training_on_the_copy_learns_a_batch_as_fp32_does():
    batch = [collate(_batch(3))]
    curves = {}
    for precision in ("fp32", "bf16", "fp16"):
        tc = TrainConfig(precision=precision, half_weights=True, lr=1e-2, warmup_steps=0)
        t = _trainable(_model(), tc)
        assert (t.half is None) == (precision == "fp32")
        curves[precision] = [float(train_step(t, batch, tc, CPU).loss) for _ in range(40)]
    for half in ("bf16", "fp16"):
        assert curves[half][-1] < 0.5 * curves[half][0]
        assert curves[half][-1] == pytest.approx(curves["fp32"][-1], rel=0.05)


@pytest.mark.slow
def test_a_compiled_bf16_copy_gives_the_eager_copys_loss_and_gradients():
    """`train.compile` compiles the objective over the bf16 copy: same loss and gradients as eager."""
    batch = collate(_batch(4))
    args = (batch.src, batch.src_pad_mask, batch.tgt_in, batch.tgt_out)
    results = []
    for compile_ in (False, True):
        tc = TrainConfig(precision="bf16", compile=compile_)
        t = _trainable(_model(), tc)
        assert compile_ == (type(t.objective) is not Objective)  # compiled, not the eager fallback
        loss, nll = t.objective(*args)
        loss.backward()
        t.half.grads_to_master()
        results.append((loss.detach(), nll.detach(), [p.grad.clone() for p in t.model.parameters()]))
    (loss, nll, grads), (c_loss, c_nll, c_grads) = results
    torch.testing.assert_close(c_loss, loss, rtol=2e-2, atol=0.0)
    torch.testing.assert_close(c_nll, nll, rtol=2e-2, atol=0.0)
    exact = torch.cat([g.flatten() for g in grads])
    assert float((torch.cat([g.flatten() for g in c_grads]) - exact).norm() / exact.norm()) < 0.03


def test_a_run_on_an_fp16_copy_says_so_saves_its_loss_scale_and_resumes(small_corpus, tmp_path, caplog):
    """`train.half_weights: true` with fp16, through `nmt.train.loop.train`: the log names the copy, the checkpoints
    hold the fp32 weights and the scaler's state, and the run resumes from them on the copy."""
    raw = tiny_raw(small_corpus, tmp_path / "run", max_steps=6, precision="fp16", half_weights=True)
    with caplog.at_level(logging.INFO, logger="nmt"):
        train(config_from_dict(raw))
    assert "tokens per update; fp16 on a copy of the weights on cpu" in caplog.text
    saved = load_checkpoint(tmp_path / "run" / "ckpt_6.pt")
    assert saved["scaler"]["scale"] == 2.0**16 and saved["scaler"]["_growth_tracker"] == 6  # six updates, none skipped
    assert all(w.dtype == torch.float32 for w in weights(tmp_path / "run" / "ckpt_6.pt").values())
    raw["train"]["max_steps"] = 9
    summary = train(config_from_dict(raw))
    assert summary["step"] == 9
    assert load_checkpoint(tmp_path / "run" / "ckpt_9.pt")["scaler"]["_growth_tracker"] == 9  # carried on
