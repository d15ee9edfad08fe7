"""Attention heatmaps: a PNG of the predicted size, labels checked against the matrix."""

from __future__ import annotations

import re
import sys

import pytest
import torch

from nmt.plot import _BOTTOM, DPI, figure_size, image_size, plot_attention

pytest.importorskip("matplotlib")


def test_png_has_the_predicted_size_and_pixels(tmp_path):
    import matplotlib.image

    attention = torch.softmax(torch.randn(4, 6, generator=torch.Generator().manual_seed(0)), dim=-1)
    src = ["▁Ein", "▁Mann", "▁fährt", "▁Fahr", "rad", "</s>"]
    tgt = ["▁A", "▁man", "▁rides", "</s>"]
    path = plot_attention(attention, src, tgt, tmp_path / "a.png", title="test")
    pixels = matplotlib.image.imread(path)  # (H, W, 4)
    width, height = image_size(len(src), len(tgt))
    assert pixels.shape[:2] == (height, width)
    assert (width, height) == (round(figure_size(6, 4)[0] * DPI), round(figure_size(6, 4)[1] * DPI))
    assert pixels[..., :3].std() > 0.1  # something was drawn


def test_size_grows_with_tokens():
    assert image_size(10, 3)[0] > image_size(5, 3)[0] and image_size(5, 3)[1] == image_size(10, 3)[1]
    assert image_size(5, 10)[1] > image_size(5, 3)[1]


def test_labels_must_match_the_matrix(tmp_path):
    with pytest.raises(ValueError, match=r"\(2, 3\) needs 2 target and 3 source labels, got 2 and 2"):
        plot_attention(torch.zeros(2, 3), ["a", "b"], ["x", "y"], tmp_path / "a.png")


def test_plotting_leaves_pyplot_alone(tmp_path):
    plot_attention(torch.full((1, 1), 1.0), ["</s>"], ["</s>"], tmp_path / "a.png")
    assert "matplotlib.pyplot" not in sys.modules or sys.modules["matplotlib.pyplot"].get_fignums() == []


def test_the_title_is_drawn_where_the_docstring_says_bottom_left_below_the_heatmap(tmp_path):
    import matplotlib.image

    attention = torch.full((3, 4), 0.25)
    src, tgt = ["a", "b", "c", "</s>"], ["x", "y", "</s>"]
    plain = matplotlib.image.imread(plot_attention(attention, src, tgt, tmp_path / "plain.png"))
    titled = matplotlib.image.imread(plot_attention(attention, src, tgt, tmp_path / "titled.png", title="model"))
    rows, cols = (abs(titled - plain).sum(axis=-1) > 0).nonzero()
    height, width = plain.shape[:2]
    assert len(rows) > 0
    below_heatmap = height - _BOTTOM * DPI  # pixel rows count from the top
    assert rows.min() >= below_heatmap and cols.max() < width / 2


def test_characters_the_font_lacks_are_one_log_line_not_a_warning_each(tmp_path, caplog, recwarn, monkeypatch):
    """matplotlib's font has no Chinese: each character of an en-zh model's labels was a two-line warning, at
    every sentence of `nmt translate --attention-plot`. Private-use characters stand in here, which no font has."""
    from nmt import plot

    monkeypatch.setattr(plot, "_FONTS_SAID", set(), raising=False)
    chars = ["\ue000", "\ue001", "\ue002"]
    with caplog.at_level("WARNING", logger="nmt.plot"):
        for i in range(3):
            plot_attention(torch.full((3, 2), 0.5), ["a", chars[0]], [chars[1], chars[2] * 2, "</s>"], tmp_path / f"{i}.png")
    assert not [w for w in recwarn if "missing from font" in str(w.message)]
    [said] = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"plots: the font .+ has no glyph for 3 characters of the labels \(\ue000\ue001\ue002\), drawn "
                        r"as boxes: install a font that has them \(Noto Sans CJK for Chinese and Japanese\) and name it "
                        r"in matplotlib's font.family \(matplotlibrc\)", said)
    assert all((tmp_path / f"{i}.png").read_bytes()[:4] == b"\x89PNG" for i in range(3))
