"""`train.cuda_graphs`: what it refuses (here), and on a GPU that recorded updates train exactly as eager ones."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from nmt.config import TrainConfig
from nmt.data.batching import Padding, collate
from nmt.data.tokenizer import PAD_ID
from nmt.errors import UserError
from nmt.runtime import Dist
from nmt.train.data import batch_padding
from nmt.train.graphs import EAGER_USES, _rates_as_floats, check_update_graphs
from nmt.train.loss import Objective
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.setup import prepare_step
from nmt.train.step import Trainable, train_step, update
from tests.models.tiny import tiny_model
from tests.train.helpers import random_rows

CUDA = torch.device("cuda")


@pytest.mark.parametrize(("settings", "needs"), [
    (dict(accumulate=2), "accumulate: 1 (now 2)"),
    (dict(precision="fp16"), "precision fp32, or bf16 with half_weights: true (now fp16)"),
    (dict(precision="bf16", half_weights=False), "(now bf16 under autocast)"),
    (dict(batch_shapes="free"), "batch_shapes auto or static (now free)"),
    (dict(compile=True, compile_mode="reduce-overhead"), "without CUDA graphs of its own"),
])
def test_the_config_refuses_update_graphs_with_what_they_cannot_record(settings, needs):
    with pytest.raises(ValueError, match="cuda_graphs true records one whole update per batch shape") as err:
        TrainConfig(cuda_graphs=True, **settings)
    assert needs in str(err.value)
    TrainConfig(cuda_graphs=True, precision="bf16", compile=True, compile_mode="max-autotune-no-cudagraphs")


def test_update_graphs_are_refused_off_cuda_under_torchrun_and_for_a_model_that_waits_for_the_gpu():
    tc = TrainConfig(cuda_graphs=True)
    with pytest.raises(UserError, match=r"needs a CUDA device \(training runs on cpu\)"):
        check_update_graphs(tc, torch.device("cpu"), Dist())
    with pytest.raises(UserError, match="records the updates of one process, and this run has 2"):
        check_update_graphs(tc, CUDA, Dist(rank=0, world_size=2))
    with pytest.raises(UserError, match="the rnn/luong/general model reads its source lengths on the host"):
        check_update_graphs(tc, CUDA, Dist(), tiny_model("rnn"))
    check_update_graphs(tc, CUDA, Dist(), tiny_model())  # the Transformer can be recorded


def test_update_graphs_make_auto_batch_shapes_static_on_cuda_only():
    tc = TrainConfig(cuda_graphs=True)
    assert batch_padding(tc, CUDA).fill_tokens == tc.max_tokens
    assert batch_padding(replace(tc, cuda_graphs=False), CUDA).fill_tokens == 0
    assert batch_padding(tc, torch.device("cpu")).fill_tokens == 0


def _trainable(seed: int, tc: TrainConfig, device: torch.device, **model) -> Trainable:
    m = tiny_model(seed=seed, vocab=23, transformer=dict(max_positions=64), **model).to(device).train()
    optimizer = build_optimizer(m, tc, device)
    return Trainable(model=m, objective=Objective(m, pad_id=PAD_ID, smoothing=0.1), optimizer=optimizer,
                     scheduler=build_scheduler(optimizer, tc),
                     scaler=torch.amp.GradScaler(device.type, enabled=False))


def test_an_update_that_counts_its_tokens_on_the_device_is_the_same_update():
    tc = TrainConfig(warmup_steps=2, lr=0.01)
    batches = [collate(random_rows(seed, n), padding=Padding(multiple=8, fill_tokens=96)) for seed, n in
               ((0, 5), (1, 3))]
    assert all(b.ntokens < b.tgt_out.numel() for b in batches)  # filled batches: padding and empty pairs
    host, device = _trainable(0, tc, torch.device("cpu")), _trainable(0, tc, torch.device("cpu"))
    for b in batches:
        a, c = update(host, [b], tc, torch.device("cpu")), update(device, [b], tc, torch.device("cpu"),
                                                                  tokens_on_device=True)
        assert c.tokens == a.tokens == b.ntokens and c.update_tokens == b.ntokens
        assert torch.allclose(c.loss, a.loss) and torch.allclose(c.grad_norm, a.grad_norm)
    for p, q in zip(host.model.parameters(), device.model.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-7)


def test_a_schedule_writes_a_tensor_rate_in_place_and_checkpoints_keep_it_a_float():
    tc = TrainConfig(warmup_steps=4, lr=0.1)
    model = torch.nn.Linear(3, 2)
    optimizer = build_optimizer(model, tc, torch.device("cpu"))
    schedule = build_scheduler(optimizer, tc)
    rates = [torch.tensor(float(g["lr"])) for g in optimizer.param_groups]
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"] = rate
    optimizer.register_state_dict_post_hook(_rates_as_floats)
    for step in range(1, 4):
        schedule.step()
        assert schedule.lr == pytest.approx(0.1 * (step + 1) / 4)
        assert all(g["lr"] is r for g, r in zip(optimizer.param_groups, rates, strict=True))  # the same tensors
        assert all(float(r) == pytest.approx(schedule.lr) for r in rates)
    saved = optimizer.state_dict()
    assert [g["lr"] for g in saved["param_groups"]] == pytest.approx([schedule.lr] * 2)
    assert all(type(g["lr"]) is float for g in saved["param_groups"])
    assert all(isinstance(g["lr"], torch.Tensor) for g in optimizer.param_groups)  # the live ones stay tensors


def _filled(seed: int, n: int, length: int) -> object:
    """A batch filled to the static shape of its length bucket (one shape per `length`), on the GPU."""
    rows = random_rows(seed, n)
    return collate(rows, padding=Padding(multiple=length, fill_tokens=12 * length)).to(CUDA)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_recorded_updates_train_as_eager_ones_and_skip_a_non_finite_update_on_the_device(precision):
    tc = TrainConfig(precision=precision, warmup_steps=3, lr=0.01, batch_shapes="static", max_tokens=12 * 16,
                     cuda_graphs=True)
    batches = [_filled(seed, 5 + seed % 4, 16 if seed % 2 else 32) for seed in range(12)]  # two shapes, 6 each
    assert len({(*b.src.shape, *b.tgt_in.shape) for b in batches}) == 2
    # attention written out (matrix products), whose backward adds no atomics: eager and recorded updates can
    # then differ only where bf16 rounds a matrix product of another cuBLAS algorithm differently
    model = dict(transformer=dict(max_positions=64, attention_impl="manual"))
    eager, graphed = _trainable(0, replace(tc, cuda_graphs=False), CUDA, **model), _trainable(0, tc, CUDA, **model)
    close = dict(rtol=1e-4, atol=1e-5) if precision == "fp32" else dict(rtol=1e-2, atol=1e-3)
    prepare_step(eager, replace(tc, cuda_graphs=False), CUDA, Dist(), shapes=2)
    prepare_step(graphed, tc, CUDA, Dist(), shapes=2)
    for b in batches:
        e, g = train_step(eager, [b], tc, CUDA), train_step(graphed, [b], tc, CUDA)
        assert torch.allclose(g.loss, e.loss, **close) and torch.allclose(g.grad_norm, e.grad_norm, **close)
        assert g.tokens == e.tokens == b.ntokens and not bool(g.skipped)
    assert graphed.update_graphs.count == 2  # each shape recorded after its eager uses
    assert all(n > EAGER_USES for n in graphed.update_graphs.uses.values())
    for p, q in zip(eager.model.parameters(), graphed.model.parameters(), strict=True):
        assert torch.allclose(q, p, **close)
    assert graphed.scheduler.lr == eager.scheduler.lr
    assert [float(g["lr"]) for g in graphed.optimizer.param_groups] == pytest.approx([graphed.scheduler.lr] * 2)

    # a NaN in the decoder's feed-forward block makes every loss non-finite: the replayed update is skipped on
    # the device
    before = [p.detach().clone() for p in graphed.model.parameters()]
    moments = [s["exp_avg"].clone() for s in graphed.optimizer.state.values()]
    with torch.no_grad():
        graphed.model.get_parameter("decoder.layers.0.feed_forward.down.bias")[0] = float("nan")
    poisoned = [p.detach().clone() for p in graphed.model.parameters()]
    if graphed.half is not None:
        graphed.half.refresh()
    r = train_step(graphed, [batches[-1]], tc, CUDA)
    assert bool(r.skipped)
    assert all(torch.equal(p.nan_to_num(), q.nan_to_num())  # NaN is not equal to itself
               for p, q in zip(graphed.model.parameters(), poisoned, strict=True))
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(graphed.optimizer.state.values(), moments, strict=True))
    assert sum(not torch.equal(p, b) for p, b in zip(poisoned, before, strict=True)) == 1


@pytest.mark.gpu
def test_a_recorded_update_draws_new_dropout_masks_at_every_replay():
    tc = TrainConfig(cuda_graphs=True, warmup_steps=1, lr=1e-12, batch_shapes="static", max_tokens=12 * 16)
    t = _trainable(0, tc, CUDA, transformer=dict(max_positions=64, dropout=0.3))
    prepare_step(t, tc, CUDA, Dist(), shapes=1)
    b = _filled(0, 6, 16)
    losses = [float(train_step(t, [b], tc, CUDA).loss) for _ in range(EAGER_USES + 3)]
    assert t.update_graphs.count == 1
    replays = losses[EAGER_USES:]
    assert len(set(replays)) == len(replays)  # a frozen random state would give one loss, again and again
