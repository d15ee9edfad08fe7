"""The metric table: TER against a hand count, directions, and every consumer reading the table."""

from __future__ import annotations

import json
import logging

import pytest
from sacrebleu.metrics.base import Metric as SacreMetric

from nmt import metrics
from nmt.config import EvalConfig, config_from_dict
from nmt.errors import ConfigError, UserError
from nmt.metrics import METRICS, TEXT_METRICS, format_scores, score
from nmt.train.loop import train
from tests.conftest import TOY, tiny_config_dict


def test_ter_counts_edits_per_reference_word():
    # one substitution in four reference words; then one deletion of five
    assert score(["a b c d"], ["a b c e"])["ter"] == 25.0
    assert score(["a b c d"], ["a b c d e"])["ter"] == 20.0
    assert score(["a b c d"], ["a b c d"])["ter"] == 0.0


def _toy_pairs(n: int) -> tuple[list[str], list[str]]:
    """`n` references of the toy test set and, as hypotheses, each with its last two words swapped."""
    refs = (TOY / "test.de").read_text(encoding="utf-8").splitlines()[:n]
    hyps = [" ".join([*r.split()[:-2], *reversed(r.split()[-2:])]) for r in refs]
    return hyps, refs


def test_a_large_set_is_scored_a_chunk_of_references_at_a_time_to_sacrebleus_scores(monkeypatch):
    """sacreBLEU analyses every reference before it scores (1.6 GB of chrF n-grams for 50,000 lines): `score`
    hands it `SCORE_CHUNK` at a time and sums the sentences' statistics, to the very scores of one call."""
    monkeypatch.setattr(metrics, "SCORE_CHUNK", 40)
    analysed = []
    whole = SacreMetric._cache_references

    def counted(self, references):
        analysed.append(len(references[0]))
        return whole(self, references)

    hyps, refs = _toy_pairs(230)
    expected = {name: round(METRICS[name].scorer("13a", False).corpus_score(hyps, [refs]).score, 2)
                for name in TEXT_METRICS}
    monkeypatch.setattr(SacreMetric, "_cache_references", counted)
    scores = score(hyps, refs)
    assert {name: scores[name] for name in TEXT_METRICS} == expected
    assert 0 < expected["bleu"] < 100 and scores["sentences"] == 230
    assert analysed == ([40] * 5 + [30]) * 3  # for each metric: five full chunks, then the last 30 references


def test_several_references_of_each_line_score_as_sacrebleus_one_call_in_chunks(monkeypatch):
    """A second reference that is the hypothesis itself on every third line: each metric scores as sacreBLEU's
    `corpus_score(hyps, [refs, second])`, chunks or not, higher than against the first reference alone."""
    monkeypatch.setattr(metrics, "SCORE_CHUNK", 40)
    hyps, refs = _toy_pairs(230)
    second = [h if i % 3 == 0 else r for i, (h, r) in enumerate(zip(hyps, refs))]
    scores, one = score(hyps, refs, more_refs=[second]), score(hyps, refs)
    for name in TEXT_METRICS:
        scorer = METRICS[name].scorer("13a", False)
        assert scores[name] == round(scorer.corpus_score(hyps, [refs, second]).score, 2)
        assert "nrefs:2" in scores[f"{name}_signature"] and "nrefs:1" in one[f"{name}_signature"]
    assert scores["bleu"] > one["bleu"] and scores["chrf"] > one["chrf"] and scores["ter"] < one["ter"]
    with pytest.raises(UserError, match="230 hypotheses but 229 references"):
        score(hyps, refs, more_refs=[second[:-1]])


def test_a_sacrebleu_without_the_steps_of_corpus_score_scores_the_whole_set_in_one_call():
    """The chunks use two of sacreBLEU 2.x's own methods; a scorer without them still scores, in one call."""

    class OneCall:  # a sacreBLEU scorer that shows only its public corpus_score
        def __init__(self, scorer):
            self.corpus_score = scorer.corpus_score

    hyps, refs = _toy_pairs(120)
    for name in TEXT_METRICS:
        scorer = METRICS[name].scorer("13a", False)
        assert metrics.corpus_score(OneCall(scorer), hyps, [refs]).score == scorer.corpus_score(hyps, [refs]).score


def test_sacrebleus_warning_about_the_text_comes_once_however_many_chunks(monkeypatch, caplog):
    monkeypatch.setattr(metrics, "SCORE_CHUNK", 100)
    refs = ["a man rides a bike ."] * 300  # tokenized: each line ends in " ."
    with caplog.at_level(logging.WARNING, logger="sacrebleu"):
        assert score(refs, refs, config_from_dict({"eval": {"metrics": ["bleu"]}}).eval)["bleu"] == 100.0
    assert [r.getMessage() for r in caplog.records].count("That's 100 lines that end in a tokenized period ('.')") == 1
    assert logging.getLogger("sacrebleu").filters == []  # left as it was


def test_directions_and_better():
    assert METRICS["bleu"].better(30.0, 29.0) and not METRICS["bleu"].better(29.0, 30.0)
    assert METRICS["ter"].better(40.0, 41.0) and not METRICS["ter"].better(41.0, 40.0)
    assert METRICS["loss"].better(2.0, 3.0) and METRICS["loss"].better(5.0, None)
    assert set(TEXT_METRICS) == {"bleu", "chrf", "ter"} and METRICS["loss"].scorer is None


def test_the_config_takes_its_metric_names_from_the_table():
    cfg = config_from_dict({"train": {"early_stop_metric": "ter"}, "eval": {"metrics": ["chrf"]}})
    assert cfg.train.early_stop_metric == "ter" and cfg.eval.metrics == ["chrf"]
    with pytest.raises(ConfigError, match=r"eval.metrics\[0\]: 'loss' is not one of 'bleu', 'chrf', 'ter'"):
        config_from_dict({"eval": {"metrics": ["loss"]}})
    with pytest.raises(ConfigError, match="train.early_stop_metric: 'meteor' is not one of"):
        config_from_dict({"train": {"early_stop_metric": "meteor"}})


def test_only_the_configured_metrics_are_scored_and_printed():
    cfg = config_from_dict({"eval": {"metrics": ["ter"]}}).eval
    s = score(["a b c d"], ["a b c e"], cfg)
    assert set(s) == {"ter", "ter_signature", "sentences"}
    assert format_scores("set", s).splitlines() == ["set: TER = 25.00  (1 sentence)", f"  TER: {s['ter_signature']}"]


def test_each_signature_line_names_its_metric():
    """Three signature lines under the scores, with nothing to tell BLEU's from chrF's or TER's."""
    s = score(["a b c d"], ["a b c e"], config_from_dict({"eval": {"metrics": ["bleu", "chrf", "ter"]}}).eval)
    assert format_scores("set", s).splitlines()[1:] == [
        f"  BLEU: {s['bleu_signature']}", f"  chrF: {s['chrf_signature']}", f"  TER:  {s['ter_signature']}"]


def test_early_stopping_on_ter_keeps_the_lowest(small_corpus, tmp_path):
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["train"].update({"early_stop_metric": "ter", "valid_every": 2, "max_steps": 6})
    raw["eval"] = {"metrics": ["bleu"]}  # validation scores the early-stopping metric besides these
    summary = train(config_from_dict(raw))
    valid = [r for r in map(json.loads, (tmp_path / "run" / "metrics.jsonl").read_text().splitlines())
             if r["event"] == "valid"]
    assert summary["metric"] == "ter" and all({"bleu", "ter"} <= set(r) for r in valid)
    assert summary["best_metric"] == min(r["ter"] for r in valid)
    best_so_far = [r["ter"] < min([v["ter"] for v in valid[:i]], default=float("inf")) for i, r in enumerate(valid)]
    assert [r["best"] for r in valid] == best_so_far


def test_a_tokenizer_this_machine_cannot_build_is_one_line_naming_the_key(monkeypatch):
    """What `nmt analyze` of a ja-mecab checkpoint meets where MeCab is missing: not sacreBLEU's RuntimeError."""
    from sacrebleu.tokenizers import tokenizer_ja_mecab

    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    settings = EvalConfig(tokenize="ja-mecab", metrics=["chrf", "bleu"])
    with pytest.raises(UserError, match=r"^eval.tokenize 'ja-mecab': Japanese tokenization requires extra "
                                        r"dependencies.*pip install 'sacrebleu\[ja\]', or choose another tokenizer$"):
        score(["ein Hund"], ["ein Hund"], settings)


def test_ter_of_chinese_and_japanese_counts_edits_per_character():
    """TER splits at spaces: a sentence of Chinese was one word, so one wrong character in each made TER 100.
    With the BLEU tokenizer of a language written without spaces, it splits their characters (sacreBLEU's asian
    support); other tokenizers keep plain TER."""
    han = [chr(0x4E00 + 97 * i) for i in range(200)]
    refs = ["".join(han[(7 * n + i) % 200] for i in range(10)) + "\u3002" for n in range(20)]
    hyps = [ref[:5] + "\u4e86" + ref[6:] for ref in refs]  # one ideograph of ten wrong
    chinese = score(hyps, refs, EvalConfig(tokenize="zh", metrics=["ter"]))
    assert chinese["ter"] == round(100 / 11, 2) and "asian:yes" in chinese["ter_signature"]
    assert score(hyps, refs, EvalConfig(tokenize="13a", metrics=["ter"]))["ter"] == 100.0
    german = score(["der Hund, der bellt"], ["der Hund, der schläft"], EvalConfig(tokenize="intl", metrics=["ter"]))
    assert german["ter"] == 25.0 and "norm:no|punct:yes|asian:no" in german["ter_signature"]
