"""One training update: the same loss eager and compiled, padded or filled to a static shape, non-finite
updates skipped on the device."""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import replace

import pytest
import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode

from nmt.config import DataConfig, ExperimentConfig, ModelConfig, TrainConfig, TransformerConfig
from nmt.data.collate import Padding, collate
from nmt.data.tokenizer import PAD_ID
from nmt.decode import greedy_search
from nmt.distributed import Dist
from nmt.errors import UserError
from nmt.kernels import compile_model
from nmt.train.data import batch_padding, padding_problem
from nmt.train.loop import skipped_update_message
from nmt.train.loss import Objective
from nmt.train.optim import build_optimizer, build_scheduler
from nmt.train.setup import prepare_step
from nmt.train.step import Trainable, step_unless, train_step
from tests.models.tiny import tiny_model
from tests.train.helpers import random_rows


def _model(seed: int = 0) -> torch.nn.Module:
    # in training mode, as `train_step` sees it
    return tiny_model(seed=seed, vocab=23, transformer=dict(max_positions=64), tie_embeddings="none").train()


def _batch(seed: int = 0, n: int = 5):
    return collate(random_rows(seed, n), padding=Padding(multiple=8))


def _trainable(model: torch.nn.Module, tc: TrainConfig, optimizer: torch.optim.Optimizer | None = None) -> Trainable:
    """`model` with what a CPU step updates it with (`build_optimizer`'s optimizer unless one is given)."""
    optimizer = optimizer or build_optimizer(model, tc, torch.device("cpu"))
    return Trainable(model=model, objective=Objective(model, pad_id=PAD_ID, smoothing=0.1), optimizer=optimizer,
                     scheduler=build_scheduler(optimizer, tc), scaler=torch.amp.GradScaler("cpu", enabled=False))


def _same_loss_and_gradients(eager: Objective, compiled: torch.nn.Module, batches: list) -> None:
    """Both objectives give the same loss on each batch, and the same gradients summed over them."""
    for b in batches:
        args = (b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
        loss, nll = eager(*args)
        c_loss, c_nll = compiled(*args)
        loss.backward()
        c_loss.backward()
        assert torch.allclose(c_loss, loss, rtol=1e-5) and torch.allclose(c_nll, nll, rtol=1e-5)
    for (name, p), c in zip(eager.named_parameters(), compiled.parameters(), strict=True):
        # an element summed from terms of the tensor's largest size that cancel keeps their rounding, which
        # another order of summation (the compiled backward's) changes: 1.9e-6 in an embedding row's
        # gradient of -0.006 beside elements of 4, on one CPU
        assert torch.allclose(c.grad, p.grad, rtol=1e-4, atol=1e-6 * (1 + float(p.grad.abs().max()))), name


@pytest.mark.slow
def test_compiled_objective_gives_the_eager_loss_and_gradients_and_takes_new_shapes_without_recompiling():
    batch = _batch()
    eager = Objective(_model(), pad_id=PAD_ID, smoothing=0.1)
    compiled = compile_model(Objective(copy.deepcopy(eager.model), pad_id=PAD_ID, smoothing=0.1))
    assert compiled is not eager  # compiling is available here; otherwise the fallback would hide the test
    _same_loss_and_gradients(eager, compiled, [batch])
    # Batches of other sizes and lengths (static shapes, as CUDA graphs get them) reuse the one dynamic graph.
    frames = counters["frames"]["total"]
    for seed, (n, tokens) in enumerate([(9, 16 * 8), (3, 24 * 4), (12, 32 * 8)], start=1):
        b = collate(random_rows(seed, n, vocab=23), padding=Padding(multiple=8, fill_tokens=tokens))
        c_loss, _ = compiled(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
        c_loss.backward()
        assert torch.isfinite(c_loss)
    assert counters["frames"]["total"] == frames, "a new batch shape compiled the objective again"


@pytest.mark.slow
def test_a_static_compile_gives_each_batch_shape_its_graph_and_the_eager_loss():
    """`train.compile_dynamic: false`: a graph per static batch shape, never more than the shapes there are."""
    eager = Objective(_model(), pad_id=PAD_ID, smoothing=0.1)
    compiled = compile_model(Objective(copy.deepcopy(eager.model), pad_id=PAD_ID, smoothing=0.1),
                             backend="aot_eager", dynamic=False, shapes=12)
    assert compiled is not eager
    assert torch._dynamo.config.recompile_limit >= 12  # 12 shapes may each keep a graph
    frames = counters["frames"]["ok"]
    batches = [collate(random_rows(seed, n, vocab=23), padding=Padding(multiple=8, fill_tokens=tokens))
               for seed, (n, tokens) in enumerate([(9, 128), (3, 96), (9, 128), (12, 256), (3, 96)], start=1)]
    shapes = {(*b.src.shape, b.tgt_in.shape[1]) for b in batches}
    assert 2 <= len(shapes) < len(batches)  # some shapes come back
    _same_loss_and_gradients(eager, compiled, batches)
    assert counters["frames"]["ok"] - frames == len(shapes), "one graph per distinct shape, none for one seen before"


@pytest.mark.slow
@pytest.mark.parametrize("dynamic", [False, pytest.param(True, marks=pytest.mark.slow)])  # symbolic sizes: 20 s
def test_a_compiled_model_with_sentences_side_by_side_gives_the_eager_loss(dynamic):
    """`model.transformer.attention_pack`: how many sentences share a row follows each batch's size and lengths
    (here 3, 3 and 2 of 16 positions), in a graph per shape, or with symbolic sizes in a graph per number of
    sentences a row, which the graph's guards fix."""
    torch._dynamo.reset()
    model = tiny_model(seed=0, vocab=23, transformer=dict(max_positions=64, attention_pack=48),
                       tie_embeddings="none").train()
    eager = Objective(model, pad_id=PAD_ID, smoothing=0.1)
    compiled = compile_model(Objective(copy.deepcopy(model), pad_id=PAD_ID, smoothing=0.1), backend="aot_eager",
                             dynamic=dynamic, shapes=4)
    assert compiled is not eager
    batches = [collate(random_rows(seed, n, vocab=23), padding=Padding(multiple=8, fill_tokens=tokens))
               for seed, (n, tokens) in enumerate([(9, 128), (3, 96), (12, 256)], start=1)]
    assert [tuple(b.src.shape) for b in batches] == [(9, 16), (6, 16), (16, 16)]
    frames = counters["frames"]["ok"]
    _same_loss_and_gradients(eager, compiled, batches)
    assert counters["frames"]["ok"] - frames == (2 if dynamic else 3)


@pytest.fixture
def fresh_compiler():
    """An empty dynamo cache: every compiled RNN step shares one function, whose cache entries (one or two per
    decoder structure and backend) would otherwise pile up across tests towards dynamo's recompile limit."""
    torch._dynamo.reset()


def _rnn(seed: int = 0, **rnn) -> torch.nn.Module:
    # widths unlike any batch size or source length below: dynamo gives equal sizes one symbol ("duck
    # sizing"), so a source length equal to the (static) embedding width would be compiled as static
    return tiny_model("rnn", seed=seed, vocab=23, rnn=dict(embed_dim=12, hidden_size=20) | rnn,
                      tie_embeddings="none").train()


def _batches_of_new_target_lengths() -> list:
    """Batches whose target lengths (9, then 3, then 17 positions) and sizes all differ."""
    rows = [random_rows(1, 6), random_rows(2, 4), random_rows(3, 7)]
    for row in rows[1]:
        row["tgt_ids"] = row["tgt_ids"][:2]
    for row in rows[2]:
        row["tgt_ids"] = row["tgt_ids"] * 2
    return [collate(r) for r in rows]


def test_training_compiles_a_recurrent_model_one_step_at_a_time_for_every_target_length(fresh_compiler):
    """`train.compile` on an RNN compiles its decoder step in place, not the loop over target positions.

    Compiled whole, the loop was unrolled into a graph per target length: 483 s of compiling on the toy
    Bahdanau config before dynamo's recompile limit left the remaining lengths eager.
    """
    eager = Objective(_rnn(), pad_id=PAD_ID, smoothing=0.1)
    tc = TrainConfig(compile=True)
    t = _trainable(copy.deepcopy(eager.model), tc)
    names = list(t.model.state_dict())
    prepare_step(t, tc, torch.device("cpu"), Dist())
    assert t.objective.model is t.model and not hasattr(t.objective, "_orig_mod")  # the objective is not wrapped
    assert list(t.model.state_dict()) == names  # checkpoints keep their parameter names
    batches = _batches_of_new_target_lengths()
    assert len({b.tgt_in.size(1) for b in batches}) == 3
    frames = counters["frames"]["ok"]
    _same_loss_and_gradients(eager, t.objective, batches[:1])
    # two graphs: the first step, whose state (Luong's zero input feed) needs no gradient, and every later one
    assert counters["frames"]["ok"] - frames == 2, "the first batch compiles the decoder step"
    _same_loss_and_gradients(eager, t.objective, batches[1:])
    assert counters["frames"]["ok"] - frames == 2, "a new target length or batch size compiled the step again"


@pytest.mark.slow
def test_a_copy_of_a_compiled_recurrent_model_steps_its_own_decoder(fresh_compiler):
    model = compile_model(_rnn(), backend="aot_eager", in_place=True)
    twin = copy.deepcopy(model)  # shares the compiled function, as deepcopy does
    with torch.no_grad():
        for p in twin.decoder.parameters():
            p.mul_(0.5)
    b = _batches_of_new_target_lengths()[0]
    args = (b.src, b.src_pad_mask, b.tgt_in)
    eager_twin = copy.deepcopy(twin)
    eager_twin._teacher_step = None
    torch.testing.assert_close(twin(*args), eager_twin(*args))
    assert not torch.allclose(twin(*args), model(*args))


def test_a_recurrent_model_compiled_per_batch_shape_may_keep_two_step_graphs_per_shape():
    """With `train.compile_dynamic: false` each static shape compiles the step twice (the first step apart)."""
    tc = TrainConfig(compile=True, compile_dynamic=False, batch_shapes="static")
    t = _trainable(_rnn(), tc)
    prepare_step(t, tc, torch.device("cpu"), Dist(), shapes=15)
    assert t.model._teacher_step is not None and torch._dynamo.config.recompile_limit >= 30


@pytest.mark.parametrize("rnn", [dict(decoder="bahdanau", attention="additive"),
                                 dict(decoder="luong", cell="lstm", decoder_layers=2, input_feeding=True,
                                      attention="general"),
                                 dict(decoder="luong", attention="dot", local_window=2)],
                         ids=["bahdanau", "luong-lstm-input-feeding", "luong-local"])
@pytest.mark.slow
def test_a_compiled_decoder_step_gives_the_eager_losses_and_gradients_and_leaves_search_eager(rnn, fresh_compiler):
    eager = Objective(_rnn(**rnn), pad_id=PAD_ID, smoothing=0.1)
    compiled = Objective(compile_model(copy.deepcopy(eager.model), backend="aot_eager", in_place=True),
                         pad_id=PAD_ID, smoothing=0.1)
    frames = counters["frames"]["ok"]
    _same_loss_and_gradients(eager, compiled, _batches_of_new_target_lengths()[:1])
    first = counters["frames"]["ok"] - frames
    assert first in (1, 2)  # 2 where the first step's state needs no gradient and the later ones' do
    _same_loss_and_gradients(eager, compiled, _batches_of_new_target_lengths()[1:])
    assert counters["frames"]["ok"] - frames == first, "a new target length or batch size compiled the step again"
    # search (validation, translation) keeps the eager step, as it runs every model uncompiled
    b = _batches_of_new_target_lengths()[2]
    eager.model.eval(), compiled.model.eval()
    found = [h.tokens for h in greedy_search(compiled.model, b.src, b.src_pad_mask, max_len_a=1.0, max_len_b=12)]
    assert counters["frames"]["ok"] - frames == first
    assert found == [h.tokens for h in greedy_search(eager.model, b.src, b.src_pad_mask, max_len_a=1.0, max_len_b=12)]


def test_a_static_compile_needs_static_batch_shapes():
    model = _model()
    tc = TrainConfig(compile=True, compile_dynamic=False)  # batch_shapes auto: free on a CPU
    t = _trainable(model, tc)
    with pytest.raises(UserError, match=r"train.compile_dynamic: false .* set train.batch_shapes: static"):
        prepare_step(t, tc, torch.device("cpu"), Dist())
    prepare_step(t, replace(tc, batch_shapes="static"), torch.device("cpu"), Dist(), shapes=4)
    assert t.objective is not t.model and hasattr(t.objective, "_orig_mod")


@pytest.mark.parametrize("batch_shapes, per_shape", [("static", True), ("free", False)])
def test_compile_dynamic_auto_compiles_a_graph_per_shape_exactly_where_batch_shapes_are_static(batch_shapes,
                                                                                              per_shape):
    """`train.compile_dynamic: auto`: static batch shapes get a graph each (dynamo may keep `shapes` of them), free
    ones a graph with symbolic sizes. CUDA graphs over the symbolic one died of a segmentation fault on an H200."""
    tc = TrainConfig(compile=True, batch_shapes=batch_shapes)
    assert tc.compile_dynamic == "auto"
    with torch._dynamo.config.patch(recompile_limit=8):
        prepare_step(_trainable(_model(), tc), tc, torch.device("cpu"), Dist(), shapes=64)
        assert torch._dynamo.config.recompile_limit == (64 if per_shape else 8)


def test_free_batch_shapes_under_cuda_graphs_are_warned_of(caplog):
    tc = TrainConfig(compile=True, compile_mode="reduce-overhead", batch_shapes="free")
    with caplog.at_level(logging.WARNING, logger="nmt"):  # nothing runs on the device: compiling is lazy
        prepare_step(_trainable(_model(), tc), tc, torch.device("cuda"), Dist())
    assert "train.batch_shapes: free under CUDA graphs" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nmt"):  # auto: static shapes there
        auto = replace(tc, batch_shapes="auto")
        prepare_step(_trainable(_model(), auto), auto, torch.device("cuda"), Dist())
    assert "batch_shapes" not in caplog.text


def test_padding_to_a_multiple_changes_shapes_not_the_loss():
    model = Objective(_model(), pad_id=PAD_ID, smoothing=0.1).eval()
    rows = [{"src_ids": [5, 6, 2], "tgt_ids": [7, 8, 9], "index": 0}, {"src_ids": [9, 2], "tgt_ids": [4], "index": 1}]
    tight, padded = collate(rows), collate(rows, padding=Padding(multiple=8))
    assert tight.src.shape == (2, 3) and padded.src.shape == (2, 8) and padded.tgt_in.shape == (2, 8)
    assert padded.ntokens == tight.ntokens == 6
    with torch.no_grad():
        a = model(tight.src, tight.src_pad_mask, tight.tgt_in, tight.tgt_out)
        b = model(padded.src, padded.src_pad_mask, padded.tgt_in, padded.tgt_out)
    assert torch.allclose(a[0], b[0], rtol=1e-5) and torch.allclose(a[1], b[1], rtol=1e-5)


@pytest.mark.parametrize("kind", ["transformer", "rnn"])
def test_a_batch_filled_to_a_static_shape_gives_the_same_loss_and_gradients(kind):
    rows = random_rows(3, 6)
    loose = collate(rows)
    filled = collate(rows, padding=Padding(multiple=8, fill_tokens=8 * 16))
    longest = max(loose.src.shape[1], loose.tgt_in.shape[1])
    assert longest <= 16 and filled.src.shape == (8 * 16 // 16, 16) == filled.tgt_in.shape
    assert filled.ntokens == loose.ntokens and filled.indices.tolist()[6:] == [-1, -1]
    grads = []
    for b in (loose, filled):
        model = Objective(tiny_model(kind, vocab=23, transformer=dict(max_positions=64)).train(),
                          pad_id=PAD_ID, smoothing=0.1)
        loss, nll = model(b.src, b.src_pad_mask, b.tgt_in, b.tgt_out)
        loss.backward()
        grads.append((loss.detach(), nll.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (loss_a, nll_a, grad_a), (loss_b, nll_b, grad_b) = grads
    assert torch.allclose(loss_a, loss_b, rtol=1e-5) and torch.allclose(nll_a, nll_b, rtol=1e-5)
    for name, g in grad_a.items():
        assert g is not None and torch.isfinite(grad_b[name]).all(), name
        assert torch.allclose(g, grad_b[name], rtol=1e-4, atol=1e-6), (name, (g - grad_b[name]).abs().max())


def test_batch_padding_resolves_auto_by_device_compile_mode_and_update_graphs():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    assert batch_padding(TrainConfig(), cpu) == Padding(multiple=1)
    assert batch_padding(TrainConfig(), cuda) == Padding(multiple=8)
    assert batch_padding(TrainConfig(pad_to_multiple=16), cpu) == Padding(multiple=16)
    graphs = TrainConfig(compile=True, compile_mode="reduce-overhead", max_tokens=2048)
    assert batch_padding(graphs, cuda) == Padding(multiple=8, fill_tokens=2048)
    assert batch_padding(graphs, cpu).fill_tokens == 0  # no CUDA graphs on a CPU
    assert batch_padding(TrainConfig(batch_shapes="static", max_tokens=999), cpu) == Padding(fill_tokens=999)
    assert batch_padding(replace(graphs, batch_shapes="free"), cuda).fill_tokens == 0
    # static shapes of an uncompiled model: relative steps (finer buckets), unless compiling or told otherwise
    updates = TrainConfig(cuda_graphs=True, max_tokens=2048)
    assert batch_padding(updates, cuda) == Padding(multiple=8, fill_tokens=2048, relative=True)
    assert batch_padding(TrainConfig(batch_shapes="static", max_tokens=2048), cuda).relative
    assert batch_padding(replace(updates, pad_to_multiple=16), cuda) == Padding(16, fill_tokens=2048, relative=True)
    assert batch_padding(replace(updates, compile=True), cuda) == Padding(multiple=8, fill_tokens=2048)
    assert batch_padding(replace(updates, length_buckets="multiple"), cuda) == Padding(multiple=8, fill_tokens=2048)
    assert batch_padding(TrainConfig(length_buckets="relative", pad_to_multiple=4), cpu) == Padding(4, relative=True)
    assert batch_padding(TrainConfig(length_buckets="relative"), cpu) == Padding(multiple=1)  # nothing to round
    # static shapes fill whole attention rows of a Transformer with attention_pack; free ones need not
    packed = ModelConfig(transformer=TransformerConfig(attention_pack=128))
    assert batch_padding(updates, cuda, packed) == Padding(multiple=8, fill_tokens=2048, relative=True, pack=128)
    assert batch_padding(TrainConfig(), cuda, packed) == Padding(multiple=8)
    assert batch_padding(updates, cuda, replace(packed, type="rnn")).pack == 0
    assert batch_padding(updates, cuda, ModelConfig()).pack == 0


def test_padding_past_a_transformers_positions_is_a_problem_named_before_training():
    # A pair of max_len tokens padded past max_positions stopped training at its first such batch with
    # "ValueError: positions 0..2047 are outside [0, max_positions (1024))" and exit 1.
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    fits = ExperimentConfig(data=DataConfig(max_len=100), model=ModelConfig(transformer=TransformerConfig(max_positions=100)))
    assert padding_problem(fits, cpu) is None
    assert padding_problem(fits, cuda) == (
        "train.pad_to_multiple (0: 8 on cuda) pads a batch of data.max_len (100) tokens to 104 positions, more than "
        "model.transformer.max_positions (100) holds; lower pad_to_multiple, or raise max_positions to 104")
    assert padding_problem(replace(fits, train=TrainConfig(pad_to_multiple=4)), cuda) is None
    wide = replace(fits, train=TrainConfig(pad_to_multiple=2048))
    assert padding_problem(wide, cpu).startswith("train.pad_to_multiple (2048) pads a batch of data.max_len (100) "
                                                 "tokens to 2048 positions")
    assert padding_problem(replace(wide, model=replace(wide.model, type="rnn")), cpu) is None  # no position table


def test_a_model_too_large_for_memory_is_one_line_naming_its_section():
    # Its weights failed to allocate with "RuntimeError: [enforce fail at alloc_cpu.cpp:127] ..." and exit 1.
    from types import SimpleNamespace

    from nmt.errors import NodeError
    from nmt.train.setup import build_trainable

    huge = ExperimentConfig(model=ModelConfig(transformer=TransformerConfig(d_model=32, heads=2, ff_dim=10**11)))
    with pytest.raises(NodeError, match=r"^model.transformer: its sizes make a model too large for this machine's "
                                        r"memory \(one weight alone would take \d+\.\d GiB\); make it smaller$"):
        build_trainable(huge, SimpleNamespace(src_vocab_size=50, tgt_vocab_size=50), torch.device("cpu"))


@pytest.mark.parametrize("fused", [True, False])
def test_a_non_finite_update_leaves_weights_and_adam_state_alone(fused):
    model = _model()
    tc = TrainConfig(lr=1e-3, warmup_steps=0, clip_norm=1.0)
    t = _trainable(model, tc, None if fused else torch.optim.Adam(model.parameters(), lr=1e-3))
    optimizer = t.optimizer
    good = train_step(t, [_batch(1)], tc, torch.device("cpu"))
    assert not bool(good.skipped) and good.updated and math.isfinite(float(good.grad_norm))
    before = copy.deepcopy(model.state_dict())
    state_before = copy.deepcopy(optimizer.state_dict()["state"])
    model.output.weight.register_hook(lambda g: torch.full_like(g, math.nan))  # a poisoned gradient
    bad = train_step(t, [_batch(2)], tc, torch.device("cpu"))
    assert bool(bad.skipped) and not bad.updated
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    state_after = optimizer.state_dict()["state"]
    for k, s in state_before.items():
        for name, v in s.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(state_after[k][name])), (k, name)


def test_a_skipped_update_is_logged_with_its_loss_a_target_token():
    """The loss of a skipped update reads as the log lines' loss, not as the sum over its tokens (4186 for a
    loss of 3.2 a token), which looked like a divergence where only the gradient was not finite."""
    model = _model()
    tc = TrainConfig(lr=1e-3, warmup_steps=0, clip_norm=1.0)
    t = _trainable(model, tc)
    model.output.weight.register_hook(lambda g: torch.full_like(g, math.inf))  # the loss stays finite
    bad = train_step(t, [_batch(3, n=40)], tc, torch.device("cpu"))
    assert bool(bad.skipped) and bad.tokens > 100
    per_token = float(bad.loss) / bad.tokens
    assert 1 < per_token < 2 * math.log(23)  # an untrained model: about ln(vocabulary)
    message = skipped_update_message(7, bad)
    assert f"step 7: non-finite loss or gradient (loss {per_token:.4g} a target token" in message
    assert message.endswith("update skipped")
    assert skipped_update_message(7, bad, fp16_scale=32768.0).endswith("fp16 loss scale lowered to 32768")


class _HostReads(TorchDispatchMode):
    """Counts the operations that copy a tensor's value to the host: on a GPU each waits for the device."""

    READS = frozenset({"_local_scalar_dense", "is_nonzero", "nonzero", "masked_select", "_to_copy_to_cpu"})

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ in self.READS:
            self.reads.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_a_training_update_never_reads_a_tensor_on_the_host(precision):
    """Loss, gradient norm and the skip decision stay on the device (the loop reads them an update later)."""
    model = _model()
    tc = TrainConfig(lr=1e-3, warmup_steps=4, clip_norm=1.0, precision=precision, accumulate=2)
    t = _trainable(model, tc)
    optimizer = t.optimizer
    prepare_step(t, tc, torch.device("cpu"), Dist())
    assert optimizer.defaults.get("fused")  # the device-side skip; other optimizers must ask the host
    for update in range(2):
        group = [_batch(2 * update), _batch(2 * update + 1)]
        with _HostReads() as mode:
            result = train_step(t, group, tc, torch.device("cpu"))
        assert mode.reads == [], mode.reads
        assert result.updated  # read after the step, as the loop does


def test_step_unless_decides_on_the_device_for_fused_adam():
    p = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.Adam([p], lr=0.1, fused=True)
    p.grad = torch.ones(3)
    step_unless(opt, torch.tensor(True))
    assert torch.equal(p.detach(), torch.ones(3)) and not hasattr(opt, "found_inf")
    step_unless(opt, torch.tensor(False))
    assert (p.detach() < 1).all()


def test_schedule_unstep_takes_back_one_step():
    p = torch.nn.Parameter(torch.ones(1))
    tc = TrainConfig(lr=1.0, warmup_steps=10)
    opt = torch.optim.Adam([p])
    sched = build_scheduler(opt, tc)
    first = sched.get_last_lr()
    sched.step()
    sched.unstep()
    assert sched.get_last_lr() == first and sched.steps == 0


@pytest.mark.parametrize("rnn", [dict(decoder="none"), dict(decoder="luong", input_feeding=False)],
                         ids=["none", "luong-without-input-feeding"])
def test_a_decoder_whose_steps_run_at_once_is_left_uncompiled(rnn, fresh_compiler):
    """Teacher forcing runs such a decoder's steps as one fused call a layer (`steps_at_once`): no step to compile."""
    eager = Objective(_rnn(**rnn), pad_id=PAD_ID, smoothing=0.1)
    compiled = Objective(compile_model(copy.deepcopy(eager.model), backend="aot_eager", in_place=True),
                         pad_id=PAD_ID, smoothing=0.1)
    assert compiled.model.decoder.steps_at_once and compiled.model._teacher_step is None
    frames = counters["frames"]["ok"]
    _same_loss_and_gradients(eager, compiled, _batches_of_new_target_lengths())
    assert counters["frames"]["ok"] == frames


# --------------------------------------------------------------------------- the update's arithmetic
#
# With plain SGD at a rate of 1 (no momentum, no decay) an update moves each weight by minus the gradient the
# step hands the optimizer, so the change of the weights reads that gradient back: after clipping, and after the
# loss's normalisation. The model is in float64, so the change is the gradient to ~1e-12, far below any
# mistake in the normalisation or the clipping factor.


def _sgd_trainable(model: torch.nn.Module, tc: TrainConfig) -> Trainable:
    """`model` updated by SGD at `tc.lr` (1 below): the weights' change is minus the gradient the step applied."""
    return _trainable(model, tc, torch.optim.SGD(model.parameters(), lr=tc.lr))


def _reference_gradients(model: torch.nn.Module, group: list, smoothing: float) -> tuple[list, int, torch.Tensor]:
    """The gradient of the sum over `group` of every target token's label-smoothed cross-entropy
    (`F.cross_entropy`, padding ignored) divided by the group's target tokens, on a copy of `model`; with the
    number of those tokens and the sum. A parameter the loss does not reach gets zeros."""
    ref = copy.deepcopy(model)
    tokens = sum(int(b.tgt_out.ne(PAD_ID).sum()) for b in group)
    total = sum(torch.nn.functional.cross_entropy(ref(b.src, b.src_pad_mask, b.tgt_in).flatten(0, 1),
                                                  b.tgt_out.flatten(), ignore_index=PAD_ID,
                                                  label_smoothing=smoothing, reduction="sum")
                for b in group)
    (total / tokens).backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad for p in ref.parameters()], tokens, total.detach()


def _applied_steps(before: list, model: torch.nn.Module) -> list:
    """What an SGD update at a rate of 1 subtracted from each weight."""
    return [b - p.detach() for b, p in zip(before, model.parameters(), strict=True)]


@pytest.mark.parametrize("clip_ratio", [0.25, 4.0, 0.0], ids=["clipped", "below-the-limit", "clipping-off"])
def test_the_update_clips_the_whole_gradient_to_clip_norm_and_reports_the_norm_before_clipping(clip_ratio):
    """`train.clip_norm`: a gradient whose norm over all parameters (one vector) exceeds the limit is scaled to
    it, g * clip_norm / ||g||, every tensor by the same factor; one below the limit, or any with clip_norm 0,
    is applied whole. Either way the step returns ||g|| before clipping, which the loop logs."""
    model = _model().double()
    group = [_batch(1)]
    expected, _, _ = _reference_gradients(model, group, smoothing=0.1)
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in expected]))
    clip_norm = clip_ratio * float(norm)
    tc = TrainConfig(lr=1.0, warmup_steps=0, schedule="constant", clip_norm=clip_norm, label_smoothing=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(_sgd_trainable(model, tc), group, tc, torch.device("cpu"))
    assert result.updated
    torch.testing.assert_close(result.grad_norm, norm, rtol=1e-10, atol=0)
    scale = clip_norm / float(norm) if 0 < clip_norm < float(norm) else 1.0
    steps = _applied_steps(before, model)
    for (name, _), step, g in zip(model.named_parameters(), steps, expected, strict=True):
        # torch divides by ||g|| + 1e-6: a relative 1e-6 off the exact factor
        torch.testing.assert_close(step, g * scale, rtol=2e-6, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    applied = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(s) for s in steps]))
    assert float(applied) == pytest.approx(min(clip_norm, float(norm)) if clip_norm else float(norm), rel=2e-6)


def test_an_accumulated_update_applies_the_gradient_of_the_loss_per_target_token():
    """The loss of an update is the sum of its token losses (smoothed cross-entropy, padding ignored) over every
    batch of the group, divided by the group's target tokens: not averaged per batch, per sentence or not at
    all. Batches of 5 and 3 sentences and unequal token counts tell those apart."""
    model = _model().double()
    group = [_batch(1, n=5), _batch(2, n=3)]
    expected, tokens, summed = _reference_gradients(model, group, smoothing=0.1)
    assert tokens == sum(b.ntokens for b in group) and tokens not in (8, 1)  # not the sentences, not 1
    tc = TrainConfig(lr=1.0, warmup_steps=0, schedule="constant", clip_norm=0.0, accumulate=2, label_smoothing=0.1)
    before = [p.detach().clone() for p in model.parameters()]
    result = train_step(_sgd_trainable(model, tc), group, tc, torch.device("cpu"))
    assert result.updated and result.tokens == result.update_tokens == tokens
    for (name, _), step, g in zip(model.named_parameters(), _applied_steps(before, model), expected, strict=True):
        torch.testing.assert_close(step, g, rtol=1e-9, atol=1e-12, msg=lambda m, name=name: f"{name}: {m}")
    # the returned loss is the sum itself, unnormalised (the loop divides it by the tokens it logs)
    torch.testing.assert_close(result.loss.double(), summed, rtol=1e-6, atol=0)
