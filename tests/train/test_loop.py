"""The training loop on a tiny Transformer: precisions, exact resume, faults, checkpoints, schedules, workers."""

from __future__ import annotations

import json
import logging
import math
import shutil
import time

import pytest
import torch

from nmt.checkpoint import load_checkpoint, model_from_checkpoint, periodic_checkpoints
from nmt.config import config_from_dict
from nmt.errors import UserError
from nmt.kernels import compile_model
from nmt.train.faults import TrainingDiverged, check_free_space
from nmt.train.loop import train
from tests.train.helpers import same_weights, tiny_cfg, tiny_raw, weights, without_key_biases


def records(run_dir, event: str) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == event]


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_each_precision_trains_on_cpu(precision, small_corpus, tmp_path, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING):
        summary = train(tiny_cfg(small_corpus, run, precision=precision, max_steps=4, device="cpu"))
    assert "use fp32" not in caplog.text or precision == "bf16"  # only bf16 can be slower than fp32 on a CPU
    assert summary["step"] == 4 and math.isfinite(summary["last_valid"]["loss"])
    logged = records(run, "train")
    assert [r["step"] for r in logged] == [1, 2, 3, 4]
    assert all(math.isfinite(r["loss"]) and r["peak_rss_mb"] > 0 and r["tokens_per_update"] > 0 for r in logged)
    ckpt = load_checkpoint(run / "ckpt_4.pt")
    assert (ckpt["scaler"].get("scale") == 2.0**16) == (precision == "fp16")  # a scaler only for fp16
    assert {v.dtype for v in ckpt["model"].values() if v.is_floating_point()} == {torch.float32}  # master weights


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])  # bf16: 10 s on AVX2
def test_stop_and_resume_is_bitwise_exact(precision, small_corpus, tmp_path):
    """8 updates (accumulating 2 batches, crossing an epoch, with dropout) equal 4, stop, then 4 more.

    In bf16 the resumed run rebuilds its bf16 copy from the saved fp32 weights, as the straight run refreshed it.
    """
    straight = train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=8, accumulate=2, precision=precision))
    train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=4, accumulate=2, precision=precision))
    resumed = train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=8, accumulate=2, precision=precision))
    assert straight["epoch"] == resumed["epoch"] == 1
    assert same_weights(weights(tmp_path / "a" / "ckpt_8.pt"), weights(tmp_path / "b" / "ckpt_8.pt"))
    assert straight["last_valid"] == resumed["last_valid"]
    assert [r["step"] for r in records(tmp_path / "b", "train")] == list(range(1, 9))


def test_a_finished_run_started_again_does_nothing(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "run", max_steps=3)
    first = train(cfg)
    summary = train(cfg)
    assert summary["step"] == 3 and summary["stop"] == "max_steps=3"
    assert summary["last_valid"] == first["last_valid"] and "loss" in summary["last_valid"]
    assert len(records(tmp_path / "run", "valid")) == 1


def test_data_loader_workers_give_the_same_batches(small_corpus, tmp_path):
    train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=3))
    train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=3, num_workers=1))
    assert same_weights(weights(tmp_path / "a" / "ckpt_3.pt"), weights(tmp_path / "b" / "ckpt_3.pt"))


def test_static_shapes_train_the_same_model_as_free_shapes(small_corpus, tmp_path, caplog):
    """Filling every batch to its length bucket's one shape adds rows that carry no loss: without dropout the
    updates are those of the same batches unfilled, up to float rounding. A whole epoch, so that the batches
    that are filled (the last of a length bucket, the epoch's shortest pairs) come up."""
    runs = {}
    for shapes in ("free", "static"):
        raw = tiny_raw(small_corpus, tmp_path / shapes, max_steps=0, max_epochs=1, pad_to_multiple=1,
                       batch_shapes=shapes)  # a multiple of 1: both cut the same batches (Padding.sampler_rounding)
        raw["model"]["transformer"]["dropout"] = 0.0
        with caplog.at_level(logging.INFO, logger="nmt"):
            train(config_from_dict(raw))
        runs[shapes] = records(tmp_path / shapes, "train")
    assert "static batch shapes:" in caplog.text
    assert [r["tokens_per_update"] for r in runs["static"]] == [r["tokens_per_update"] for r in runs["free"]]
    # the same real tokens in more positions: the empty pairs that fill static shapes
    assert all(0 < s["real_tokens"] <= f["real_tokens"] <= 1 for s, f in zip(runs["static"], runs["free"], strict=True))
    assert sum(s["real_tokens"] < f["real_tokens"] for s, f in zip(runs["static"], runs["free"], strict=True)) >= 1
    for free, static in zip(runs["free"], runs["static"], strict=True):
        assert math.isclose(static["loss"], free["loss"], rel_tol=1e-4), (free, static)
    last = runs["static"][-1]["step"]
    a, b = (without_key_biases(weights(tmp_path / run / f"ckpt_{last}.pt")) for run in ("free", "static"))
    assert all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a), \
        max((float((a[k] - b[k]).abs().max()), k) for k in a)


def test_non_finite_loss_skips_updates_then_stops_with_a_clear_error(small_corpus, tmp_path, caplog):
    """A learning rate of 1e30 blows the weights up after one update; every later loss is NaN."""
    run = tmp_path / "run"
    cfg = tiny_cfg(small_corpus, run, lr=1e30, warmup_steps=0, max_bad_steps=3, save_every=1, max_steps=50)
    with caplog.at_level(logging.WARNING), pytest.raises(TrainingDiverged) as err:
        train(cfg)
    message = str(err.value)
    assert "not finite for 3 updates in a row" in message and "train.lr (now 1e+30)" in message
    assert "ckpt_1.pt" in message  # the last good checkpoint
    assert sum("update skipped" in r.message for r in caplog.records) == 3
    assert load_checkpoint(run / "ckpt_1.pt")["progress"]["step"] == 1
    assert not (run / "ckpt_2.pt").exists()  # skipped updates are not steps


def test_save_every_keep_last_and_average_last(small_corpus, tmp_path):
    run = tmp_path / "run"
    summary = train(tiny_cfg(small_corpus, run, max_steps=6, save_every=2, keep_last=3, average_last=3))
    assert sorted(p.name for p in run.glob("ckpt_*.pt")) == ["ckpt_2.pt", "ckpt_4.pt", "ckpt_6.pt"]
    assert summary["averaged_checkpoint"] == str(run / "averaged.pt")
    averaged = load_checkpoint(run / "averaged.pt")
    parts = [weights(run / f"ckpt_{s}.pt") for s in (2, 4, 6)]
    for k, v in averaged["model"].items():
        if v.is_floating_point():
            assert torch.allclose(v, sum(p[k] for p in parts) / 3, atol=1e-6)
    model, _, _ = model_from_checkpoint(averaged)  # usable for translation on its own
    assert sum(p.numel() for p in model.parameters()) == summary["parameters"]


def test_a_run_stopped_off_its_save_schedule_then_resumed_keeps_and_averages_the_straight_runs_checkpoints(
        small_corpus, tmp_path):
    """The checkpoint where a run stops between saves (a signal, train.max_time, a max_steps raised later) is the
    one to resume from: counted as a periodic one, it pushed ckpt_2.pt out of keep_last, stayed after the resume,
    and averaged.pt took it instead of ckpt_4.pt, unlike the same run straight through."""
    settings = {"save_every": 2, "keep_last": 3, "average_last": 3}
    straight = train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=8, **settings))
    train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=5, **settings))
    assert kept(tmp_path / "b") == ["ckpt_2.pt", "ckpt_4.pt", "ckpt_5.pt"]  # the stop's, beside the three kept
    assert load_checkpoint(tmp_path / "b" / "ckpt_5.pt")["progress"]["off_schedule"]
    resumed = train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=8, **settings))
    assert kept(tmp_path / "a") == kept(tmp_path / "b") == ["ckpt_4.pt", "ckpt_6.pt", "ckpt_8.pt"]
    assert [p.rsplit("/", 1)[-1] for p in load_checkpoint(resumed["averaged_checkpoint"])["averaged"]] == kept(
        tmp_path / "a")
    assert same_weights(weights(straight["averaged_checkpoint"]), weights(resumed["averaged_checkpoint"]))


def test_a_checkpoint_after_a_validation_counts_its_time_as_the_straight_run_does(small_corpus, tmp_path,
                                                                                  monkeypatch):
    """train_seconds was taken after each update only, so the checkpoint of a validation step left that
    validation out: a run resumed from it had that much more of train.max_time than one going on."""
    import nmt.train.loop as loop

    validate = loop.validate

    def slow_validate(*args, **kwargs):  # a large validation set's time
        time.sleep(1.5)
        return validate(*args, **kwargs)

    monkeypatch.setattr(loop, "validate", slow_validate)
    train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=2, valid_every=2))
    (valid,) = records(tmp_path / "run", "valid")
    assert load_checkpoint(tmp_path / "run" / "ckpt_2.pt")["progress"]["train_seconds"] >= valid["seconds"] >= 1.5


def kept(run_dir) -> list[str]:
    return [p.name for p in periodic_checkpoints(run_dir)]


def test_plateau_schedule_lowers_the_rate_when_bleu_stalls(small_corpus, tmp_path):
    """With a negligible rate the greedy output, hence BLEU, never changes: each validation after the first is a plateau."""
    run = tmp_path / "run"
    train(tiny_cfg(small_corpus, run, schedule="plateau", lr=1e-12, warmup_steps=0, plateau_patience=0,
                   plateau_factor=0.5, valid_every=1, valid_bleu=True, valid_max_sentences=4, max_steps=3))
    assert load_checkpoint(run / "ckpt_3.pt")["scheduler"]["scale"] == 0.25
    # each step logs the rate its update ran with: lowered after the validations of steps 2 and 3
    assert [r["lr"] for r in records(run, "train")] == pytest.approx([1e-12, 1e-12, 5e-13], rel=1e-9, abs=0)


def test_the_logged_rate_is_the_schedule_s_to_six_digits(small_corpus, tmp_path):
    """The warm-up's thirds of 1e-3, and the rate itself, as a reader writes them: 0.00030000000000000003 was the
    float's last bits, not a figure."""
    run = tmp_path / "run"
    train(tiny_cfg(small_corpus, run, schedule="constant", lr=1e-3, warmup_steps=3, max_steps=4))
    assert [r["lr"] for r in records(run, "train")] == [0.000333333, 0.000666667, 0.001, 0.001]


def test_plateau_counts_no_validation_during_warm_up(small_corpus, tmp_path):
    """BLEU stalls from the first validation on, but the rate rises to train.lr over the warm-up uncut."""
    run = tmp_path / "run"
    train(tiny_cfg(small_corpus, run, schedule="plateau", lr=1e-12, warmup_steps=4, plateau_patience=0,
                   plateau_factor=0.5, valid_every=1, valid_bleu=True, valid_max_sentences=4, max_steps=6))
    assert [r["lr"] for r in records(run, "train")] == pytest.approx(
        [0.25e-12, 0.5e-12, 0.75e-12, 1e-12, 1e-12, 0.5e-12], rel=1e-9, abs=0)


def test_unwritable_or_full_run_dir_is_a_clear_error_before_training(small_corpus, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(UserError, match="run_dir .*file/run: not writable"):
        train(tiny_cfg(small_corpus, blocker / "run"))
    with pytest.raises(UserError, match=r"run_dir .*file: a file, not a folder; choose another run_dir$"):
        train(tiny_cfg(small_corpus, blocker))  # was "not writable (File exists)"
    with pytest.raises(UserError, match=r"free, but a checkpoint of this model \(1,000,000,000,000,000 parameters"):
        check_free_space(tmp_path, n_params=10**15, keep_last=2)
    check_free_space(tmp_path, n_params=1000, keep_last=2)  # a small model fits


def test_compile_falls_back_to_eager_with_a_warning(caplog):
    model = torch.nn.Linear(2, 2)
    with caplog.at_level(logging.WARNING):
        assert compile_model(model, backend="no_such_backend") is model
    assert "training uncompiled" in caplog.text


@pytest.mark.slow
@pytest.mark.parametrize("mode, dynamic", [("default", True), ("reduce-overhead", True), ("reduce-overhead", False)])
def test_compiled_training_runs(mode, dynamic, small_corpus, tmp_path):
    """reduce-overhead records CUDA graphs on a GPU; on a CPU it compiles as default does, here with static shapes,
    in one dynamic graph or (`compile_dynamic: false`) a graph per shape."""
    static = dict(batch_shapes="static", pad_to_multiple=16) if mode == "reduce-overhead" else {}
    summary = train(tiny_cfg(small_corpus, tmp_path / "run", compile=True, compile_mode=mode, max_steps=2,
                             compile_dynamic=dynamic, **static))
    assert summary["step"] == 2 and math.isfinite(summary["last_valid"]["loss"])
    assert not any(k.startswith("_orig_mod") for k in weights(tmp_path / "run" / "ckpt_2.pt"))


def test_tensorboard_scalars_match_metrics_jsonl(small_corpus, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=4))
    events = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    events.Reload()
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for kind, key in [("train", "loss"), ("train", "lr"), ("valid", "loss"), ("valid", "ppl")]:
        logged = [(r["step"], r[key]) for r in records if r["event"] == kind]
        scalars = [(e.step, e.value) for e in events.Scalars(f"{kind}/{key}")]
        assert logged and [s for s, _ in scalars] == [s for s, _ in logged]
        assert [v for _, v in scalars] == pytest.approx([v for _, v in logged], rel=1e-6)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_on_cuda_with_pinned_worker_batches(precision, small_corpus, tmp_path):
    run = tmp_path / "run"
    summary = train(tiny_cfg(small_corpus, run, device="cuda", precision=precision, num_workers=1, max_steps=4))
    assert summary["step"] == 4 and math.isfinite(summary["last_valid"]["loss"])
    assert all(r["peak_mem_mb"] > 0 for r in records(run, "train"))


def test_resuming_in_another_batch_order_warns_and_the_same_order_does_not(small_corpus, tmp_path, caplog):
    train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=2, batch_order="longer"))
    with caplog.at_level(logging.WARNING):
        train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=3, batch_order="longer"))
    assert not [r for r in caplog.records if "batch_order" in r.getMessage()]
    with caplog.at_level(logging.WARNING):
        summary = train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=4, batch_order="lengths"))
    [message] = [r.getMessage() for r in caplog.records if "batch_order" in r.getMessage()]
    assert message.startswith(f"{tmp_path / 'run' / 'ckpt_3.pt'} was trained with train.batch_order: longer, now "
                              "lengths: ") and message.endswith("set train.batch_order: longer to resume in the run's "
                                                                 "order")
    assert summary["step"] == 4
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=5, batch_order="lengths"))
    assert not [r for r in caplog.records if "batch_order" in r.getMessage()]  # the checkpoint keeps its order


def test_resuming_with_batches_of_another_size_or_seed_warns_naming_both(small_corpus, tmp_path, caplog):
    train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=2, max_tokens=600, seed=1))
    with caplog.at_level(logging.WARNING):
        assert train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=3, max_tokens=300, seed=2))["step"] == 3
    [message] = [r.getMessage() for r in caplog.records if "cut anew" in r.getMessage()]
    assert message.startswith(f"{tmp_path / 'run' / 'ckpt_2.pt'} was trained with train.max_tokens: 600, now 300, "
                              "train.seed: 1, now 2: this epoch's remaining batches may be cut anew")
    assert message.endswith("set train.max_tokens: 600, train.seed: 1 to resume in the run's order")


def test_a_resumed_run_updates_with_the_optimizer_settings_of_its_config(small_corpus, tmp_path, caplog):
    """Stopped after 2 updates of Adam without weight decay, run a resumes as AdamW with decay 0.1, its copy b as
    it was. Their gradients at step 3 are the same (the same weights, batch and dropout), so AdamW's decoupled
    decay is the whole difference: each decayed matrix is lr x 0.1 x its step-2 value lower, the vectors are
    unchanged. A third copy resumes with other betas and eps, which its optimizer then holds."""
    train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=2))
    for copy in ("b", "c"):
        shutil.copytree(tmp_path / "a", tmp_path / copy)
    with caplog.at_level(logging.INFO, logger="nmt"):
        train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=3, optimizer="adamw", weight_decay=0.1))
    assert "train.optimizer: adamw (the checkpoint's: adam), train.weight_decay: 0.1 (the checkpoint's: 0.0)" \
        in caplog.text
    train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=3))
    [lr] = [r["lr"] for r in records(tmp_path / "a", "train") if r["step"] == 3]
    # c, not yet resumed, still holds the step-2 checkpoint that a and b replaced (a stop's, off their schedule)
    before, a, b = (weights(tmp_path / run / f"ckpt_{step}.pt") for run, step in (("c", 2), ("a", 3), ("b", 3)))
    for name, p in before.items():
        if p.is_floating_point() and p.ndim >= 2:
            torch.testing.assert_close(a[name], b[name] - lr * 0.1 * p, rtol=0, atol=1e-7)
            assert not torch.equal(a[name], b[name])
        else:
            torch.testing.assert_close(a[name], b[name], rtol=0, atol=1e-7)
    decayed, other = load_checkpoint(tmp_path / "a" / "ckpt_3.pt")["optimizer"]["param_groups"]
    assert (decayed["weight_decay"], other["weight_decay"]) == (0.1, 0.0)
    assert decayed["decoupled_weight_decay"] and other["decoupled_weight_decay"]
    train(tiny_cfg(small_corpus, tmp_path / "c", max_steps=3, eps=1e-6, betas=[0.8, 0.95]))
    groups = load_checkpoint(tmp_path / "c" / "ckpt_3.pt")["optimizer"]["param_groups"]
    assert [(tuple(g["betas"]), g["eps"]) for g in groups] == [((0.8, 0.95), 1e-6)] * 2
    assert not same_weights(weights(tmp_path / "b" / "ckpt_3.pt"), weights(tmp_path / "c" / "ckpt_3.pt"))
