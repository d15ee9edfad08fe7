"""Scoring: BLEU and chrF against hand-computed values, reading hypothesis files, choosing test sets."""

from __future__ import annotations

import gzip
import math

import pytest
import yaml
from sacrebleu.metrics import BLEU

from nmt.config import EvalConfig, load_config
from nmt.data.eval_sets import EvalSet, eval_sets
from nmt.data.text import read_lines
from nmt.errors import DataError, UserError
from nmt.evaluate import score_files
from nmt.metrics import score
from tests.conftest import tiny_config_dict


def test_bleu_matches_a_hand_computation():
    # one sentence of six tokens, the last one wrong: n-gram precisions 5/6, 4/5, 3/4, 2/3, equal lengths (BP = 1)
    s = score(["a b c d e f"], ["a b c d e g"])
    expected = 100 * math.exp(sum(math.log(p) for p in (5 / 6, 4 / 5, 3 / 4, 2 / 3)) / 4)
    assert s["bleu"] == pytest.approx(expected, abs=0.01)
    # a hypothesis half the reference's length: brevity penalty exp(1 - 12/6) on perfect precisions
    assert score(["a b c d e f"], ["a b c d e f g h i j k l"])["bleu"] == pytest.approx(100 * math.exp(1 - 2), abs=0.01)


def test_identical_and_disjoint_text():
    refs = ["A man rides a bike.", "Two dogs play in the snow."]
    same = score(refs, refs)
    assert same["bleu"] == 100.0 and same["chrf"] == 100.0 and same["sentences"] == 2
    assert score(["xyz qqq", "vvv www"], refs)["bleu"] == 0.0


def test_case_and_tokenizer_follow_the_eval_config():
    hyp, ref = ["A B C D E F"], ["a b c d e f"]
    assert score(hyp, ref)["bleu"] == 0.0
    lower = score(hyp, ref, EvalConfig(lowercase=True))
    assert lower["bleu"] == 100.0 and "case:lc" in lower["bleu_signature"]
    assert "tok:13a" in score(hyp, ref)["bleu_signature"]
    assert "tok:char" in score(hyp, ref, EvalConfig(tokenize="char"))["bleu_signature"]


def test_unpaired_lists_are_refused():
    with pytest.raises(UserError, match="2 hypotheses but 1 references"):
        score(["a", "b"], ["a"])


def test_files_plain_gzip_bom_and_crlf(tmp_path):
    hyp = tmp_path / "hyp.txt"
    hyp.write_bytes("\ufeffEin Mann fährt Rad.\r\nZwei Hunde spielen.\r\n".encode())
    ref = tmp_path / "ref.de.gz"
    with gzip.open(ref, "wt", encoding="utf-8") as f:
        f.write("Ein Mann fährt Rad.\nZwei Hunde spielen.\n")
    assert read_lines(hyp) == ["Ein Mann fährt Rad.", "Zwei Hunde spielen."] == read_lines(ref)
    assert score_files(hyp, ref)["bleu"] == 100.0


def test_file_errors_name_the_file_and_line(tmp_path):
    good = tmp_path / "good.txt"
    good.write_text("one\ntwo\nthree\n", encoding="utf-8")
    short = tmp_path / "short.txt"
    short.write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"short.txt has 2 lines but .*good.txt has 3"):
        score_files(short, good)
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"fine\nfine\n\xff broken\n")
    with pytest.raises(DataError, match=r"bad.txt:3: invalid UTF-8 at byte 0"):
        read_lines(bad)
    with pytest.raises(DataError, match="nope.txt: file not found"):
        read_lines(tmp_path / "nope.txt")


def test_a_damaged_or_truncated_gzip_file_is_named(tmp_path):
    """A damaged deflate stream raises zlib's error, a truncated one EOFError: both name the file."""
    packed = gzip.compress("".join(f"line {i} {i * 7919 % 1000}\n" for i in range(5000)).encode())
    damaged, truncated = tmp_path / "damaged.de.gz", tmp_path / "truncated.de.gz"
    damaged.write_bytes(packed[:200] + bytes(b ^ 0xFF for b in packed[200:260]) + packed[260:])
    truncated.write_bytes(packed[: len(packed) // 2])
    for path in (damaged, truncated):
        with pytest.raises(DataError, match=rf"{path.name}: cannot read: "):
            read_lines(path)


@pytest.fixture
def two_test_sets(small_corpus, tmp_path):
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["test"] = {"first": {"kind": "text", "path": str(small_corpus / "test")},
                           "second": {"kind": "text", "path": str(small_corpus / "valid")}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return load_config(path)


def test_eval_sets_choose_by_split(two_test_sets, small_corpus):
    cfg = two_test_sets
    assert list(eval_sets(cfg)) == ["first", "second"]  # default: every test set
    second = eval_sets(cfg, split="second")["second"]
    assert second.sources == read_lines(small_corpus / "valid.en")
    assert second.references == read_lines(small_corpus / "valid.de")
    assert len(eval_sets(cfg, split="valid")["valid"].sources) == 30
    with pytest.raises(UserError, match=r"--split 'third'.*choose from valid, test, first, second"):
        eval_sets(cfg, split="third")


def test_eval_sets_from_files_instead(two_test_sets, small_corpus):
    src, ref = small_corpus / "test.en", small_corpus / "test.de"
    assert eval_sets(two_test_sets, src=src, ref=ref) == {str(src): EvalSet(read_lines(src), read_lines(ref),
                                                                            list(range(30)), 30)}
    with pytest.raises(UserError, match="--src and --ref go together"):
        eval_sets(two_test_sets, src=src)


def test_ready_translations_score_against_several_references_through_the_cli(tmp_path):
    """`--ref` given twice scored against the last alone, silently; each is a reference of every line now."""
    from typer.testing import CliRunner

    from nmt.cli import app

    hyp, first, second = tmp_path / "hyp", tmp_path / "r1", tmp_path / "r2"
    hyp.write_text("the cat sat on the mat\nhello world\n", encoding="utf-8")
    first.write_text("the cat is on the mat\nhello there world\n", encoding="utf-8")
    second.write_text("a cat sat on the mat\nhello world\n", encoding="utf-8")
    runner = CliRunner()
    result = runner.invoke(app, ["eval", "--hyp", str(hyp), "--ref", str(first), "--ref", str(second), "--json"])
    assert result.exit_code == 0, result.output
    both = __import__("json").loads(result.stdout)[str(hyp)]
    lines = [read_lines(first), read_lines(second)]
    assert both["bleu"] == round(BLEU().corpus_score(read_lines(hyp), lines).score, 2)
    assert both == score_files(hyp, [first, second]) != score_files(hyp, second)
    short = tmp_path / "short"
    short.write_text("one line\n", encoding="utf-8")
    result = runner.invoke(app, ["eval", "--hyp", str(hyp), "--ref", str(first), "--ref", str(short)])
    assert isinstance(result.exception, DataError)
    assert str(result.exception) == (f"{hyp} has 2 lines but {short} has 1: translations and references must pair "
                                     "line by line")


def test_eval_of_empty_source_and_reference_files_names_them_before_the_model_loads(tmp_path):
    """It loaded the model, translated nothing and then failed with a message that named no file."""
    from nmt.evaluate import evaluate_checkpoint

    src, ref = tmp_path / "src.en", tmp_path / "ref.de"
    src.write_bytes(b"\xef\xbb\xbf")  # a byte-order mark alone: no line
    ref.write_bytes(b"")
    with pytest.raises(DataError) as err:
        evaluate_checkpoint(tmp_path / "absent.pt", src=src, ref=ref)  # a missing checkpoint is never reached
    assert str(err.value) == f"{src} and {ref}: both empty, nothing to score"


def test_eval_saves_the_translations_it_scored(small_corpus, tmp_path):
    """`nmt eval -c CKPT --save-translations DIR` keeps what it scored: the files score the same with --hyp."""
    from typer.testing import CliRunner

    from nmt.cli import app
    from nmt.train.loop import train

    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["train"].update({"max_steps": 2, "valid_bleu": False})
    raw["data"]["test"]["news/2016"] = dict(raw["data"]["valid"])  # a name with a slash makes one file, news_2016.hyp
    train(load_config(_write(tmp_path, raw)))
    runner = CliRunner()
    out = tmp_path / "hyps"
    result = runner.invoke(app, ["eval", "-c", str(tmp_path / "run" / "best.pt"), "--split", "test", "--json",
                                 "--save-translations", str(out)])
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in out.iterdir()) == ["news_2016.hyp", "test.hyp"]
    scores_of_test = __import__("json").loads(result.stdout)["test"]
    for name, file, ref, lines in (("test", "test.hyp", "test.de", 30), ("news/2016", "news_2016.hyp", "valid.de", 30)):
        scores = __import__("json").loads(result.stdout)[name]
        hyps = (out / file).read_text(encoding="utf-8").splitlines()
        assert len(hyps) == scores["sentences"] == lines
        again = score_files(out / file, small_corpus / ref)
        assert {k: again[k] for k in ("bleu", "chrf", "ter")} == {k: scores[k] for k in ("bleu", "chrf", "ter")}
    result = runner.invoke(app, ["eval", "-c", str(tmp_path / "run" / "best.pt"), "--split", "test", "--json",
                                 "--tokenize", "char"])  # the checkpoint's eval.tokenize (13a) replaced
    chars = __import__("json").loads(result.stdout)["test"]
    assert "tok:char" in chars["bleu_signature"]
    assert chars["bleu"] == score_files(out / "test.hyp", small_corpus / "test.de", EvalConfig(tokenize="char"))["bleu"]
    result = runner.invoke(app, ["eval", "-c", str(tmp_path / "run" / "best.pt"), "--split", "test", "--json",
                                 "--metrics", "ter"])  # the checkpoint's eval.metrics (all three) replaced
    ter_only = __import__("json").loads(result.stdout)["test"]
    assert ter_only == {"ter": scores_of_test["ter"], "ter_signature": scores_of_test["ter_signature"],
                        "sentences": 30, "beam": scores_of_test["beam"]}
    # several references of each line, as sacreBLEU's -r REF1 REF2 scores them
    result = runner.invoke(app, ["eval", "-c", str(tmp_path / "run" / "best.pt"), "--json", "--src",
                                 str(small_corpus / "test.en"), "--ref", str(small_corpus / "test.de"), "--ref",
                                 str(small_corpus / "valid.de"), "--save-translations", str(tmp_path / "two")])
    assert result.exit_code == 0, result.output
    two = __import__("json").loads(result.stdout)[str(small_corpus / "test.en")]
    hyps = read_lines(tmp_path / "two" / "test.en.hyp")
    refs = [read_lines(small_corpus / "test.de"), read_lines(small_corpus / "valid.de")]
    assert two["bleu"] == round(BLEU().corpus_score(hyps, refs).score, 2) and "nrefs:2" in two["bleu_signature"]
    assert two == score_files(tmp_path / "two" / "test.en.hyp", [small_corpus / "test.de", small_corpus / "valid.de"]) \
        | {"beam": two["beam"]}
    # an eval that fails makes no folder
    result = runner.invoke(app, ["eval", "-c", str(tmp_path / "run" / "best.pt"), "--split", "nope",
                                 "--save-translations", str(tmp_path / "never")])
    assert isinstance(result.exception, UserError) and not (tmp_path / "never").exists()


def test_saved_translations_keep_a_line_for_each_pair_left_unscored(small_corpus, tmp_path, caplog):
    """A test-set pair with an empty side is not scored, and its line in DIR/<set>.hyp is empty: the file has
    one line per line of the set's files, so it pairs line by line with them (it had one line fewer per such
    pair, each later translation beside the wrong source)."""
    from typer.testing import CliRunner

    from nmt.cli import app
    from nmt.train.loop import train
    from nmt.translate import Translator

    src = read_lines(small_corpus / "test.en")[:6]
    ref = read_lines(small_corpus / "test.de")[:6]
    src[1], ref[3] = "", " \t "  # an empty source, a reference of whitespace alone
    for lang, lines in (("en", src), ("de", ref)):
        (tmp_path / f"gaps.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["train"].update({"max_steps": 2, "valid_bleu": False})
    raw["data"]["test"] = {"gaps": {"kind": "text", "path": str(tmp_path / "gaps")}}
    train(load_config(_write(tmp_path, raw)))
    out = tmp_path / "hyps"
    result = CliRunner().invoke(app, ["eval", "-c", str(tmp_path / "run" / "best.pt"), "--json",
                                      "--save-translations", str(out)])
    assert result.exit_code == 0, result.output
    assert __import__("json").loads(result.stdout)["gaps"]["sentences"] == 4
    hyps = (out / "gaps.hyp").read_text(encoding="utf-8").split("\n")
    kept = [0, 2, 4, 5]
    expected = Translator.from_checkpoint(tmp_path / "run" / "best.pt").translate([src[i] for i in kept])
    assert len(hyps) == 7 and hyps[-1] == ""  # six lines, each ended by '\n'
    assert [hyps[i] for i in kept] == expected and hyps[1] == hyps[3] == ""
    assert "data.test.gaps" in caplog.text and "2 of its 6 pairs have an empty side" in caplog.text
    assert "(pairs 2, 4, counting from 1); its saved translations hold an empty line for each" in caplog.text


def _write(tmp_path, raw) -> str:
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(raw), encoding="utf-8")
    return str(path)


def test_eval_reports_the_metrics_given_and_refuses_others(tmp_path):
    """`--metrics` chooses among the text metrics, as sacreBLEU's `-m` does; with --hyp there was no way to leave
    one out (TER takes minutes on long lines)."""
    from typer.testing import CliRunner

    from nmt.cli import app

    hyps, refs = ["the cat sat on the mat .", "a dog runs ."], ["the cat sat on a mat .", "a dog is running ."]
    (tmp_path / "hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    files = ["eval", "--hyp", str(tmp_path / "hyp.txt"), "--ref", str(tmp_path / "ref.txt"), "--json"]
    result = CliRunner().invoke(app, files + ["--metrics", "chrf, BLEU,chrf"])
    assert result.exit_code == 0, result.output
    scores = __import__("json").loads(result.stdout)[str(tmp_path / "hyp.txt")]
    assert list(scores) == ["chrf", "chrf_signature", "bleu", "bleu_signature", "sentences"]
    assert scores["bleu"] == round(BLEU().corpus_score(hyps, [refs]).score, 2)
    for given, why in (("bleu,meteor", "'meteor' is not a metric nmt eval reports"), (",", "no metric named")):
        result = CliRunner().invoke(app, files + ["--metrics", given])
        assert isinstance(result.exception, UserError)
        assert str(result.exception) == f"--metrics {given!r}: {why}; give some of bleu,chrf,ter, separated by commas"


def test_ter_says_which_line_will_make_it_slow_once_a_process(caplog, monkeypatch):
    """One pair of 3,000-word lines held TER for 80 s without a word: the line and the way to leave TER out are
    named before it starts, once, as a training run validates on the same lines again and again."""
    from nmt import metrics

    monkeypatch.setattr(metrics, "_warned_of_slow_ter", False)
    short = ["a b c ."] * 3
    long = " ".join(f"w{i % 40}" for i in range(metrics.TER_SLOW_WORDS + 1))
    with caplog.at_level("WARNING", logger="nmt.metrics"):
        score(short, short)  # short lines: nothing to say
        assert caplog.messages == []
        score(short + [long], short + [long])
        score(short + [long], short + [long])
        assert score(short, short, EvalConfig(metrics=["bleu"]))["bleu"] == 100.0
    assert caplog.messages == [f"TER: line 4 has {metrics.TER_SLOW_WORDS + 1:,} words, and sacreBLEU's TER slows down "
                               "steeply beyond 1,000 words a line (seconds to minutes a line); to leave it out, give "
                               "nmt eval --metrics bleu,chrf, or set eval.metrics"]


def test_eval_of_ready_translations_takes_the_tokenizer_given(tmp_path, monkeypatch):
    """`nmt eval --hyp --ref` scored BLEU with 13a whatever the language: Chinese, a sentence a word, scored 0."""
    from typer.testing import CliRunner

    from nmt.cli import app

    han = [chr(0x4E00 + 97 * i) for i in range(200)]
    refs = ["".join(han[(7 * n + i) % 200] for i in range(12)) + "\u3002" for n in range(20)]
    (tmp_path / "ref.zh").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    (tmp_path / "hyp.zh").write_text("".join(r[:5] + "\u4e86" + r[6:] + "\n" for r in refs), encoding="utf-8")
    runner = CliRunner()
    files = ["eval", "--hyp", str(tmp_path / "hyp.zh"), "--ref", str(tmp_path / "ref.zh"), "--json"]
    plain, chinese = (__import__("json").loads(runner.invoke(app, files + extra).stdout)[str(tmp_path / "hyp.zh")]
                      for extra in ([], ["--tokenize", "zh"]))
    assert plain["bleu"] < 1 and "tok:13a" in plain["bleu_signature"]
    assert chinese["bleu"] > 50 and "tok:zh" in chinese["bleu_signature"] and chinese["chrf"] == plain["chrf"]
    result = runner.invoke(app, files + ["--tokenize", "13b"])
    assert isinstance(result.exception, UserError)
    assert str(result.exception) == "--tokenize '13b': not a BLEU tokenizer; choose one of 13a, intl, zh, ja-mecab, char, none"
    from sacrebleu.tokenizers import tokenizer_ja_mecab

    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    result = runner.invoke(app, files + ["--tokenize", "ja-mecab"])
    assert isinstance(result.exception, UserError)
    assert str(result.exception).startswith("--tokenize ja-mecab: Japanese tokenization requires extra dependencies")
