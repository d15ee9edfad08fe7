import json
import re

import pytest
import yaml
from typer.testing import CliRunner

from nmt.analysis import bleu_by_length, length_buckets, markdown_table
from nmt.cli import app
from nmt.errors import UserError
from nmt.evaluate import evaluate_checkpoint
from nmt.plot import bleu_by_length_figure, plot_bleu_by_length
from tests.conftest import tiny_config_dict


def test_buckets_are_equal_sized_and_ordered_by_length():
    sources = ["a " * n for n in [5, 1, 9, 3, 7, 2]]
    buckets = length_buckets(sources, 3)
    assert [sorted(b.tolist()) for b in buckets] == [[1, 5], [0, 3], [2, 4]]
    with pytest.raises(ValueError, match="n_buckets"):
        length_buckets(sources, 0)


def test_more_buckets_than_sentences_give_one_a_length_without_an_array_of_that_many():
    # `nmt analyze --buckets 99999999999` failed with "MemoryError: Unable to allocate 745. GiB" and exit 1.
    sources = ["a " * n for n in [5, 1, 9, 3, 7, 2, 5]]
    one_a_length = [[1], [5], [3], [0, 6], [4], [2]]
    for n in (6, 7, 100, 99_999_999_999):
        assert [sorted(b.tolist()) for b in length_buckets(sources, n)] == one_a_length


def test_bleu_by_length_scores_each_bucket_separately():
    sources = ["a b", "a b c", "a b c d e f g h", "a b c d e f g h i"]
    refs = ["the cat sat on the mat", "a dog ran in the park", "birds fly over the sea today", "it rains in the north now"]
    hyps = [refs[0], refs[1], "completely different words here", "nothing in common at all"]
    rows = bleu_by_length(sources, hyps, refs, n_buckets=2)
    assert [r["words"] for r in rows] == ["2-3", "8-9"]
    assert rows[0]["bleu"] == 100.0 and rows[1]["bleu"] < 5.0
    table = markdown_table({"m": rows})
    assert "| m | 100.0 |" in table


def test_sources_without_spaces_are_bucketed_by_their_characters():
    """Chinese and Japanese write no spaces: counted by spaces, every sentence was one word long and the
    whole test set one bucket. A Han character or a kana counts as a word; spaced scripts count as before."""
    han = "".join(chr(0x4E00 + 37 * i) for i in range(12))
    sources = [han[:n] + "\u3002" for n in (2, 3, 5, 6, 10, 11)]  # ideographs and a full stop
    sources += ["\u732b\u304c\u597d\u304d\u3067\u3059\u3002", "\u0645\u0631\u062d\u0628\u0627 \u0628\u0643"]
    refs = [f"reference {i}" for i in range(len(sources))]
    rows = bleu_by_length(sources, refs, refs, n_buckets=3)
    assert [(r["words"], r["sentences"]) for r in rows] == [("2-4", 3), ("6-7", 3), ("11-12", 2)]


def test_plot_writes_a_png(tmp_path):
    rows = [{"words": "1-3", "bleu": 50.0}, {"words": "4-9", "bleu": 30.0}]
    path = plot_bleu_by_length({"a": rows, "b": rows}, tmp_path / "sub" / "plot.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # the suffix names the format: `--plot b.svg` wrote PNG data into b.svg
    assert b"<svg" in plot_bleu_by_length({"a": rows}, tmp_path / "plot.svg").read_bytes()[:2000]
    assert plot_bleu_by_length({"a": rows}, tmp_path / "plot.PDF").read_bytes()[:5] == b"%PDF-"
    out = CliRunner().invoke(app, ["analyze", "-c", "m.pt", "--src", "s", "--ref", "r", "--plot",
                                   str(tmp_path / "plot.jpg")])
    assert isinstance(out.exception, UserError)
    assert str(out.exception) == (f"--plot {tmp_path / 'plot.jpg'}: its suffix names the format; give a file name "
                                  "ending in .png, .svg, .pdf")


def test_no_length_is_split_between_buckets():
    """Equal-sized buckets put 10-word sentences in three buckets by their order in the file ("10-10" three times),
    and labelled neighbours "3-8" and "8-16": each cut moves to the nearest place between two lengths."""
    sources = ["w " * n for n in [3, 5, 10, 10, 10, 10, 10, 10, 12, 14]]
    refs = [f"the reference number {i}" for i in range(10)]
    rows = bleu_by_length(sources, refs, refs, n_buckets=5)
    assert [(r["words"], r["sentences"]) for r in rows] == [("3-5", 2), ("10-10", 6), ("12-14", 2)]
    lengths = [len(s.split()) for s in sources]
    for n in range(1, 12):  # whatever the number asked: whole lengths, shortest first, every sentence once
        buckets = [[lengths[i] for i in b] for b in length_buckets(sources, n)]
        assert len(buckets) <= n and sorted(sum(buckets, [])) == sorted(lengths)
        assert all(max(a) < min(b) for a, b in zip(buckets, buckets[1:]))
    assert len(length_buckets(["a b"] * 4, 3)) == 1 and length_buckets([], 3) == []
    rows[1]["bleu"] = 50.0  # each bucket a point of its own on a category axis
    fig = bleu_by_length_figure({"a": rows, "b": rows})
    ax = fig.axes[0]
    assert [list(line.get_xdata()) for line in ax.lines] == [[0, 1, 2]] * 2
    assert list(ax.lines[0].get_ydata()) == [100.0, 50.0, 100.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["3-5", "10-10", "12-14"]
    head = markdown_table({"a": rows}).splitlines()[0]
    assert head == "| model | 3-5 words | 10-10 words | 12-14 words |"


@pytest.fixture(scope="module")
def ter_only(small_corpus, tmp_path_factory):
    """A tiny trained Transformer whose config scores TER alone (eval.metrics: [ter])."""
    tmp = tmp_path_factory.mktemp("ter_only")
    raw = tiny_config_dict(small_corpus, tmp / "run")
    raw["eval"] = {"metrics": ["ter"]}
    (tmp / "ter.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = CliRunner().invoke(app, ["train", str(tmp / "ter.yaml"), "--set", "train.max_steps=2"])
    assert out.exit_code == 0, out.output
    return tmp / "run" / "best.pt"


def test_analysis_scores_bleu_and_chrf_whatever_eval_metrics_says(ter_only, small_corpus, tmp_path):
    src, ref = small_corpus / "test.en", small_corpus / "test.de"
    out = CliRunner().invoke(app, ["analyze", "-c", f"m={ter_only}", "--src", str(src), "--ref", str(ref),
                                   "--beam", "1", "--buckets", "2", "--json"])
    assert out.exit_code == 0, out.output
    result = json.loads(out.stdout)
    expected = evaluate_checkpoint(ter_only, src=src, ref=ref, beam=1)[str(src)]
    assert set(expected) == {"ter", "ter_signature", "sentences", "beam"}  # eval scores what the config says
    overall = result["overall"]["m"]
    assert overall["ter"] == expected["ter"] and {"bleu", "chrf"} <= set(overall)  # analyze scores BLEU, chrF too
    assert [set(r) for r in result["by_length"]["m"]] == [{"words", "sentences", "bleu", "chrf"}] * 2
    out = CliRunner().invoke(app, ["analyze", "-c", f"m={ter_only}", "--src", str(src), "--ref", str(ref),
                                   "--beam", "1"])
    assert out.exit_code == 0 and out.stdout.startswith(f"{src}: overall m {overall['bleu']:.2f}"), out.output


def test_report_numbers_sentences_as_the_set_does_and_skips_an_empty_one(ter_only, small_corpus, tmp_path):
    src, ref = tmp_path / "set.en", tmp_path / "set.de"
    sources = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:3]
    src.write_text(f"{sources[0]}\n\n{sources[2]}\n", encoding="utf-8")  # sentence 1 is empty
    ref.write_text("".join((small_corpus / "test.de").read_text(encoding="utf-8").splitlines(True)[:3]))
    out = CliRunner().invoke(app, ["analyze", "-c", f"m={ter_only}", "--report", str(tmp_path / "report"),
                                   "--src", str(src), "--ref", str(ref), "--beam", "1", "--sentences", "2,1"])
    assert out.exit_code == 0, out.output
    text = (tmp_path / "report" / "analysis.md").read_text(encoding="utf-8")
    assert f"Sentence 2: *{sources[2]}*" in text and "Sentence 1 is empty: nothing to translate, no heatmap." in text
    assert text.index("Sentence 2:") < text.index("Sentence 1 is empty")  # in the order asked for
    assert "![m](analysis/attention_m_2.png)" in text
    assert sorted(p.name for p in (tmp_path / "report" / "analysis").glob("attention_*")) == ["attention_m_2.png"]

    # a number past the end of the set is refused, naming its size, before anything is translated or written
    out = CliRunner().invoke(app, ["analyze", "-c", f"m={ter_only}", "--report", str(tmp_path / "report2"),
                                   "--src", str(src), "--ref", str(ref), "--sentences", "0,3"])
    assert isinstance(out.exception, UserError)
    assert str(out.exception) == f"--sentences 3: {src} has 3 sentences, numbered 0 to 2; choose among those"
    assert not (tmp_path / "report2" / "analysis").exists()


def test_report_names_figures_of_any_model_name_by_a_plain_file_name(ter_only, small_corpus, tmp_path):
    """A name with '/' (`-c tf/small=...`) failed after translating, on a folder `attention_tf` that does not
    exist; one with a space wrote an image link markdown does not read as one."""
    src, ref = small_corpus / "test.en", small_corpus / "test.de"
    out = CliRunner().invoke(app, ["analyze", "-c", f"tf/small={ter_only}", "-c", f"my [best] model={ter_only}",
                                   "-c", f"plain={ter_only}", "--report", str(tmp_path / "report"), "--src", str(src),
                                   "--ref", str(ref), "--beam", "1", "--sentences", "2"])
    assert out.exit_code == 0, out.output
    text = (tmp_path / "report" / "analysis.md").read_text(encoding="utf-8")
    for alt, png in (("tf/small", "attention_model1_2.png"), ("my \\[best\\] model", "attention_model2_2.png"),
                     ("plain", "attention_plain_2.png")):
        assert f"![{alt}](analysis/{png})" in text
        assert (tmp_path / "report" / "analysis" / png).read_bytes()[:4] == b"\x89PNG"


def test_report_numbers_a_config_set_s_sentences_by_its_lines(small_corpus, tmp_path):
    """A config's test set leaves out a pair with an empty side; `--sentences` still counts the set's lines, so
    sentence 2 is its third line (it was the fourth: the numbers counted the pairs scored)."""
    sources = (small_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:4]
    targets = (small_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:4]
    sources[1] = " "
    for lang, lines in (("en", sources), ("de", targets)):
        (tmp_path / f"gaps.{lang}").write_text("\n".join(lines) + "\n", encoding="utf-8")
    raw = tiny_config_dict(small_corpus, tmp_path / "run")
    raw["data"]["test"] = {"gaps": {"kind": "text", "path": str(tmp_path / "gaps")}}
    (tmp_path / "gaps.yaml").write_text(yaml.safe_dump(raw), encoding="utf-8")
    out = CliRunner().invoke(app, ["train", str(tmp_path / "gaps.yaml"), "--set", "train.max_steps=2",
                                   "--set", "train.valid_bleu=false"])
    assert out.exit_code == 0, out.output
    out = CliRunner().invoke(app, ["analyze", "-c", f"m={tmp_path / 'run' / 'best.pt'}", "--report",
                                   str(tmp_path / "report"), "--beam", "1", "--sentences", "2,1,3"])
    assert out.exit_code == 0, out.output
    text = (tmp_path / "report" / "analysis.md").read_text(encoding="utf-8")
    assert f"Sentence 2: *{sources[2]}*" in text and f"Sentence 3: *{sources[3]}*" in text
    assert "Sentence 1 has an empty side, so it is not scored, no heatmap." in text
    names = sorted(p.name for p in (tmp_path / "report" / "analysis").glob("attention_*"))
    assert names == ["attention_m_2.png", "attention_m_3.png"]


def test_report_scores_plots_and_heatmaps_every_model(small_corpus, tmp_path):
    runner = CliRunner()
    ckpts = {}
    for name, model_type in [("tr", "transformer"), ("noattn", "rnn")]:
        raw = tiny_config_dict(small_corpus, tmp_path / name, model_type)
        raw["model"]["rnn"]["decoder"] = "none"
        cfg = tmp_path / f"{name}.yaml"
        cfg.write_text(yaml.safe_dump(raw), encoding="utf-8")
        assert runner.invoke(app, ["train", str(cfg), "--set", "train.max_steps=3"]).exit_code == 0
        ckpts[name] = tmp_path / name / "best.pt"

    out = runner.invoke(app, ["analyze", "-c", f"tr={ckpts['tr']}", "-c", f"noattn={ckpts['noattn']}",
                              "--report", str(tmp_path / "report"), "--sentences", "0,2", "--beam", "1"])
    assert out.exit_code == 0, out.output
    report = tmp_path / "report" / "analysis.md"
    text = report.read_text(encoding="utf-8")
    expected = evaluate_checkpoint(ckpts["tr"], split="test", beam=1)["test"]
    assert f"| tr | {expected['bleu']:.2f} | {expected['chrf']:.2f} |" in text
    assert text.count("(no attention: one fixed context vector)") == 2  # one per chosen sentence
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", text)
    assert "analysis/bleu_by_length.png" in images and "analysis/attention_tr_2.png" in images  # its own number
    for image in images:
        assert (report.parent / image).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # --src/--ref choose the set of the report too (not the config's test set), and the heatmap sentences come from it
    src, ref = tmp_path / "other.en", tmp_path / "other.de"
    src.write_text("".join((small_corpus / "valid.en").read_text(encoding="utf-8").splitlines(True)[:12]))
    ref.write_text("".join((small_corpus / "valid.de").read_text(encoding="utf-8").splitlines(True)[:12]))
    out = runner.invoke(app, ["analyze", "-c", f"tr={ckpts['tr']}", "--report", str(tmp_path / "report2"),
                              "--src", str(src), "--ref", str(ref), "--beam", "1"])
    assert out.exit_code == 0, out.output
    text = (tmp_path / "report2" / "analysis.md").read_text(encoding="utf-8")
    on_files = evaluate_checkpoint(ckpts["tr"], src=src, ref=ref, beam=1)[str(src)]
    assert f"Test set `{src}`" in text and f"| tr | {on_files['bleu']:.2f} | {on_files['chrf']:.2f} |" in text
    first = src.read_text(encoding="utf-8").splitlines()[0]
    assert f"Sentence 0: *{first}*" in text

    # --plot into a folder not yet made: the plot makes it
    out = runner.invoke(app, ["analyze", "-c", f"tr={ckpts['tr']}", "--plot", str(tmp_path / "new" / "bleu.png"),
                              "--src", str(src), "--ref", str(ref), "--beam", "1"])
    assert out.exit_code == 0, out.output
    assert (tmp_path / "new" / "bleu.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_checkpoints_with_clashing_names_are_refused_not_dropped():
    from nmt.analysis import name_checkpoints
    from nmt.errors import UserError

    assert name_checkpoints(["runs/a/best.pt", "b=runs/a/averaged.pt"]) == {"a": "runs/a/best.pt",
                                                                            "b": "runs/a/averaged.pt"}
    with pytest.raises(UserError, match=r"two checkpoints are named 'a' \(runs/a/best.pt and runs/a/averaged.pt\); "
                                        r"name them, e.g. -c a-a=runs/a/best.pt -c a-b=runs/a/averaged.pt"):
        name_checkpoints(["runs/a/best.pt", "runs/a/averaged.pt"])
    for spec in ("=runs/a/best.pt", "a="):  # an empty name, or no checkpoint
        with pytest.raises(UserError, match=f"-c {spec}: give NAME=CKPT with a name and a checkpoint"):
            name_checkpoints([spec])


def test_a_bleu_tokenizer_missing_here_stops_analyze_before_any_translation(ter_only, small_corpus, monkeypatch,
                                                                             caplog):
    """A Japanese model trained where MeCab is installed (eval.tokenize ja-mecab), analyzed where it is not: one
    line naming the model and what to install, before the first model translates the set, not after."""
    from sacrebleu.tokenizers import tokenizer_ja_mecab

    from nmt.analysis import analyze
    from nmt.translate import Translator

    monkeypatch.setattr(tokenizer_ja_mecab, "MeCab", None)  # as where sacrebleu[ja] is not installed
    first, japanese = Translator.from_checkpoint(ter_only), Translator.from_checkpoint(ter_only)
    japanese.cfg.eval.tokenize = "ja-mecab"  # as its checkpoint holds it
    with caplog.at_level("INFO", logger="nmt"), pytest.raises(UserError) as err:
        analyze({"first": first, "ja": japanese}, src=small_corpus / "test.en", ref=small_corpus / "test.de")
    assert str(err.value).startswith("ja: eval.tokenize 'ja-mecab': Japanese tokenization requires extra dependencies")
    assert not [r for r in caplog.records if "translating" in r.getMessage()]
