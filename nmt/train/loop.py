"""The training loop: one importable function over objects built beforehand.

`train(cfg)` prepares the data and tokenizer (`prepare_run`), builds the model,
optimizer and schedule, resumes from the newest checkpoint in the run directory
when there is one, and trains with periodic validation (loss, perplexity, greedy
BLEU), best/last checkpoints and early stopping.
"""

from __future__ import annotations

import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from nmt.config import ExperimentConfig, config_to_dict, save_config
from nmt.data.batching import Batch, TokenBatchSampler, collate
from nmt.data.corpus import clean_pairs, load_pairs
from nmt.data.dataset import prepare_split
from nmt.data.tokenizer import PAD_ID, Tokenizer, train_tokenizer
from nmt.errors import ConfigError, UserError
from nmt.evaluate import score
from nmt.models import build_model, count_parameters
from nmt.runtime import (
    Dist,
    autocast,
    enable_fast_math,
    grad_scaler,
    inference,
    init_distributed,
    pick_device,
    rng_states,
    seed_everything,
    set_rng_states,
)
from nmt.train.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    prune_checkpoints,
    remove_stale_temporaries,
    save_checkpoint,
)
from nmt.train.loss import label_smoothed_loss, perplexity
from nmt.train.optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- data


@dataclass
class RunData:
    """Tokenizer and tokenized splits of one run."""

    tokenizer: Tokenizer
    train: Any  # datasets.Dataset with src_ids, tgt_ids, src_len, tgt_len, src, tgt
    valid: Any
    reports: dict[str, dict[str, int]] = field(default_factory=dict)


def prepare_run(cfg: ExperimentConfig, run_dir: Path) -> RunData:
    """Load and clean the corpus, train (or reuse) the tokenizer, tokenize and filter the splits."""
    data = cfg.data
    for name in ("train", "valid"):
        if getattr(data, name) is None:
            raise ConfigError(f"data.{name}: required for training (a corpus section with kind and path)")
    cache = run_dir / "cache"
    tokenizer = Tokenizer.load(run_dir)
    if tokenizer is None:
        raw, _ = clean_pairs(load_pairs(data.train, src_lang=data.src_lang, tgt_lang=data.tgt_lang, cache_dir=cache))
        tokenizer = train_tokenizer(
            cfg.tokenizer, _column(raw, "src"), _column(raw, "tgt"), seed=cfg.train.seed
        )
        tokenizer.save(run_dir)
        log.info("trained sentencepiece: %d source / %d target pieces", tokenizer.src_vocab_size, tokenizer.tgt_vocab_size)
    train, train_report = prepare_split(data.train, data, tokenizer, cache_dir=cache, train=True)
    valid, valid_report = prepare_split(data.valid, data, tokenizer, cache_dir=cache, train=False)
    return RunData(tokenizer, train, valid, {"train": train_report, "valid": valid_report})


def _column(ds, name: str):
    for batch in ds.iter(batch_size=10_000):
        yield from batch[name]


def _batches(ds, batch_lists: list[list[int]]):
    """Collated batches for lists of row indices (rows fetched from Arrow per batch)."""
    for indices in batch_lists:
        rows = ds[indices]
        yield collate(rows, indices, pad_id=PAD_ID)


# --------------------------------------------------------------------------- state


@dataclass
class Progress:
    """Where training stands; saved in every checkpoint."""

    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0  # batches of this epoch already consumed
    best_metric: float | None = None
    bad_validations: int = 0
    train_seconds: float = 0.0


def _is_better(metric: float, best: float | None, kind: str) -> bool:
    if best is None:
        return True
    return metric > best if kind == "bleu" else metric < best


# --------------------------------------------------------------------------- training


def train_step(model, group: list[Batch], optimizer, scheduler, scaler, tc, device: torch.device,
               *, distributed: bool = False) -> tuple[float, float, int]:
    """One optimizer update over the micro-batches in `group` (gradient accumulation).

    The loss is normalised by the target tokens of the whole group, so accumulating
    k batches equals one batch k times larger. Under DDP, gradients are synchronised
    only on the last micro-batch.

    Returns:
        Summed smoothed loss, summed NLL, and target tokens of the group.
    """
    total_tokens = sum(b.ntokens for b in group)
    loss_sum = nll_sum = 0.0
    for i, b in enumerate(group):
        last = i == len(group) - 1
        sync = model.no_sync() if distributed and not last else contextlib.nullcontext()
        with sync, autocast(device, tc.precision):
            logits = model(b.src, b.src_pad_mask, b.tgt_in)
            out = label_smoothed_loss(logits, b.tgt_out, pad_id=PAD_ID, smoothing=tc.label_smoothing)
        scaler.scale(out.loss / max(total_tokens, 1)).backward()
        loss_sum += float(out.loss.detach())
        nll_sum += float(out.nll)
    scaler.unscale_(optimizer)
    if tc.clip_norm > 0:
        params = model.module.parameters() if distributed else model.parameters()
        torch.nn.utils.clip_grad_norm_(params, tc.clip_norm)
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    scheduler.step()
    return loss_sum, nll_sum, total_tokens



def train(cfg: ExperimentConfig, *, restart: bool = False) -> dict[str, Any]:
    """Train the model `cfg` describes in `cfg.run_dir`; resume there unless `restart`.

    Returns:
        A summary: steps, best metric, last validation scores, paths of checkpoints.
    """
    ctx = init_distributed(cfg.train.device)
    device = pick_device(cfg.train.device)
    enable_fast_math(device)
    tc = cfg.train
    run_dir = Path(cfg.run_dir)
    _prepare_run_dir(run_dir, restart, ctx)
    if ctx.is_main:
        save_config(cfg, run_dir / "config.yaml")
    seed_everything(tc.seed)

    data = prepare_run(cfg, run_dir)
    tok = data.tokenizer
    model = build_model(cfg.model, src_vocab_size=tok.src_vocab_size, tgt_vocab_size=tok.tgt_vocab_size, pad_id=PAD_ID)
    model.to(device)
    optimizer = build_optimizer(model, tc, device)
    scheduler = build_scheduler(optimizer, tc)
    scaler = grad_scaler(device, tc.precision)
    progress = Progress()

    resume_from = latest_checkpoint(run_dir)
    if resume_from is not None:
        payload = load_checkpoint(resume_from)
        _check_same_model(payload, cfg, resume_from)
        model.load_state_dict(payload["model"])
        optimizer.load_state_dict(payload["optimizer"])
        scheduler.load_state_dict(payload["scheduler"])
        scaler.load_state_dict(payload["scaler"])
        progress = Progress(**payload["progress"])
        set_rng_states(payload["rng"])
        log.info("resumed from %s at step %d", resume_from, progress.step)

    ddp_model = model
    if ctx.enabled:
        ddp_model = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )

    lens = data.train.with_format("numpy")
    sampler = TokenBatchSampler(
        src_lens=lens["src_len"], tgt_lens=lens["tgt_len"], max_tokens=tc.max_tokens,
        shuffle=True, seed=tc.seed, rank=ctx.rank, world_size=ctx.world_size,
    )
    n_params = count_parameters(model)
    if ctx.is_main:
        log.info("model: %s, %d parameters; %d training pairs, %d batches per epoch",
                 cfg.model.type, n_params, len(data.train), len(sampler.batch_list(0)))

    trainer = _Trainer(cfg, ddp_model, model, optimizer, scheduler, scaler, device, ctx, run_dir, data, progress)
    trainer.n_params = n_params
    summary = trainer.run(sampler)
    return summary


class _Trainer:
    """The mutable pieces of one run and the loop over them (kept private: use `train`)."""

    def __init__(self, cfg, ddp_model, model, optimizer, scheduler, scaler, device, ctx: Dist, run_dir, data, progress):
        self.cfg, self.tc = cfg, cfg.train
        self.ddp_model, self.model = ddp_model, model
        self.optimizer, self.scheduler, self.scaler = optimizer, scheduler, scaler
        self.device, self.ctx, self.run_dir, self.data, self.p = device, ctx, run_dir, data, progress
        self.metrics_file = run_dir / "metrics.jsonl"
        self.last_valid: dict[str, Any] = {}
        self.n_params = 0

    def run(self, sampler: TokenBatchSampler) -> dict[str, Any]:
        tc, p = self.tc, self.p
        bar = tqdm(total=tc.max_steps or None, initial=p.step, disable=None if self.ctx.is_main else True,
                   unit="step", dynamic_ncols=True, leave=False)
        window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "t0": time.perf_counter()}
        stop_reason = None
        session_start = time.perf_counter() - p.train_seconds
        validated_at = -1
        self.model.train()
        while stop_reason is None:
            if tc.max_epochs and p.epoch >= tc.max_epochs:
                stop_reason = f"max_epochs={tc.max_epochs}"
                break
            batch_lists = sampler.batch_list(p.epoch)[p.batch_in_epoch:]
            group: list[Batch] = []
            for batch in _batches(self.data.train, batch_lists):
                p.batch_in_epoch += 1
                group.append(batch.to(self.device, non_blocking=True))
                if len(group) < tc.accumulate:
                    continue
                loss, nll, ntok = self._update(group)
                group = []
                p.step += 1
                p.train_seconds = time.perf_counter() - session_start
                window["loss"] += loss
                window["nll"] += nll
                window["tokens"] += ntok
                if p.step % tc.log_every == 0 or p.step == 1:
                    self._log_train(window, bar)
                    window = {"loss": 0.0, "nll": 0.0, "tokens": 0, "t0": time.perf_counter()}
                bar.update(1)
                if p.step % tc.valid_every == 0:
                    validated_at = p.step
                    if self._validate_and_save():
                        stop_reason = f"no improvement in {tc.patience} validations"
                        break
                if tc.max_steps and p.step >= tc.max_steps:
                    stop_reason = f"max_steps={tc.max_steps}"
                    break
                if tc.max_time and p.train_seconds >= tc.max_time:
                    stop_reason = f"max_time={tc.max_time:g}s"
                    break
            else:
                p.epoch += 1
                p.batch_in_epoch = 0
        bar.close()
        if validated_at != p.step:
            self._validate_and_save()
        summary = {
            "event": "summary",
            "stop": stop_reason,
            "step": p.step,
            "epoch": p.epoch,
            "train_seconds": round(p.train_seconds, 1),
            "parameters": self.n_params,
            "best_metric": p.best_metric,
            "metric": self.tc.early_stop_metric,
            "last_valid": self.last_valid,
            "best_checkpoint": str(self.run_dir / "best.pt"),
        }
        self._write_metrics(summary)
        if self.ctx.is_main:
            log.info("done (%s): step %d, best valid %s %.2f, %.0fs", stop_reason, p.step,
                     self.tc.early_stop_metric, p.best_metric or 0.0, p.train_seconds)
        return summary

    def _update(self, group: list[Batch]) -> tuple[float, float, int]:
        return train_step(self.ddp_model, group, self.optimizer, self.scheduler, self.scaler,
                          self.tc, self.device, distributed=self.ctx.enabled)

    def _log_train(self, window: dict, bar) -> None:
        seconds = max(time.perf_counter() - window["t0"], 1e-9)
        tokens = max(window["tokens"], 1)
        lr = self.optimizer.param_groups[0]["lr"]
        record = {
            "event": "train",
            "step": self.p.step,
            "epoch": self.p.epoch,
            "loss": round(window["loss"] / tokens, 4),
            "ppl": round(perplexity(window["nll"], tokens), 2),
            "lr": lr,
            "tokens_per_s": round(window["tokens"] * self.ctx.world_size / seconds, 1),
        }
        if self.device.type == "cuda":
            record["peak_mem_mb"] = round(torch.cuda.max_memory_allocated(self.device) / 2**20, 1)
        bar.set_postfix(loss=f"{record['loss']:.3f}", lr=f"{lr:.2e}", tok_s=f"{record['tokens_per_s']:.0f}")
        self._write_metrics(record)

    @torch.no_grad()
    def validate(self) -> dict[str, Any]:
        """Validation loss and perplexity (teacher forcing), and greedy BLEU on the validation text."""
        tc, valid = self.tc, self.data.valid
        lens = valid.with_format("numpy")
        sampler = TokenBatchSampler(src_lens=lens["src_len"], tgt_lens=lens["tgt_len"], max_tokens=tc.max_tokens,
                                    shuffle=False, seed=0)
        loss_sum = nll_sum = 0.0
        ntok = 0
        with inference(self.model):
            for b in _batches(valid, sampler.batch_list(0)):
                b = b.to(self.device)
                with autocast(self.device, tc.precision):
                    logits = self.model(b.src, b.src_pad_mask, b.tgt_in)
                out = label_smoothed_loss(logits, b.tgt_out, pad_id=PAD_ID, smoothing=tc.label_smoothing)
                loss_sum += float(out.loss)
                nll_sum += float(out.nll)
                ntok += out.ntokens
        result: dict[str, Any] = {
            "loss": round(loss_sum / max(ntok, 1), 4),
            "ppl": round(perplexity(nll_sum, ntok), 2),
        }
        if tc.valid_bleu:
            from nmt.translate import Translator

            n = tc.valid_max_sentences or len(valid)
            subset = valid.select(range(min(n, len(valid))))
            translator = Translator(self.model, self.data.tokenizer, self.cfg, self.device)
            hyps = translator.translate(subset["src"], beam=1)
            result.update({k: v for k, v in score(hyps, subset["tgt"], self.cfg.eval).items() if k in ("bleu", "chrf")})
            self.model.train()
        return result

    def _validate_and_save(self) -> bool:
        """Validate, write checkpoints, and say whether early stopping is due."""
        p, tc = self.p, self.tc
        result = self.validate()
        self.last_valid = result
        kind = tc.early_stop_metric
        metric = result.get("bleu", -result["loss"]) if kind == "bleu" else result["loss"]
        if kind == "bleu" and "bleu" not in result:
            kind, metric = "loss", result["loss"]
        improved = _is_better(metric, p.best_metric, kind)
        if improved:
            p.best_metric = metric
            p.bad_validations = 0
        else:
            p.bad_validations += 1
        self._write_metrics({"event": "valid", "step": p.step, **result, "best": improved})
        if self.ctx.is_main:
            log.info("step %d valid: %s%s", p.step, " ".join(f"{k}={v}" for k, v in result.items()),
                     " (best)" if improved else "")
            payload = self._payload()
            save_checkpoint(payload, self.run_dir / f"ckpt_{p.step}.pt")
            if improved:
                save_checkpoint(payload, self.run_dir / "best.pt")
            prune_checkpoints(self.run_dir, tc.keep_last)
        return bool(tc.patience and p.bad_validations >= tc.patience)

    def _payload(self) -> dict[str, Any]:
        return {
            "config": config_to_dict(self.cfg),
            "tokenizer": self.data.tokenizer.to_state(),
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.scaler.state_dict(),
            "progress": vars(self.p).copy(),
            "rng": rng_states(),
            "valid": self.last_valid,
            "parameters": self.n_params,
        }

    def _write_metrics(self, record: dict[str, Any]) -> None:
        if self.ctx.is_main:
            with open(self.metrics_file, "a", encoding="utf-8") as f:
                f.write(json.dumps(record) + "\n")



def _prepare_run_dir(run_dir: Path, restart: bool, ctx: Dist) -> None:
    """Create the run directory and make sure it is writable before any work starts."""
    if not ctx.is_main:
        return
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / ".write-test"
        probe.write_bytes(b"0" * 4096)
        probe.unlink()
    except OSError as err:
        raise UserError(f"run_dir {run_dir}: not writable ({err.strerror}); choose another run_dir") from None
    remove_stale_temporaries(run_dir)
    if restart:
        for p in list(run_dir.glob("ckpt_*.pt")) + [run_dir / "best.pt", run_dir / "metrics.jsonl"]:
            p.unlink(missing_ok=True)
        for p in run_dir.glob("spm*.model"):
            p.unlink()
        import shutil

        shutil.rmtree(run_dir / "cache", ignore_errors=True)


def _check_same_model(payload: dict[str, Any], cfg: ExperimentConfig, path: Path) -> None:
    """Refuse to resume when the config changed what the weights mean."""
    saved = payload.get("config", {})
    now = config_to_dict(cfg)
    for section in ("model", "tokenizer"):
        if saved.get(section) != now[section]:
            raise UserError(
                f"{path}: the run directory holds a run with a different {section} section; "
                f"use --restart to start over or choose another run_dir"
            )


