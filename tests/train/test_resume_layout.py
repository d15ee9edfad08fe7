"""Runs saved before the Transformer's attention projections were merged resume where they stopped."""

from __future__ import annotations

import shutil

import pytest
import torch

from nmt.checkpoint import (
    average_checkpoints,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from nmt.errors import CheckpointError, UserError
from nmt.train.loop import train
from nmt.train.optim import build_optimizer, load_optimizer_state
from tests.train.helpers import same_weights, tiny_cfg, weights


def numbered(names: list[str], tensors: dict[str, torch.Tensor]) -> dict[str, int]:
    """The optimizer's number of each parameter: `build_optimizer` groups matrices first, then vectors."""
    ordered = [n for n in names if tensors[n].ndim >= 2] + [n for n in names if tensors[n].ndim < 2]
    return {n: i for i, n in enumerate(ordered)}


def separate_projections(payload: dict) -> dict:
    """`payload` as the layout before `qkv_proj` saved it.

    Each attention module then registered `q_proj`, `out_proj` and `kv_proj`, in that order, so its weights
    came in that order, and the optimizer numbered the parameters in that order too. Self-attention's
    `qkv_proj` (queries, then keys and values) was `q_proj` and `kv_proj`.
    """
    new = payload["model"]
    model, _, _ = model_from_checkpoint(payload)
    d = model.encoder.layers[0].self_attn.d_model
    old_model: dict[str, torch.Tensor] = {}
    parts_of: dict[str, list[tuple[str, slice]]] = {}  # a merged parameter's old parts and their rows
    for name, t in new.items():
        module = name.rsplit(".", 2)[0]  # e.g. decoder.layers.0.self_attn
        if not module.endswith("_attn"):
            old_model[name] = t
            continue
        if f"{module}.out_proj.weight" in old_model:
            continue  # the module's weights are written at its first entry
        old = {}
        for k in ("weight", "bias"):
            if f"{module}.qkv_proj.{k}" in new:
                old["q_proj", k], old["kv_proj", k] = new[f"{module}.qkv_proj.{k}"].split([d, 2 * d])
                parts_of[f"{module}.qkv_proj.{k}"] = [(f"{module}.q_proj.{k}", slice(0, d)),
                                                      (f"{module}.kv_proj.{k}", slice(d, 3 * d))]
            else:
                old["q_proj", k], old["kv_proj", k] = new[f"{module}.q_proj.{k}"], new[f"{module}.kv_proj.{k}"]
            old["out_proj", k] = new[f"{module}.out_proj.{k}"]
        for proj in ("q_proj", "out_proj", "kv_proj"):  # their order of registration then
            for k in ("weight", "bias"):
                old_model[f"{module}.{proj}.{k}"] = old[proj, k].clone()

    names = [n for n, _ in model.named_parameters()]
    tied = {n for n, _ in model.named_parameters(remove_duplicate=False)} - set(names)
    old_names = [n for n in old_model if n not in tied]
    new_number, old_number = numbered(names, new), numbered(old_names, old_model)
    state = {}
    for name in names:
        saved = payload["optimizer"]["state"][new_number[name]]
        for old_name, rows in parts_of.get(name, [(name, slice(None))]):
            state[old_number[old_name]] = {k: v if v.ndim == 0 else v[rows].clone() for k, v in saved.items()}
    matrices = sum(old_model[n].ndim >= 2 for n in old_names)
    first, second = payload["optimizer"]["param_groups"]
    groups = [{**first, "params": list(range(matrices))}, {**second, "params": list(range(matrices, len(old_names)))}]
    return {**payload, "model": old_model, "optimizer": {"state": state, "param_groups": groups}}


def test_a_run_saved_with_separate_projections_resumes_to_the_bit(small_corpus, tmp_path):
    """Three updates, saved; the checkpoint rewritten in the older layout; three more updates from each: the same
    weights to the bit, so the optimizer's moments and step counts came through whole, each in its place."""
    train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=3))
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    old = separate_projections(load_checkpoint(tmp_path / "a" / "ckpt_3.pt"))
    assert not any("qkv_proj" in n for n in old["model"]) and any("self_attn.q_proj" in n for n in old["model"])
    save_checkpoint(old, tmp_path / "b" / "ckpt_3.pt")
    train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=6))
    train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=6))
    assert same_weights(weights(tmp_path / "a" / "ckpt_6.pt"), weights(tmp_path / "b" / "ckpt_6.pt"))


def test_checkpoints_of_both_layouts_average_in_the_new_one(small_corpus, tmp_path):
    """A run resumed across the change holds checkpoints of both layouts: `train.average_last` averages them."""
    train(tiny_cfg(small_corpus, tmp_path / "run", max_steps=4, save_every=2, keep_last=2))
    run = tmp_path / "run"
    save_checkpoint(separate_projections(load_checkpoint(run / "ckpt_2.pt")), tmp_path / "old_2.pt")
    for paths in ([tmp_path / "old_2.pt", run / "ckpt_4.pt"], [run / "ckpt_4.pt", tmp_path / "old_2.pt"]):
        averaged = average_checkpoints(paths)["model"]
        assert same_weights(averaged, average_checkpoints([run / "ckpt_2.pt", run / "ckpt_4.pt"])["model"])


def test_an_optimizer_state_that_fits_no_layout_is_a_clear_error(small_corpus, tmp_path):
    cfg = tiny_cfg(small_corpus, tmp_path / "a", max_steps=2)
    train(cfg)
    payload = separate_projections(load_checkpoint(tmp_path / "a" / "ckpt_2.pt"))
    model, _, _ = model_from_checkpoint(payload)
    partial = {**payload["optimizer"], "state": dict(payload["optimizer"]["state"])}
    del partial["state"][3]
    with pytest.raises(ValueError, match="its optimizer has state for some parameters and not for others"):
        load_optimizer_state(build_optimizer(model, cfg.train, torch.device("cpu")), model, partial, payload["model"])
    payload["optimizer"]["param_groups"][1]["params"].pop()
    with pytest.raises(ValueError, match=r"its optimizer holds \[\d+, \d+\] parameters per group where the weights"):
        load_optimizer_state(build_optimizer(model, cfg.train, torch.device("cpu")), model, payload["optimizer"],
                             payload["model"])
    save_checkpoint(payload, tmp_path / "a" / "ckpt_2.pt")
    with pytest.raises(CheckpointError, match=r"ckpt_2.pt: cannot resume its optimizer \(.*\); to start a new run"):
        train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=4))


def test_a_run_saved_before_a_tokenizer_key_was_added_resumes(small_corpus, tmp_path):
    """Checkpoints written before `tokenizer.normalization` existed hold a tokenizer section without it: compared
    as they were stored, every such run was refused as "a different tokenizer section" when resumed."""
    run = tmp_path / "run"
    train(tiny_cfg(small_corpus, run, max_steps=2))
    [ckpt] = sorted(run.glob("ckpt_*.pt"))
    payload = load_checkpoint(ckpt)
    del payload["config"]["tokenizer"]["normalization"]  # as an earlier nmt saved it
    save_checkpoint(payload, ckpt)
    summary = train(tiny_cfg(small_corpus, run, max_steps=3))
    assert summary["step"] == 3
    payload["config"]["tokenizer"]["normalization"] = "identity"  # a tokenizer made otherwise is still refused
    save_checkpoint(payload, ckpt)
    for other in run.glob("ckpt_*.pt"):
        if other != ckpt:
            other.unlink()
    with pytest.raises(UserError, match="a different tokenizer section"):
        train(tiny_cfg(small_corpus, run, max_steps=4))
