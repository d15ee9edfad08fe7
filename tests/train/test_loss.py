import pytest
import torch
import torch.nn.functional as F

from nmt.train.loss import label_smoothed_loss, perplexity


@pytest.mark.parametrize("eps", [0.0, 0.1, 0.3])
def test_matches_torch_cross_entropy_with_label_smoothing(eps):
    torch.manual_seed(0)
    logits = torch.randn(3, 5, 11)
    target = torch.randint(1, 11, (3, 5))
    target[0, 3:] = 0  # padding
    target[2, 1:] = 0
    out = label_smoothed_loss(logits, target, pad_id=0, smoothing=eps)
    ref = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=eps, reduction="sum")
    nll = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, reduction="sum")
    assert out.ntokens == int(target.ne(0).sum()) == 9
    assert torch.allclose(out.loss, ref, atol=1e-5)
    assert torch.allclose(out.nll, nll, atol=1e-5)


def test_padding_contributes_nothing_to_loss_or_gradient():
    logits = torch.randn(1, 4, 7, requires_grad=True)
    target = torch.tensor([[3, 4, 0, 0]])
    label_smoothed_loss(logits, target, pad_id=0, smoothing=0.1).loss.backward()
    assert logits.grad[0, 2:].abs().sum() == 0
    assert logits.grad[0, :2].abs().sum() > 0


def test_perplexity_of_uniform_model_is_vocab_size():
    logits = torch.zeros(2, 3, 13)
    target = torch.randint(1, 13, (2, 3))
    out = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.0)
    assert perplexity(float(out.nll), out.ntokens) == pytest.approx(13.0, rel=1e-4)
