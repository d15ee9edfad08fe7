"""Attention heatmaps: a PNG of the predicted size, labels checked against the matrix."""

from __future__ import annotations

import sys

import pytest
import torch

from nmt.plot import DPI, figure_size, image_size, plot_attention

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
