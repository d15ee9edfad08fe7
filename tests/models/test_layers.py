import math

import pytest
import torch
import torch.nn.functional as F

from nmt.models.layers import (
    Dropout,
    Embedding,
    FeedForward,
    LearnedPositions,
    SinusoidalPositions,
    apply_dropout,
)


def test_embedding_is_scaled_by_sqrt_d_model_and_pad_row_is_zero():
    torch.manual_seed(0)
    emb = Embedding(vocab_size=7, d_model=16, pad_id=1)
    tokens = torch.tensor([[0, 1, 6], [3, 3, 1]])
    out = emb(tokens)
    assert out.shape == (2, 3, 16)
    torch.testing.assert_close(out, emb.weight[tokens] * 4.0)
    assert torch.equal(emb.weight[1], torch.zeros(16))
    assert torch.equal(out[0, 1], torch.zeros(16))
    # Init N(0, D^-1/2): the scaled embedding has roughly unit variance.
    assert 0.1 < emb.weight[[0, 2, 3, 4, 5, 6]].std().item() < 0.5


def test_embedding_pad_row_gets_no_gradient():
    emb = Embedding(vocab_size=5, d_model=4, pad_id=0)
    emb(torch.tensor([[0, 2, 0]])).sum().backward()
    assert torch.equal(emb.weight.grad[0], torch.zeros(4))
    assert emb.weight.grad[2].abs().sum() > 0


def test_embedding_rejects_bad_pad_id():
    with pytest.raises(ValueError, match=r"pad_id \(5\).*vocab_size \(5\)"):
        Embedding(vocab_size=5, d_model=4, pad_id=5)


def test_sinusoidal_values_match_the_paper_formula():
    d = 8
    pos = SinusoidalPositions(d_model=d, max_positions=50)
    table = pos(50)
    assert table.shape == (50, d)
    # Position 0: sin(0) = 0 on even dims, cos(0) = 1 on odd dims.
    assert torch.equal(table[0], torch.tensor([0.0, 1.0] * (d // 2)))
    for p, i in [(1, 0), (5, 1), (17, 2), (49, 3)]:
        angle = p / 10000 ** (2 * i / d)
        assert table[p, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
        assert table[p, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)
    assert "table" not in pos.state_dict()  # recomputed, never checkpointed


@pytest.mark.parametrize("cls", [SinusoidalPositions, LearnedPositions])
def test_positions_offset_and_range(cls):
    pos = cls(d_model=6, max_positions=10)
    full = pos(10)
    torch.testing.assert_close(pos(3, offset=4), full[4:7], rtol=0, atol=0)
    torch.testing.assert_close(pos(1, offset=9), full[9:10], rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"positions 8\.\.10.*max_positions \(10\)"):
        pos(3, offset=8)


def test_sinusoidal_needs_even_width():
    with pytest.raises(ValueError, match=r"d_model \(7\)"):
        SinusoidalPositions(d_model=7, max_positions=4)


@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_feed_forward_matches_hand_computation(activation):
    torch.manual_seed(0)
    ff = FeedForward(d_model=4, ff_dim=8, activation=activation).eval()
    x = torch.randn(2, 3, 4)
    act = F.relu if activation == "relu" else F.gelu
    expected = act(x @ ff.up.weight.T + ff.up.bias) @ ff.down.weight.T + ff.down.bias
    torch.testing.assert_close(ff(x), expected)


def test_feed_forward_rejects_unknown_activation():
    with pytest.raises(ValueError, match="'swish'"):
        FeedForward(d_model=4, ff_dim=8, activation="swish")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_zeroes_a_share_p_and_scales_the_rest_by_one_over_one_minus_p(p: float, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.rand(1000, 1000) + 0.5).to(dtype).requires_grad_()  # no zeros of its own
    y = apply_dropout(x, p)
    kept = y != 0
    n = kept.numel()
    # the zeroed share is a binomial proportion: within 5 standard deviations of p
    assert abs((1 - kept.float().mean().item()) - p) < 5 * math.sqrt(p * (1 - p) / n)
    assert torch.equal(y[kept], x.detach()[kept] * (1.0 / (1.0 - p)))  # the same product, to the bit
    assert y.dtype == dtype
    w = torch.randn(1000, 1000)
    (y.float() * w).sum().backward()  # the gradient goes through the kept elements alone, scaled alike
    torch.testing.assert_close(x.grad, (w * kept / (1.0 - p)).to(dtype))  # to the dtype's rounding


def test_dropout_draws_from_the_seeded_generator_and_anew_at_every_call() -> None:
    x = torch.ones(64, 64)
    torch.manual_seed(3)
    first, second = apply_dropout(x, 0.3), apply_dropout(x, 0.3)
    torch.manual_seed(3)
    assert torch.equal(apply_dropout(x, 0.3), first)  # a resumed run that restores the RNG draws the same masks
    assert not torch.equal(first, second)


def test_dropout_is_the_identity_outside_training_and_at_p_0_and_zeroes_all_at_p_1() -> None:
    x = torch.randn(8, 16)
    assert apply_dropout(x, 0.5, training=False) is x and apply_dropout(x, 0.0) is x
    assert torch.equal(apply_dropout(x, 1.0), torch.zeros_like(x))
    module = Dropout(0.5)
    assert isinstance(module, torch.nn.Dropout) and module.state_dict() == {} and repr(module) == "Dropout(p=0.5, inplace=False)"
    assert module.eval()(x) is x
    y = module.train()(x)
    assert 0 < int((y == 0).sum()) < x.numel()
