"""Validation during training: teacher-forced loss and perplexity, and text metrics of greedy translations.

Each rank of a torchrun job does a share of the validation set and every rank
gets the totals, so all of them take the same decisions (best checkpoint, early
stopping, the plateau schedule).
"""

from __future__ import annotations

import dataclasses
from itertools import chain
from typing import Any

import torch
from torch import nn

from nmt.config import ExperimentConfig
from nmt.data.tokenizer import PAD_ID
from nmt.distributed import Dist, all_gather, all_reduce
from nmt.metrics import METRICS, score
from nmt.runtime import autocast, inference
from nmt.train.data import RunData, build_sampler, collated_batches, past_positions
from nmt.train.loss import label_smoothed_loss, perplexity
from nmt.translate import Translator


def early_stop_metric(cfg: ExperimentConfig) -> str:
    """The metric that picks the best checkpoint: `train.early_stop_metric`, or the loss when
    validation translates nothing (`train.valid_bleu: false`)."""
    return stop_metric(cfg.train.early_stop_metric, valid_bleu=cfg.train.valid_bleu)


def stop_metric(name: str, *, valid_bleu: bool) -> str:
    """`early_stop_metric` of the settings `train.early_stop_metric` and `train.valid_bleu` (as a checkpoint's
    config records them)."""
    return name if METRICS[name].scorer is None or valid_bleu else "loss"


@torch.no_grad()
def validate(model: nn.Module, data: RunData, cfg: ExperimentConfig, device: torch.device,
             ctx: Dist = Dist()) -> dict[str, Any]:
    """{"loss", "ppl"} on the validation set, plus `eval.metrics` (and the early-stopping metric)
    of greedy translations when `train.valid_bleu`. Leaves the model in training mode."""
    tc, valid = cfg.train, data.valid
    sampler = build_sampler(valid, max_tokens=tc.max_tokens, shuffle=False, seed=0, order=tc.batch_order)
    batches = within_positions(valid, sampler.batch_list(0), getattr(model, "max_positions", None))
    loss_sum = nll_sum = 0.0
    ntok = 0
    with inference(model):
        for b in collated_batches(valid, batches[ctx.rank::ctx.world_size]):
            b = b.to(device)
            with autocast(device, tc.precision):
                logits = model(b.src, b.src_pad_mask, b.tgt_in)
            out = label_smoothed_loss(logits, b.tgt_out, pad_id=PAD_ID, smoothing=tc.label_smoothing)
            loss_sum, nll_sum, ntok = loss_sum + float(out.loss), nll_sum + float(out.nll), ntok + int(out.ntokens)
    loss_sum, nll_sum, ntok = all_reduce([loss_sum, nll_sum, ntok], device, ctx)
    result: dict[str, Any] = {"loss": round(loss_sum / max(ntok, 1), 4), "ppl": round(perplexity(nll_sum, ntok), 2)}
    if tc.valid_bleu:
        result.update(_text_metrics(model, data, cfg, device, ctx))
    model.train()
    return result


def within_positions(ds, batches: list[list[int]], positions: int | None) -> list[list[int]]:
    """`batches` without the pairs whose source or target is longer than the model's `positions` (None: no
    limit), which it cannot be teacher-forced on; batches left empty are dropped. Validation keeps every
    pair, so its scores compare across runs (`prepare_split`); such pairs are translated from a truncated
    source, and `prepare_run` says how many there are."""
    if positions is None:
        return batches
    over = past_positions(ds, positions)
    if not over.any():
        return batches
    kept = [[i for i in batch if not over[i]] for batch in batches]
    return [batch for batch in kept if batch]


def _text_metrics(model: nn.Module, data: RunData, cfg: ExperimentConfig, device: torch.device,
                  ctx: Dist) -> dict[str, float]:
    valid = data.valid
    n = min(cfg.train.valid_max_sentences or len(valid), len(valid))
    mine = list(range(ctx.rank, n, ctx.world_size))
    translator = Translator(model, data.tokenizer, cfg, device)
    hyps = translator.translate(valid.select(mine)["src"], beam=1) if mine else []
    hyps = [h for _, h in sorted(chain(*all_gather(list(zip(mine, hyps)), ctx)))]
    names = list(dict.fromkeys([*cfg.eval.metrics, early_stop_metric(cfg)]))
    settings = dataclasses.replace(cfg.eval, metrics=[m for m in names if METRICS[m].scorer])
    scores = score(hyps, valid.select(range(n))["tgt"], settings)
    return {m: scores[m] for m in settings.metrics}
