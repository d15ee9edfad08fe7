import re

import pytest
import yaml
from typer.testing import CliRunner

from nmt.analysis import bleu_by_length, length_buckets, markdown_table
from nmt.cli import app
from nmt.evaluate import evaluate_checkpoint
from nmt.plot import plot_bleu_by_length
from tests.conftest import tiny_config_dict


def test_buckets_are_equal_sized_and_ordered_by_length():
    sources = ["a " * n for n in [5, 1, 9, 3, 7, 2]]
    buckets = length_buckets(sources, 3)
    assert [sorted(b.tolist()) for b in buckets] == [[1, 5], [0, 3], [2, 4]]
    with pytest.raises(ValueError, match="n_buckets"):
        length_buckets(sources, 0)


def test_bleu_by_length_scores_each_bucket_separately():
    sources = ["a b", "a b c", "a b c d e f g h", "a b c d e f g h i"]
    refs = ["the cat sat on the mat", "a dog ran in the park", "birds fly over the sea today", "it rains in the north now"]
    hyps = [refs[0], refs[1], "completely different words here", "nothing in common at all"]
    rows = bleu_by_length(sources, hyps, refs, n_buckets=2)
    assert [r["words"] for r in rows] == ["2-3", "8-9"]
    assert rows[0]["bleu"] == 100.0 and rows[1]["bleu"] < 5.0
    table = markdown_table({"m": rows})
    assert "| m | 100.0 |" in table


def test_plot_writes_a_png(tmp_path):
    rows = [{"words": "1-3", "bleu": 50.0}, {"words": "4-9", "bleu": 30.0}]
    path = plot_bleu_by_length({"a": rows, "b": rows}, tmp_path / "sub" / "plot.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
    assert "analysis/bleu_by_length.png" in images and "analysis/attention_tr_1.png" in images
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
    assert f"Sentence 1: *{first}*" in text

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
