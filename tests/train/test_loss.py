import math

import pytest
import torch
import torch.nn.functional as F

from nmt.train.loss import _READS_HALF, label_smoothed_loss, perplexity
from tests.op_counts import OpCounter


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


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("chunk_elements", [1 << 24, 23, 11])  # one chunk; chunks splitting rows unevenly; one row each
def test_chunked_loss_and_gradient_match_torch_in_float64(eps, chunk_elements, monkeypatch):
    monkeypatch.setattr("nmt.train.loss._CHUNK_ELEMENTS", chunk_elements)
    torch.manual_seed(1)
    logits = torch.randn(3, 5, 11, dtype=torch.float64, requires_grad=True)
    target = torch.randint(1, 11, (3, 5))
    target[1, 2:] = 0
    out = label_smoothed_loss(logits, target, pad_id=0, smoothing=eps)
    ref = F.cross_entropy(logits.view(-1, 11), target.view(-1), ignore_index=0, label_smoothing=eps, reduction="sum")
    (grad,) = torch.autograd.grad(out.loss * 0.7, logits)
    (ref_grad,) = torch.autograd.grad(ref * 0.7, logits)
    assert torch.allclose(out.loss, ref, rtol=1e-12, atol=1e-12)
    assert torch.allclose(grad, ref_grad, rtol=1e-10, atol=1e-12)
    assert torch.autograd.gradcheck(lambda x: label_smoothed_loss(x, target, pad_id=0, smoothing=eps).loss, (logits,))


def test_bf16_logits_are_scored_in_fp32_and_get_a_bf16_gradient():
    torch.manual_seed(2)
    logits = torch.randn(4, 6, 50).to(torch.bfloat16).requires_grad_()
    target = torch.randint(1, 50, (4, 6))
    out = label_smoothed_loss(logits, target, pad_id=0, smoothing=0.1)
    exact = logits.detach().float().requires_grad_()  # the same bf16 values, in fp32
    ref = F.cross_entropy(exact.view(-1, 50), target.view(-1), ignore_index=0, label_smoothing=0.1, reduction="sum")
    out.loss.backward()
    ref.backward()
    assert out.loss.dtype == torch.float32
    assert torch.allclose(out.loss, ref, rtol=1e-6)  # fp32 arithmetic: no bf16 rounding of log-probabilities
    assert logits.grad.dtype == torch.bfloat16
    assert torch.allclose(logits.grad.float(), exact.grad, atol=1e-2)  # gradient rounded to bf16 once


def _kernels_per_pass(chunks: int, dtype: torch.dtype, monkeypatch) -> tuple[int, int]:
    monkeypatch.setattr("nmt.train.loss._CHUNK_ELEMENTS", 4 * 40)  # 4 rows of 40 a chunk
    logits = torch.randn(4 * chunks, 40).to(dtype).requires_grad_()
    target = torch.randint(1, 40, (4 * chunks,))
    with OpCounter() as forward:
        out = label_smoothed_loss(logits[None], target[None], pad_id=0, smoothing=0.1)
    with OpCounter() as backward:
        out.loss.backward()
    return forward.computing, backward.computing


@pytest.mark.parametrize("dtype, per_chunk", [(torch.float32, 3), (torch.bfloat16, 5)])
def test_each_chunk_costs_a_few_operations(dtype, per_chunk, monkeypatch):
    """On a GPU each operation is a kernel launch: a chunk of rows adds its passes over the logits (forward:
    log-softmax, the targets' gather, the rows' mean; backward: softmax, the targets' scatter, the scaled
    write; for bf16 also the cast to fp32 before each softmax and the copy into the bf16 gradient), and
    what is per row is done once for all chunks (before: 15 operations a chunk forward)."""
    one = _kernels_per_pass(1, dtype, monkeypatch)
    six = _kernels_per_pass(6, dtype, monkeypatch)
    forward, backward = ((many - single) / 5 for many, single in zip(six, one))
    assert forward <= per_chunk and backward <= per_chunk, (one, six)


def test_a_gpu_writes_the_bf16_gradient_in_the_scaling_kernel_with_the_same_values(monkeypatch):
    """On CUDA the scaled write converts to bf16 itself (`_writes_cast`), one pass less than a copy after it;
    run here on the CPU, that path must give the copy's gradient to the bit."""
    monkeypatch.setattr("nmt.train.loss._CHUNK_ELEMENTS", 5 * 50)  # chunks of 5 rows, the last one short

    def gradient(direct: bool) -> torch.Tensor:
        monkeypatch.setattr("nmt.train.loss._writes_cast", lambda device: direct)
        torch.manual_seed(3)
        logits = torch.randn(3, 7, 50).to(torch.bfloat16).requires_grad_()
        target = torch.randint(0, 50, (3, 7))
        label_smoothed_loss(logits, target, pad_id=0, smoothing=0.1).loss.backward(torch.tensor(0.3))
        return logits.grad

    copied, direct = gradient(False), gradient(True)
    assert direct.dtype == torch.bfloat16 and direct.abs().sum() > 0
    assert torch.equal(direct, copied)


@pytest.mark.gpu
def test_bf16_logits_on_a_gpu_are_scored_as_on_the_cpu_in_fewer_passes():
    """CUDA's softmax kernels read bf16 rows and write fp32 (where this torch's do: `_READS_HALF`), and the
    scaled write converts to bf16 itself: a chunk of bf16 logits costs what an fp32 one does."""
    torch.manual_seed(4)
    logits = torch.randn(2, 300, 8000).to(torch.bfloat16)
    target = torch.randint(0, 8000, (2, 300))
    results = {}
    for device in ("cpu", "cuda"):
        # a leaf of its own on each device: without the copy, `to("cpu")` returns `logits` itself, whose
        # `requires_grad_` would make the CUDA copy a non-leaf, with no `.grad`
        x = logits.to(device, copy=True).requires_grad_()
        out = label_smoothed_loss(x, target.to(device), pad_id=0, smoothing=0.1)
        with OpCounter() as backward:
            out.loss.backward()
        results[device] = (out.loss.cpu(), out.nll.cpu(), x.grad.float().cpu(), backward.counts)
    (loss, nll, grad, _), (cuda_loss, cuda_nll, cuda_grad, counts) = results["cpu"], results["cuda"]
    torch.testing.assert_close(cuda_loss, loss, rtol=1e-5, atol=0)
    torch.testing.assert_close(cuda_nll, nll, rtol=1e-5, atol=0)
    torch.testing.assert_close(cuda_grad, grad, rtol=1e-2, atol=1e-6)  # each rounded to bf16 once
    assert not counts["copy_"], counts  # the scaled write converts as it goes
    if _READS_HALF.get(torch.bfloat16, True):
        assert not counts["_to_copy"], counts  # the softmax read bf16 itself


def test_perplexity_is_exp_of_the_mean_nll_and_stays_finite_far_beyond():
    """exp(mean NLL) exactly for any loss a model gets from a start of random weights, even the mean NLL of 40
    of a badly diverged run (exp(40) is about 2.4e17, finite as a float); only absurd means are capped, so that
    logs get a finite number rather than an overflow."""
    for nll_sum, ntokens in [(0.0, 5), (6.9, 3), (40.0 * 7, 7), (40.0, 1)]:
        assert perplexity(nll_sum, ntokens) == pytest.approx(math.exp(nll_sum / ntokens), rel=1e-12)
    huge = [perplexity(mean, 1) for mean in (40.0, 800.0, 1e6, float("inf"))]
    assert all(math.isfinite(p) for p in huge)
    assert huge == sorted(huge) and huge[1] > huge[0]  # the cap lies above 40: a higher loss never reads lower
    assert perplexity(7.0, 0) == pytest.approx(math.exp(7.0))  # no tokens: the sum itself, not a division by 0
