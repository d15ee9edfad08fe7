"""`train.cuda_graphs`: what it refuses, and that recorded updates train as eager ones: on a GPU with CUDA
graphs, and on a CPU with the updates recorded by `make_fx` (`TracedUpdates`), which keeps what a graph keeps."""

from __future__ import annotations

import json
import logging
import re
from dataclasses import replace

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from nmt.checkpoint import load_checkpoint
from nmt.config import TrainConfig, config_from_dict
from nmt.data.collate import Padding, collate
from nmt.data.tokenizer import PAD_ID
from nmt.distributed import Dist
from nmt.errors import UserError
from nmt.models.rnn_encoder import RNNEncoder
from nmt.runtime import grad_scaler
from nmt.train.data import batch_padding
from nmt.train.graphs import (
    EAGER_USES,
    UpdateGraphs,
    _as_without_graphs,
    _results,
    check_update_graphs,
    resolve_update_graphs,
    switched_off,
)
from nmt.train.loop import train_run
from nmt.train.loss import Objective
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.setup import build_run, prepare_step
from nmt.train.step import Trainable, train_step, update
from tests.models.tiny import tiny_model
from tests.train.helpers import random_rows, tiny_raw, weights, without_key_biases

CUDA = torch.device("cuda")


@pytest.mark.parametrize(("settings", "needs"), [
    (dict(batch_shapes="free"), "batch_shapes auto or static (now free)"),
    (dict(compile=True, compile_mode="reduce-overhead"), "without CUDA graphs of its own"),
])
def test_the_config_refuses_update_graphs_with_what_they_cannot_record(settings, needs):
    with pytest.raises(ValueError, match="cuda_graphs true records one whole update per batch shape") as err:
        TrainConfig(cuda_graphs=True, **settings)
    assert needs in str(err.value)
    TrainConfig(cuda_graphs=True, precision="bf16", compile=True, compile_mode="max-autotune-no-cudagraphs")
    TrainConfig(cuda_graphs=True, accumulate=4)  # recorded in parts: a graph per batch shape, one for the end
    TrainConfig(cuda_graphs=True, precision="fp16")  # the gradient scaler's checks and steps run on the device
    TrainConfig(cuda_graphs=True, precision="bf16", half_weights=False)  # autocast's casts are kernels like others


def test_update_graphs_are_refused_off_cuda_under_torchrun_and_for_a_model_that_waits_for_the_gpu():
    tc = TrainConfig(cuda_graphs=True)
    with pytest.raises(UserError, match=r"needs a CUDA device \(training runs on cpu\)"):
        check_update_graphs(tc, torch.device("cpu"), Dist())
    with pytest.raises(UserError, match="records the updates of one process, and this run has 2"):
        check_update_graphs(tc, CUDA, Dist(rank=0, world_size=2))
    with pytest.raises(UserError, match=r"the Linear model's does; set train.cuda_graphs: false"):
        check_update_graphs(tc, CUDA, Dist(), torch.nn.Linear(2, 2))
    check_update_graphs(tc, CUDA, Dist(), tiny_model())  # the Transformer can be recorded
    check_update_graphs(tc, CUDA, Dist(), tiny_model("rnn", rnn=dict(cell="lstm")))  # and the RNNs


@pytest.mark.parametrize(("settings", "device", "processes", "model", "why_not"), [
    ({}, CUDA, 1, "transformer", ""),
    (dict(precision="bf16"), CUDA, 1, "transformer", ""),  # on the bf16 copy
    (dict(accumulate=2), CUDA, 1, "transformer", ""),
    ({}, torch.device("cpu"), 1, "transformer", "training runs on cpu"),
    ({}, CUDA, 2, "transformer", "2 processes"),
    ({}, CUDA, 1, "rnn", "the rnn model (auto records the Transformer's updates only)"),
    (dict(precision="fp16"), CUDA, 1, "transformer", "precision fp16 under autocast (auto"),
    (dict(precision="bf16", half_weights=False), CUDA, 1, "transformer", "precision bf16 under autocast (auto"),
    (dict(precision="fp16", half_weights=True), CUDA, 1, "transformer", "precision fp16 on an fp16 copy (auto"),
    (dict(batch_shapes="free"), CUDA, 1, "transformer", "batch_shapes auto or static (now free)"),
    (dict(compile=True, compile_mode="reduce-overhead"), CUDA, 1, "transformer", "without CUDA graphs of its own"),
])
def test_auto_records_the_updates_of_a_transformer_on_one_cuda_device_with_settings_it_can_record(
        settings, device, processes, model, why_not):
    tc = TrainConfig(**settings)
    assert tc.cuda_graphs == "auto"
    on, reason = resolve_update_graphs(tc, device, Dist(world_size=processes), model)
    assert on is (why_not == "") and why_not in reason and bool(reason) is not on
    assert batch_padding(tc, CUDA) == batch_padding(replace(tc, cuda_graphs=False), CUDA)  # unresolved: off


def test_a_given_true_or_false_is_kept_whatever_the_device_and_model():
    for given in (True, False):
        for device, model in ((CUDA, "rnn"), (torch.device("cpu"), "transformer")):
            assert resolve_update_graphs(TrainConfig(cuda_graphs=given), device, Dist(), model) == (given, "")


def test_a_run_on_a_cpu_decides_auto_off_and_its_run_directory_keeps_auto(small_corpus, tmp_path):
    # on the CPU whatever the machine: on a GPU machine, `device: auto` is CUDA, where auto records updates
    cfg = config_from_dict(tiny_raw(small_corpus, tmp_path / "run", max_steps=1, device="cpu"))
    assert cfg.train.cuda_graphs == "auto"
    run = build_run(cfg)
    try:
        assert run.cfg.train.cuda_graphs is False and run.trainable.update_graphs is None
        assert run.sampler.batch_list(0)  # free shapes: batches cut as eager updates take them
    finally:
        run.close()
    assert "cuda_graphs: auto" in (tmp_path / "run" / "config.yaml").read_text()


def test_update_graphs_make_auto_batch_shapes_static_on_cuda_only():
    tc = TrainConfig(cuda_graphs=True)
    assert batch_padding(tc, CUDA).fill_tokens == tc.max_tokens
    assert batch_padding(replace(tc, cuda_graphs=False), CUDA).fill_tokens == 0
    assert batch_padding(tc, torch.device("cpu")).fill_tokens == 0


def _trainable(seed: int, tc: TrainConfig, device: torch.device, *, rnn: dict | None = None,
               **transformer) -> Trainable:
    """A tiny Transformer (`transformer` replaces keys of its section), or with `rnn` an RNN, with its optimizer."""
    if rnn is not None:
        m = tiny_model("rnn", seed=seed, vocab=23, rnn=rnn).to(device).train()
    else:
        m = tiny_model(seed=seed, vocab=23, transformer=dict(max_positions=64, **transformer)).to(device).train()
    optimizer = build_optimizer(m, tc, device)
    return Trainable(model=m, objective=Objective(m, pad_id=PAD_ID, smoothing=0.1), optimizer=optimizer,
                     scheduler=build_scheduler(optimizer, tc),
                     scaler=grad_scaler(device, tc.precision))


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


def test_a_schedule_writes_a_tensor_rate_in_place_and_checkpoints_keep_it_a_float_and_not_capturable():
    tc = TrainConfig(warmup_steps=4, lr=0.1)
    model = torch.nn.Linear(3, 2)
    optimizer = build_optimizer(model, tc, torch.device("cpu"))
    schedule = build_scheduler(optimizer, tc)
    rates = [torch.tensor(float(g["lr"])) for g in optimizer.param_groups]
    for group, rate in zip(optimizer.param_groups, rates, strict=True):
        group["lr"], group["capturable"] = rate, True  # as `UpdateGraphs` leaves them
    optimizer.register_state_dict_post_hook(_as_without_graphs)
    for step in range(1, 4):
        schedule.step()
        assert schedule.lr == pytest.approx(0.1 * (step + 1) / 4)
        assert all(g["lr"] is r for g, r in zip(optimizer.param_groups, rates, strict=True))  # the same tensors
        assert all(float(r) == pytest.approx(schedule.lr) for r in rates)
    saved = optimizer.state_dict()
    assert [g["lr"] for g in saved["param_groups"]] == pytest.approx([schedule.lr] * 2)
    assert all(type(g["lr"]) is float for g in saved["param_groups"])
    assert not any(g["capturable"] for g in saved["param_groups"])
    assert all(isinstance(g["lr"], torch.Tensor) and g["capturable"] for g in optimizer.param_groups)  # live ones


class TracedUpdates(UpdateGraphs):
    """`UpdateGraphs` with its two CUDA parts replaced by their likeness on a CPU, for the tests.

    `record` traces the update (or part) with `make_fx`: every aten operation it runs is kept, the tensors it
    reads and writes (parameters, gradients, optimizer state, the batch's buffer, the rates, the loss weight)
    by reference and every other number as it was, which is what a CUDA graph keeps. A replay runs those
    operations again, no Python of the update in between, so a number the host fixed at recording time (a
    token count, a float rate) stays fixed here too. Tracing runs the update once, so what it changed is put
    back; eager updates just run. An RNN's encoder runs as on a GPU, without packing its source (a recording
    cannot keep lengths read on the host). Traced and replayed updates run without oneDNN, whose LSTM backward
    reads a workspace `make_fx` does not keep.
    """

    def __init__(self, t, tc, device):
        super().__init__(t, tc, device)
        _as_on_a_gpu(t)

    def run_eagerly(self, update_):
        return update_()

    def record(self, t, update_):
        state = [*t.model.parameters(), *(t.half.copy.parameters() if t.half is not None else ()),
                 *(p.grad for p in t.model.parameters() if p.grad is not None),
                 *(v for s in t.optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor)),
                 *((self.sums,) if self.in_parts else ())]
        saved, rng = [x.detach().clone() for x in state], torch.get_rng_state()
        scale = t.scaler.state_dict()  # fp16's loss scale and its growth tracker; empty where it is off
        outputs = []
        with _without_onednn(), _one_fake_mode():
            traced = make_fx(lambda: _noting_output(update_(), outputs))()
        with torch.no_grad():
            for x, value in zip(state, saved, strict=True):
                x.copy_(value)
        if scale:
            t.scaler.load_state_dict(scale)  # in place, into the tensors the traced update reads
        torch.set_rng_state(rng)
        results = torch.empty_like(outputs[0])  # on the update's device, as a recording's results are

        def replay() -> None:
            with torch.no_grad(), _without_onednn():  # the recorded operations hold the backward pass already
                results.copy_(traced())

        return replay, results


def _as_on_a_gpu(t: Trainable) -> None:
    """An RNN's encoder, in the model and its bf16 copy, does not pack its source on a CPU either."""
    for model in (t.model, t.half.copy if t.half is not None else None):
        if isinstance(getattr(model, "encoder", None), RNNEncoder):
            model.encoder.pack_off_cuda = False


def _one_fake_mode():
    """One fake-tensor mode for the whole trace (torch makes one per operation otherwise, most of a trace's time)."""
    from torch._guards import TracingContext, tracing
    from torch._subclasses.fake_tensor import FakeTensorMode
    return tracing(TracingContext(FakeTensorMode(allow_fallback_kernels=True)))


def _without_onednn():
    return switched_off(torch.backends.mkldnn)


def _noting_output(x: torch.Tensor, outputs: list) -> torch.Tensor:
    outputs.append(x)
    return x


def _filled(seed: int, n: int, length: int, device: torch.device) -> object:
    """A batch filled to the static shape of its length bucket (one shape per `length`)."""
    rows = random_rows(seed, n)
    return collate(rows, padding=Padding(multiple=length, fill_tokens=12 * length)).to(device)


def _recorded_and_eager(precision: str, device: torch.device, *, compile: bool = False, accumulate: int = 1,
                        transformer: dict | None = None, rnn: dict | None = None
                        ) -> tuple[Trainable, Trainable, list, dict]:
    """Two equal models trained on the same twelve batches of two shapes, one by recorded updates (a CUDA
    graph each on a GPU, `TracedUpdates` on a CPU), one eagerly (both compiled, with `compile`); each
    result compared on the way. With `accumulate` 2, six updates of two batches each, the shapes in every
    order; the groups of batches are returned. `transformer` replaces the model's attention settings; `rnn`
    makes the models tiny RNNs with these settings instead."""
    # Adam's eps well above rounding noise: the key projection's bias has a gradient of zero but for rounding,
    # which Adam with a tiny eps scales up to steps of the full rate, differently for two orders of operations
    precision, _, way = precision.partition("-")  # bf16-autocast: bf16 without the bf16 copy; fp16-copy: with one
    half_weights = {"": "auto", "copy": True, "autocast": False}[way]
    tc = TrainConfig(precision=precision, half_weights=half_weights, warmup_steps=3, lr=0.01, eps=1e-6,
                     batch_shapes="static", max_tokens=12 * 16, cuda_graphs=True, device=device.type, compile=compile,
                     accumulate=accumulate)
    short, long = (10, 20) if rnn is not None else (16, 32)  # an RNN's recording traces each position's steps
    batches = [_filled(seed, 5 + seed % 4, short if seed % 2 else long, device) for seed in range(12)]  # 6 per shape
    assert len({(*b.src.shape, *b.tgt_in.shape) for b in batches}) == 2
    assert len({b.ntokens for b in batches}) > 2  # same shapes, other token counts
    order = {1: [[i] for i in range(12)], 2: [[0, 1], [3, 2], [4, 6], [5, 7], [8, 9], [11, 10]]}[accumulate]
    groups = [[batches[i] for i in group] for group in order]
    # attention written out (matrix products), whose backward adds no atomics: on a GPU, eager and recorded
    # updates then differ only where bf16 rounds a product of another cuBLAS algorithm differently
    model = {"rnn": rnn} if rnn is not None else transformer or {"attention_impl": "manual"}
    eager, recorded = _trainable(0, tc, device, **model), _trainable(0, tc, device, **model)
    if precision == "fp16":  # a loss scale that doubles every second update: replays must read and grow it
        for t in (eager, recorded):
            t.scaler = torch.amp.GradScaler(device.type, init_scale=2.0**10, growth_interval=2)
    prepare_step(eager, replace(tc, cuda_graphs=False), device, Dist(), shapes=2)
    if device.type == "cuda":
        prepare_step(recorded, tc, device, Dist(), shapes=2)
    else:
        prepare_step(recorded, replace(tc, cuda_graphs=False), device, Dist(), shapes=2)
        recorded.update_graphs = TracedUpdates(recorded, tc, device)
    _as_on_a_gpu(eager)  # as `TracedUpdates` runs the recorded one
    # a bug that a recording keeps (a rate, a token count) moves weights by about the rate (0.01) per update;
    # on a GPU, an RNN's cuDNN kernels may be other ones in a recording, and round otherwise
    tight = device.type == "cpu" or (precision == "fp32" and rnn is None)
    close = dict(rtol=1e-4, atol=1e-4) if tight else dict(rtol=1e-2, atol=1e-3)
    with _without_onednn():  # as `TracedUpdates` records and replays
        for group in groups:
            e, r = train_step(eager, group, tc, device), train_step(recorded, group, tc, device)
            assert torch.allclose(r.loss, e.loss, **close) and torch.allclose(r.grad_norm, e.grad_norm, **close)
            assert r.tokens == e.tokens == sum(b.ntokens for b in group) and not bool(r.skipped)
    # each shape recorded after its eager uses; with accumulate, the update's end too
    assert recorded.update_graphs.count == (2 if accumulate == 1 else 3)
    assert all(n == EAGER_USES + 1 for n in recorded.update_graphs.uses.values())
    if precision == "fp16":  # grown at every second update, the last ones replayed
        assert recorded.scaler.get_scale() == eager.scaler.get_scale() == 2.0 ** (10 + len(groups) // 2)
    return recorded, eager, groups, close


@pytest.mark.parametrize("device", [pytest.param(torch.device("cpu"), id="cpu"),
                                    pytest.param(CUDA, id="cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16-autocast", "fp16", "fp16-copy"])
@pytest.mark.parametrize("accumulate", [1, 2])
def test_recorded_updates_train_as_eager_ones_and_skip_a_non_finite_update_on_the_device(precision, device,
                                                                                        accumulate):
    recorded, eager, groups, close = _recorded_and_eager(precision, device, accumulate=accumulate)
    count = recorded.update_graphs.count
    # the key biases aside, whose gradients are rounding noise (on an fp16 copy, noise of fp16's size)
    a, b = (without_key_biases(t.model.state_dict()) for t in (eager, recorded))
    assert all(torch.allclose(b[k], a[k], **close) for k in a), max((float((a[k] - b[k]).abs().max()), k) for k in a)
    assert recorded.scheduler.lr == eager.scheduler.lr
    first, second = (g["lr"] for g in recorded.optimizer.param_groups)
    assert first is second and float(first) == pytest.approx(recorded.scheduler.lr)  # one rate, one tensor to fill

    # a NaN in the decoder's feed-forward block makes every loss non-finite: the replayed update is skipped on
    # the device, weights and moments left as they were
    before = [p.detach().clone() for p in recorded.model.parameters()]
    moments = [s["exp_avg"].clone() for s in recorded.optimizer.state.values()]
    with torch.no_grad():
        recorded.model.get_parameter("decoder.layers.0.feed_forward.down.bias")[0] = float("nan")
    poisoned = [p.detach().clone() for p in recorded.model.parameters()]
    if recorded.half is not None:
        recorded.half.refresh()
    r = train_step(recorded, groups[-1], replace(eager.scheduler.cfg, cuda_graphs=True), device)
    assert bool(r.skipped) and recorded.update_graphs.count == count  # replays, not eager updates
    assert all(torch.equal(p.nan_to_num(), q.nan_to_num())  # NaN is not equal to itself
               for p, q in zip(recorded.model.parameters(), poisoned, strict=True))
    assert all(torch.equal(s["exp_avg"], m) for s, m in zip(recorded.optimizer.state.values(), moments, strict=True))
    assert sum(not torch.equal(p, b) for p, b in zip(poisoned, before, strict=True)) == 1
    if precision.startswith("fp16"):  # the replay lowered the loss scale, as an eager fp16 update that overflows does
        assert recorded.scaler.get_scale() == eager.scaler.get_scale() * recorded.scaler.get_backoff_factor()


def test_weights_moved_since_the_recording_drop_the_graphs_which_are_recorded_again(caplog):
    """A graph reads and writes the addresses its recording saw. On a GPU, validation's `Translator` moved an
    `nn.LSTM`'s weights (`Module.to` flattens them into a new cuDNN buffer), and the replays went on updating
    freed memory: the loss rose from the first validation on, then went NaN. Weights that moved are now found
    after each validation, and the graphs recorded again, the updates going on as eager ones do."""
    cpu = torch.device("cpu")
    recorded, eager, groups, close = _recorded_and_eager("fp32", cpu)
    graphs = recorded.update_graphs
    assert graphs.weights_in_place(recorded) and graphs.count == 2  # nothing moved: the graphs stay
    weight = next(recorded.model.parameters())
    weight.data = weight.data.clone()  # the same values at another address, as a flatten leaves them
    with caplog.at_level(logging.WARNING, logger="nmt.train.graphs"):
        assert not graphs.weights_in_place(recorded)
    assert graphs.count == 0 and not graphs.uses
    assert [r.getMessage() for r in caplog.records] == [
        f"train.cuda_graphs: 1 of the {len(list(recorded.model.parameters()))} weights moved in memory since the "
        "updates were recorded; recording them again"]
    with _without_onednn():
        for group in groups:  # each shape's eager uses and recording again, then replays
            e, r = train_step(eager, group, recorded.update_graphs.tc, cpu), train_step(
                recorded, group, recorded.update_graphs.tc, cpu)
            assert torch.allclose(r.loss, e.loss, **close)
    assert graphs.count == 2 and graphs.weights_in_place(recorded)


@pytest.mark.parametrize("device", [pytest.param(torch.device("cpu"), id="cpu"),
                                    pytest.param(CUDA, id="cuda", marks=pytest.mark.gpu)])
def test_updates_of_a_model_with_sentences_side_by_side_are_recorded_and_train_as_eager_ones(device):
    """`attention_pack` 64: 4 sentences a row in the batches of 16 positions, 2 in those of 32, the block biases
    built inside each recorded update."""
    recorded, eager, _, close = _recorded_and_eager("fp32", device, transformer={"attention_pack": 64})
    assert recorded.model.encoder.pack == 64
    # the fused kernels' backward may add in another order each time: the key biases, whose true gradient is 0,
    # then move by Adam's steps of rounding noise
    a, b = (without_key_biases(t.model.state_dict()) for t in (eager, recorded))
    assert a.keys() == b.keys() and all(torch.allclose(b[k], a[k], **close) for k in a)


@pytest.mark.parametrize("device", [pytest.param(torch.device("cpu"), id="cpu"),
                                    pytest.param(CUDA, id="cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize(("precision", "rnn", "accumulate"), [
    ("fp32", dict(cell="lstm", decoder="luong", attention="general"), 1),
    pytest.param("fp32", dict(cell="gru", decoder="none", bidirectional=False), 1, marks=pytest.mark.slow),
    pytest.param("fp32", dict(cell="gru", decoder="bahdanau", attention="additive"), 1, marks=pytest.mark.slow),
    pytest.param("bf16", dict(cell="lstm", decoder="luong", attention="general"), 1, marks=pytest.mark.slow),
    pytest.param("fp32", dict(cell="lstm", decoder="luong", attention="general"), 2, marks=pytest.mark.slow),
], ids=["lstm-luong", "gru-none-unidirectional", "gru-bahdanau", "lstm-luong-bf16", "lstm-luong-accumulate2"])
def test_updates_of_a_recurrent_model_are_recorded_and_train_as_eager_ones(device, precision, rnn, accumulate):
    """Two encoder layers, sentences of 3 to 9 source tokens in batches of 10 and 20 positions: a recording
    that kept the lengths it was recorded with would give every later batch of its shape the wrong encoder
    states (`test_an_encoder_that_packs_cannot_be_recorded_and_one_that_does_not_replays_on_other_sentences`). With
    `accumulate` 2, each batch shape's part and the update's end are recorded apart."""
    recorded, eager, _, close = _recorded_and_eager(precision, device, accumulate=accumulate,
                                                    rnn=dict(encoder_layers=2, **rnn))
    for (name, p), q in zip(eager.model.named_parameters(), recorded.model.parameters(), strict=True):
        assert torch.allclose(q, p, **close), name


def test_recorded_updates_and_the_eager_uses_before_them_run_without_cudnn():
    """cuDNN's RNN kernels recorded in a graph replayed wrongly once an eager cuDNN call (validation's) had run
    between replays (`without_cudnn`): the updates that are recorded, and their eager uses before, which set
    up what the recording uses, run with cuDNN off and leave it as it was; an eager update keeps it."""
    cpu = torch.device("cpu")
    tc = TrainConfig(warmup_steps=3, lr=0.01, batch_shapes="static", max_tokens=12 * 16, cuda_graphs=True)
    t = _trainable(0, tc, cpu, rnn=dict(encoder_layers=2))
    prepare_step(t, replace(tc, cuda_graphs=False), cpu, Dist(), shapes=1)
    t.update_graphs = TracedUpdates(t, tc, cpu)
    seen = []
    t.model.register_forward_pre_hook(lambda *_: seen.append(torch.backends.cudnn.enabled))
    batch = _filled(0, 5, 10, cpu)
    assert torch.backends.cudnn.enabled
    with _without_onednn():
        for _ in range(EAGER_USES + 3):
            train_step(t, [batch], tc, cpu)
    assert t.update_graphs.count == 1
    assert seen == [False] * (EAGER_USES + 1)  # the eager uses, then the recording: replays run no Python
    assert torch.backends.cudnn.enabled
    update(t, [batch], tc, cpu)
    assert seen[-1] is True


@pytest.mark.gpu
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_recorded_rnn_updates_train_as_eager_ones_after_eager_cudnn_calls_between_replays(cell):
    """What validation did on an H200: eager cuDNN RNN calls in inference, over batches of other sizes than the
    recorded ones, between two runs of replays. Recorded updates with cuDNN's kernels then went wrong; without
    them (`without_cudnn`) the updates after stay the eager ones'."""
    recorded, eager, groups, close = _recorded_and_eager("fp32", CUDA, rnn=dict(encoder_layers=2, cell=cell))
    with torch.no_grad():
        for seed, n in ((20, 3), (21, 7), (22, 9)):  # as a validation's batches
            b = _filled(seed, n, 14, CUDA)
            for t in (eager, recorded):
                t.model.eval()
                t.model(b.src, b.src_pad_mask, b.tgt_in)
                t.model.train()
    tc = replace(eager.scheduler.cfg, cuda_graphs=True)
    for group in groups:
        e, r = train_step(eager, group, tc, CUDA), train_step(recorded, group, tc, CUDA)
        assert torch.allclose(r.loss, e.loss, **close) and torch.allclose(r.grad_norm, e.grad_norm, **close)
    assert recorded.update_graphs.count == 2  # replays only
    for (name, p), q in zip(eager.model.named_parameters(), recorded.model.parameters(), strict=True):
        assert torch.allclose(q, p, **close), name


@pytest.mark.gpu
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_recorded_rnn_updates_after_module_to_record_again_where_the_weights_moved_and_train_as_eager_ones(cell):
    """`Module.to` on a model already in place, as validation's translator called it: an `nn.GRU` or `nn.LSTM`
    with cuDNN flattens its weights into a new buffer (by torch's code), which the recorded updates must not go
    on reading. Where they moved, the graphs are recorded again; the updates after are the eager ones'."""
    recorded, eager, groups, close = _recorded_and_eager("fp32", CUDA, rnn=dict(encoder_layers=2, cell=cell))
    before = [p.data_ptr() for p in recorded.model.parameters()]
    recorded.model.to(CUDA)
    moved = sum(a != p.data_ptr() for a, p in zip(before, recorded.model.parameters(), strict=True))
    assert recorded.update_graphs.weights_in_place(recorded) == (moved == 0)
    tc = replace(eager.scheduler.cfg, cuda_graphs=True)
    for group in groups:
        e, r = train_step(eager, group, tc, CUDA), train_step(recorded, group, tc, CUDA)
        assert torch.allclose(r.loss, e.loss, **close) and torch.allclose(r.grad_norm, e.grad_norm, **close)
    assert recorded.update_graphs.count == 2
    for (name, p), q in zip(eager.model.named_parameters(), recorded.model.parameters(), strict=True):
        assert torch.allclose(q, p, **close), name


@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_an_encoder_that_packs_cannot_be_recorded_and_one_that_does_not_replays_on_other_sentences(cell):
    """Why the RNN encoder does not pack its source on a GPU: packing reads the source lengths on the host,
    which a recording cannot hold (on a GPU that read waits for the device; `make_fx` refuses it, as it does
    here, on a CPU, where the encoder packs). Unpacked, the encoder records, and a replay on other sentences
    of the shape gives their own loss."""
    cpu = torch.device("cpu")
    first, second = _filled(0, 5, 16, cpu), _filled(2, 5, 16, cpu)
    assert first.src.shape == second.src.shape and not torch.equal(first.src_pad_mask, second.src_pad_mask)
    model = tiny_model("rnn", vocab=23, rnn=dict(cell=cell, encoder_layers=2)).train()
    objective = Objective(model, pad_id=PAD_ID, smoothing=0.1)
    inputs = first.clone()

    def loss(b):
        return objective(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)[0]

    with torch.no_grad(), _without_onednn():
        with pytest.raises(RuntimeError, match="get value out of a tracing tensor"):
            make_fx(lambda: loss(inputs))()
        model.encoder.pack_off_cuda = False
        traced = make_fx(lambda: loss(inputs))()
        inputs.copy_(second)
        assert float(traced()) == pytest.approx(float(loss(second)), rel=1e-6)
        assert float(traced()) != pytest.approx(float(loss(first)), rel=1e-3)


def _replayed_grad_norm(recorded_with, replayed_on, *, tokens_on_device: bool) -> float:
    """The gradient norm of an update recorded on one batch (`TracedUpdates`), replayed on another."""
    tc, cpu = TrainConfig(warmup_steps=3, lr=0.01), torch.device("cpu")
    t = _trainable(0, tc, cpu)
    inputs = recorded_with.clone()
    replay, results = TracedUpdates(t, tc, cpu).record(
        t, lambda: _results(update(t, [inputs], tc, cpu, tokens_on_device=tokens_on_device)))
    inputs.copy_(replayed_on)
    replay()
    return float(results[2])


@pytest.mark.gpu
def test_updates_of_a_compiled_model_are_recorded_and_train_as_its_eager_updates():
    torch._dynamo.reset()  # each shape compiled here, in the eager uses, before its recording
    recorded, eager, _, close = _recorded_and_eager("bf16", CUDA, compile=True)
    assert recorded.objective is not recorded.model  # compiled (default mode: kernels, no graphs of its own)
    for p, q in zip(eager.model.parameters(), recorded.model.parameters(), strict=True):
        assert torch.allclose(q, p, **close)


def test_a_recording_keeps_what_the_host_passed_it_so_the_token_count_must_come_from_the_device():
    """Why `update(tokens_on_device=True)`: recorded with the host's count, every replay would divide the
    loss by the token count of the batch it was recorded with."""
    cpu = torch.device("cpu")
    first, second = _filled(0, 5, 16, cpu), _filled(2, 8, 16, cpu)
    assert first.ntokens != second.ntokens
    eager = float(update(_trainable(0, TrainConfig(warmup_steps=3, lr=0.01), cpu), [second],
                         TrainConfig(warmup_steps=3, lr=0.01), cpu).grad_norm)
    assert _replayed_grad_norm(first, second, tokens_on_device=True) == pytest.approx(eager, rel=1e-6)
    assert _replayed_grad_norm(first, second, tokens_on_device=False) == pytest.approx(
        eager * second.ntokens / first.ntokens, rel=1e-5)


@pytest.mark.parametrize("device", [pytest.param(torch.device("cpu"), id="cpu"),
                                    pytest.param(CUDA, id="cuda", marks=pytest.mark.gpu)])
def test_a_recording_that_would_set_up_optimizer_state_is_refused(device):
    """A parameter without a gradient in a shape's eager uses has no Adam state yet; a recording that gave it one
    would zero its moments again at every replay. Here the parameter is frozen for the eager uses."""
    tc = TrainConfig(cuda_graphs=True, warmup_steps=1, lr=0.01, batch_shapes="static", max_tokens=12 * 16)
    t = _trainable(0, tc, device)
    if device.type == "cuda":
        prepare_step(t, tc, device, Dist(), shapes=1)
    else:
        prepare_step(t, replace(tc, cuda_graphs=False), device, Dist(), shapes=1)
        t.update_graphs = TracedUpdates(t, tc, device)
    late = t.model.get_parameter("decoder.layers.0.feed_forward.down.bias")
    late.requires_grad_(False)
    b = _filled(0, 6, 16, device)
    with _without_onednn():
        for _ in range(EAGER_USES):
            train_step(t, [b], tc, device)
        assert late not in t.optimizer.state and len(t.optimizer.state) > 0
        late.requires_grad_(True)
        with pytest.raises(UserError, match=re.escape(f"recording the update of batch shape {b.shape} set up optimizer "
                                                      "state for 1 parameter(s)") +
                           r".*\(decoder.layers.0.feed_forward.down.bias\).*cuda_graphs: false"):
            train_step(t, [b], tc, device)


@pytest.mark.gpu
def test_a_recorded_update_draws_new_dropout_masks_at_every_replay():
    tc = TrainConfig(cuda_graphs=True, warmup_steps=1, lr=1e-12, batch_shapes="static", max_tokens=12 * 16)
    t = _trainable(0, tc, CUDA, dropout=0.3)
    prepare_step(t, tc, CUDA, Dist(), shapes=1)
    b = _filled(0, 6, 16, CUDA)
    losses = [float(train_step(t, [b], tc, CUDA).loss) for _ in range(EAGER_USES + 3)]
    assert t.update_graphs.count == 1
    replays = losses[EAGER_USES:]
    assert len(set(replays)) == len(replays)  # a frozen random state would give one loss, again and again


def _train(corpus, run_dir, *, recorded: bool, max_steps: int, accumulate: int = 1,
           model_type: str = "transformer", precision: str = "fp32") -> int:
    """`nmt.train.loop.train` of the tiny config (a Transformer, or an RNN) with static batch shapes (two),
    eager or with recorded updates: on a GPU CUDA graphs (`train.cuda_graphs`), on a CPU `TracedUpdates`; the
    number of updates recorded."""
    on_gpu = torch.cuda.is_available()
    raw = tiny_raw(corpus, run_dir, max_steps=max_steps, valid_every=10, log_every=5, pad_to_multiple=32,
                   length_buckets="multiple", batch_shapes="static", eps=1e-6, accumulate=accumulate,
                   precision=precision, cuda_graphs=recorded and on_gpu)
    raw["model"]["type"] = model_type
    raw["model"][model_type]["dropout"] = 0.0
    cfg = config_from_dict(raw)
    run = build_run(cfg)
    if recorded and not on_gpu:  # what prepare_step does on CUDA, with the CPU's stand-in for the graphs
        run.trainable.update_graphs = TracedUpdates(run.trainable, replace(cfg.train, cuda_graphs=True), run.device)
    try:
        train_run(run)
        return run.trainable.update_graphs.count if recorded else 0
    finally:
        run.close()


@pytest.mark.slow
@pytest.mark.parametrize(("accumulate", "precision"), [(1, "fp32"), (2, "fp32"), (1, "fp16")])
def test_a_run_of_recorded_updates_logs_validates_saves_and_resumes_as_an_eager_run(small_corpus, tmp_path,
                                                                                   accumulate, precision):
    """With fp16, the gradient scaler's state (scale, growth tracker) that replays changed on the device is what
    the checkpoints hold, and what the resumed run records its updates with. Its weights are compared at fp16's
    closeness: the eager run weights its loss by 1 / the target tokens counted on the host, a recorded one by
    the device's count, which differ in the last bit of fp32; in fp16 gradients that grows, by Adam's steps on
    gradients near zero, to 1.7e-3 at update 40 (where fp32 runs differ by under 1e-5), while the logged losses
    stay equal to 4 decimals. `test_recorded_updates_train_as_eager_ones_and_skip_a_non_finite_update_on_the_device`
    compares fp16 updates one by one."""
    def train(name: str, recorded: bool, max_steps: int) -> int:
        return _train(small_corpus, tmp_path / name, recorded=recorded, max_steps=max_steps, accumulate=accumulate,
                      precision=precision)

    assert train("False", False, 30) == 0
    # both shapes recorded and replayed (with accumulate, the update's end too)
    assert train("True", True, 30) == (2 if accumulate == 1 else 3)
    eager, recorded = (tmp_path / name for name in ("False", "True"))
    saved = load_checkpoint(recorded / "ckpt_30.pt")
    assert all(type(g["lr"]) is float and not g["capturable"]  # as without graphs, not the live tensors
               for g in saved["optimizer"]["param_groups"])
    assert saved["scaler"] == load_checkpoint(eager / "ckpt_30.pt")["scaler"]
    if precision == "fp16":
        assert saved["scaler"]["_growth_tracker"] == 30  # no update skipped, each counted on the device
    logged = [json.loads(line) for line in (recorded / "metrics.jsonl").read_text().splitlines()]
    assert [r["lr"] for r in logged if r["event"] == "train"] == [
        r["lr"] for r in map(json.loads, (eager / "metrics.jsonl").read_text().splitlines()) if r["event"] == "train"]
    train("False", False, 40)
    assert train("True", True, 40) >= 1  # resumed: records
    a, b = (without_key_biases(weights(run / "ckpt_40.pt")) for run in (eager, recorded))
    close = dict(rtol=1e-4, atol=1e-5) if precision == "fp32" else dict(rtol=1e-2, atol=5e-3)
    assert all(torch.allclose(a[k], b[k], **close) for k in a), max((float((a[k] - b[k]).abs().max()), k) for k in a)
    losses = [[r["loss"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
               if r["event"] == "train"] for run in (eager, recorded)]
    assert len(losses[0]) == 9 and losses[1] == pytest.approx(losses[0], rel=1e-4)  # updates 1, 5, 10 .. 40
    scalers = [load_checkpoint(run / "ckpt_40.pt")["scaler"] for run in (eager, recorded)]
    assert scalers[0] == scalers[1] and (precision != "fp16" or scalers[1]["_growth_tracker"] == 40)


@pytest.mark.slow
def test_a_run_of_recorded_rnn_updates_validates_saves_and_resumes_as_an_eager_run(small_corpus, tmp_path):
    """The RNN's recorded updates, its validation (the fp32 model's) too: the run's checkpoints hold the eager
    run's weights, before and after resuming (on a GPU up to the rounding of cuDNN's kernels, which may use
    TF32)."""
    close = dict(rtol=1e-3, atol=1e-3) if torch.cuda.is_available() else dict(rtol=1e-4, atol=1e-5)
    def train(name: str, recorded: bool, max_steps: int) -> int:
        return _train(small_corpus, tmp_path / name, recorded=recorded, max_steps=max_steps, model_type="rnn")

    assert train("eager", False, 20) == 0
    assert train("recorded", True, 20) == 2
    train("eager", False, 26)
    assert train("recorded", True, 26) >= 1
    for step in (20, 26):
        a, b = (weights(tmp_path / name / f"ckpt_{step}.pt") for name in ("eager", "recorded"))
        assert a.keys() == b.keys()
        assert all(torch.allclose(a[k], b[k], **close) for k in a), max((float((a[k] - b[k]).abs().max()), k) for k in a)
    logged = [json.loads(line) for line in (tmp_path / "recorded" / "metrics.jsonl").read_text().splitlines()]
    assert any(r["event"] == "valid" for r in logged)
