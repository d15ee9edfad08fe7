"""When training stops and which checkpoint is best: early-stopping patience, ties, `best.pt`, and `max_epochs`.

The validation scores that drive early stopping come from a sequence written by hand: the real validation runs,
then its loss is replaced by the next score of the sequence, so the expected stop step and best step are read off
the sequence below, not computed by the loop.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from nmt.checkpoint import load_checkpoint, periodic_checkpoints
from nmt.data.tokenizer import Tokenizer
from nmt.train import loop
from nmt.train.loop import train
from tests.train.helpers import same_weights, tiny_cfg, weights

# Validation losses (lower is better), one per step with valid_every 1. With patience 2:
#   step 1: 5.0 first          -> best                 step 5: 3.0 ties step 4 -> 1 without improvement
#   step 2: 4.0 < 5.0          -> best                 step 6: 3.5             -> 2: stop after step 6
#   step 3: 4.5                -> 1 without improvement
#   step 4: 3.0 < 4.0          -> best, count back to 0
# Without patience the run goes on to step 10, and the last best is step 8 (1.0; the ties at 9 and 10 are not better).
SCORES = [5.0, 4.0, 4.5, 3.0, 3.0, 3.5, 2.0, 1.0, 1.0, 1.0]
BEST_FLAGS = [True, True, False, True, False, False, True, True, False, False]


@pytest.fixture
def scripted_loss(monkeypatch):
    """Make validation number i (from `start`) report the loss SCORES[start + i]; returns a setter for `start`."""
    real = loop.validate
    at = {"next": 0}

    def validate(*args, **kwargs):
        result = real(*args, **kwargs)
        result["loss"] = SCORES[at["next"]]
        at["next"] += 1
        return result

    monkeypatch.setattr(loop, "validate", validate)
    return lambda start: at.update(next=start)


def valid_records(run_dir) -> list[dict]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["event"] == "valid"]


def test_patience_stops_after_that_many_validations_without_improvement(small_corpus, tmp_path, scripted_loss):
    run = tmp_path / "run"
    summary = train(tiny_cfg(small_corpus, run, valid_every=1, patience=2, max_steps=10, keep_last=10))
    assert summary["stop"] == "no improvement in 2 validations"
    assert summary["step"] == 6 and summary["best_metric"] == 3.0
    assert [(r["step"], r["loss"], r["best"]) for r in valid_records(run)] == list(
        zip(range(1, 7), SCORES[:6], BEST_FLAGS[:6]))
    best = load_checkpoint(run / "best.pt")
    assert best["progress"]["step"] == 4 and best["progress"]["best_step"] == 4
    assert same_weights(best["model"], weights(run / "ckpt_4.pt"))  # the weights of the best step, not the last
    assert load_checkpoint(run / "ckpt_6.pt")["progress"]["bad_validations"] == 2


def test_without_patience_the_run_ends_at_max_steps_and_a_tie_is_not_a_new_best(small_corpus, tmp_path,
                                                                                 scripted_loss):
    run = tmp_path / "run"
    summary = train(tiny_cfg(small_corpus, run, valid_every=1, max_steps=10, keep_last=10))
    assert summary["stop"] == "max_steps=10" and summary["best_metric"] == 1.0
    assert [r["best"] for r in valid_records(run)] == BEST_FLAGS
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == 8
    assert same_weights(weights(run / "best.pt"), weights(run / "ckpt_8.pt"))


def test_patience_counts_across_a_resume(small_corpus, tmp_path, scripted_loss):
    """Stopped after step 5 (one validation without improvement), the resumed run stops after one more, at step 6."""
    run = tmp_path / "run"
    first = train(tiny_cfg(small_corpus, run, valid_every=1, patience=2, max_steps=5, keep_last=10))
    assert first["stop"] == "max_steps=5"
    scripted_loss(5)  # the resumed run's first validation is that of step 6
    summary = train(tiny_cfg(small_corpus, run, valid_every=1, patience=2, max_steps=10, keep_last=10))
    assert summary["stop"] == "no improvement in 2 validations" and summary["step"] == 6
    assert [r["best"] for r in valid_records(run)] == BEST_FLAGS[:6]
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == 4


def updates_by_epoch(run_dir) -> dict[int, list[float]]:
    """The target tokens of each update (log_every 1: one `train` record per update), by epoch."""
    tokens: dict[int, list[float]] = {}
    for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()):
        if r["event"] == "train":
            tokens.setdefault(r["epoch"], []).append(r["tokens_per_update"])
    return tokens


def target_tokens(corpus, run_dir, max_len: int = 64) -> int:
    """Target tokens of one pass over the training files: ids + EOS of each pair that the length filter keeps."""
    tokenizer = Tokenizer.load(run_dir)
    src = (corpus / "train.en").read_text(encoding="utf-8").splitlines()
    tgt = (corpus / "train.de").read_text(encoding="utf-8").splitlines()
    assert all(s.strip() and t.strip() for s, t in zip(src, tgt, strict=True))  # nothing for cleaning to drop
    return sum(len(t) + 1 for s, t in zip(tokenizer.encode_src(src), tokenizer.encode_tgt(tgt))
               if len(s) + 1 <= max_len and len(t) + 1 <= max_len)


def test_max_epochs_runs_whole_epochs_and_no_update_of_the_next(small_corpus, tmp_path):
    """Each epoch's updates train on every target token of the corpus once, the epoch's last smaller group
    included (accumulating 3 of the 14 batches of an epoch here), and none of epoch max_epochs runs. A run of 1 epoch resumed with
    max_epochs 2 ends where a run of 2 epochs from the start does, with the same weights."""
    one = train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=0, max_epochs=1, accumulate=3))
    total = target_tokens(small_corpus, tmp_path / "a")
    assert one["stop"] == "max_epochs=1" and one["epoch"] == 1
    assert {e: sum(t) for e, t in updates_by_epoch(tmp_path / "a").items()} == {0: total}
    two = train(tiny_cfg(small_corpus, tmp_path / "b", max_steps=0, max_epochs=2, accumulate=3))
    assert two["stop"] == "max_epochs=2" and two["epoch"] == 2
    updates = updates_by_epoch(tmp_path / "b")
    assert {e: sum(t) for e, t in updates.items()} == {0: total, 1: total}
    assert len(updates[0]) == one["step"] and two["step"] == len(updates[0]) + len(updates[1])
    resumed = train(tiny_cfg(small_corpus, tmp_path / "a", max_steps=0, max_epochs=2, accumulate=3))
    assert resumed["epoch"] == 2 and resumed["step"] == two["step"]
    assert updates_by_epoch(tmp_path / "a") == updates
    assert same_weights(weights(tmp_path / "a" / f"ckpt_{two['step']}.pt"),
                        weights(tmp_path / "b" / f"ckpt_{two['step']}.pt"))
    assert [p.name for p in periodic_checkpoints(tmp_path / "b")] == [f"ckpt_{two['step']}.pt"]


def test_each_log_line_counts_the_updates_it_averages_and_after_a_resume_fewer(small_corpus, tmp_path):
    """A resume starts a new window: its first line averages the updates since the resume, and says how many."""
    run = tmp_path / "run"
    train(tiny_cfg(small_corpus, run, max_steps=3, save_every=3, log_every=2))
    train(tiny_cfg(small_corpus, run, max_steps=6, save_every=3, log_every=2))
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text(encoding="utf-8").splitlines()]
    lines = [(r["step"], r["updates"]) for r in records if r["event"] == "train"]
    assert lines == [(1, 1), (2, 1), (4, 1), (6, 2)], lines


def test_a_run_resumed_with_another_early_stop_metric_picks_its_best_by_that_metric_alone(small_corpus, tmp_path,
                                                                                          caplog):
    """Two validations by the loss (about 5), then two by TER (about 100, lower is better): compared with the loss's
    best, no TER would ever be better, patience 2 would stop the run at step 4 and the plateau schedule (patience 0)
    would lower the rate at step 3. By TER alone, step 3's is the best so far, and step 4's only if it is lower."""
    run = tmp_path / "run"
    keys = dict(valid_every=1, keep_last=10, patience=2, schedule="plateau", plateau_patience=0)
    first = train(tiny_cfg(small_corpus, run, max_steps=2, early_stop_metric="loss", **keys))
    assert first["metric"] == "loss" and first["best_step"] == 2
    with caplog.at_level("WARNING", logger="nmt"):
        summary = train(tiny_cfg(small_corpus, run, max_steps=4, early_stop_metric="ter", valid_bleu=True, **keys))
    [warning] = [r.getMessage() for r in caplog.records if "early_stop_metric" in r.getMessage()]
    assert warning.startswith(f"{run / 'ckpt_2.pt'} picked its best checkpoint by loss, this config picks it by ter "
                              f"(train.early_stop_metric): their scores do not compare, so the best (loss "
                              f"{first['best_metric']:.4g} at step 2)")
    step3, step4 = valid_records(run)[2:]
    assert step3["ter"] > first["best_metric"]  # a TER that the loss's best would have hidden
    assert step3["best"] and step4["best"] == (step4["ter"] < step3["ter"])
    best = step4 if step4["best"] else step3
    assert summary["stop"] == "max_steps=4" and summary["metric"] == "ter"
    assert (summary["best_step"], summary["best_metric"]) == (best["step"], best["ter"])
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == best["step"]
    lr = {r["step"]: r["lr"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())
          if r["event"] == "train"}
    assert lr[4] == lr[3] == lr[2]  # the plateau schedule did not count step 3's TER as a worse loss


def test_a_run_resumed_with_another_bleu_tokenizer_picks_its_best_by_the_new_scores_alone(small_corpus, tmp_path,
                                                                                         caplog):
    """BLEU on characters (tok:char) runs higher than on words (tok:13a): compared with the char BLEU of the run's
    first validations, no 13a BLEU would be better, and best.pt would stay a checkpoint scored otherwise. This is
    what `eval.tokenize: auto` does to an en-zh run of 13a resumed: its BLEU is then zh's."""
    from nmt.config import config_from_dict
    from tests.train.helpers import tiny_raw

    run = tmp_path / "run"

    def cfg(tokenize: str, max_steps: int):
        raw = tiny_raw(small_corpus, run, max_steps=max_steps, valid_every=1, keep_last=10, valid_bleu=True)
        return config_from_dict({**raw, "eval": {"tokenize": tokenize, "metrics": ["bleu"]}})

    first = train(cfg("char", 2))
    with caplog.at_level("WARNING", logger="nmt"):
        summary = train(cfg("13a", 3))
    [warning] = [r.getMessage() for r in caplog.records if "do not compare" in r.getMessage()]
    assert warning.startswith(f"{run / 'ckpt_2.pt'} scored bleu with eval.tokenize 'char', now '13a': their scores "
                              f"do not compare, so the best (bleu {first['best_metric']:.4g} at step ")
    step3 = valid_records(run)[2]
    assert step3["bleu"] < first["best_metric"] and step3["best"]  # a 13a BLEU that char's best would have hidden
    assert (summary["best_step"], summary["best_metric"]) == (3, step3["bleu"])
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == 3


def test_a_run_resumed_on_another_validation_set_picks_its_best_by_that_set_alone(small_corpus, tmp_path, caplog):
    """Two validations by the loss on the run's own set (20 updates), then one on a set whose German side is spelled
    backwards, whose loss is far higher: compared with the first set's best, it would never be best. On its own set it
    is the first score, so the best."""
    run, other = tmp_path / "run", tmp_path / "other"
    other.mkdir()
    (other / "valid.en").write_bytes((small_corpus / "valid.en").read_bytes())
    german = (small_corpus / "valid.de").read_text(encoding="utf-8").splitlines()
    (other / "valid.de").write_text("\n".join(line[::-1] for line in german) + "\n", encoding="utf-8")
    keys = dict(valid_every=10, keep_last=10, early_stop_metric="loss")
    first = train(tiny_cfg(small_corpus, run, max_steps=20, **keys))
    moved = tiny_cfg(small_corpus, run, max_steps=21, **keys)
    moved = dataclasses.replace(moved, data=dataclasses.replace(
        moved.data, valid=dataclasses.replace(moved.data.valid, path=str(other / "valid"))))
    with caplog.at_level("WARNING", logger="nmt"):
        summary = train(moved)
    [warning] = [r.getMessage() for r in caplog.records if "do not compare" in r.getMessage()]
    assert warning.startswith(f"{run / 'ckpt_20.pt'} scored loss with data.valid.path {str(small_corpus / 'valid')!r}, "
                              f"now {str(other / 'valid')!r}: their scores do not compare")
    step21 = valid_records(run)[2]
    assert step21["loss"] > first["best_metric"] and step21["best"]  # a score the first set's best would have hidden
    assert summary["stop"] == "max_steps=21" and (summary["best_step"], summary["best_metric"]) == (21, step21["loss"])
    assert load_checkpoint(run / "best.pt")["progress"]["step"] == 21
