"""RNN encoder-decoder: contract, decode_step == forward, reordering, padding, overfitting."""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch.nn.functional as F

from nmt.models.attention import ATTENTION_KINDS
from nmt.models.contract import Memory, Seq2Seq, State
from nmt.models.masks import pad_mask_from_tokens
from nmt.models.rnn import RNNSeq2Seq
from nmt.models.rnn_decoder import RNNState
from nmt.models.rnn_encoder import RNNEncoder

PAD, BOS, EOS = 0, 1, 2
BASE = dict(
    src_vocab_size=13, tgt_vocab_size=11, pad_id=PAD, cell="gru", embed_dim=6, hidden_size=8,
    encoder_layers=2, decoder_layers=2, bidirectional=True, dropout=0.3, bridge="learned",
    decoder="luong", attention="general", attention_heads=2, local_window=0, input_feeding=True,
    tie_embeddings="none",
)  # fmt: skip
DECODERS = {
    "none": dict(decoder="none"),
    "bahdanau": dict(decoder="bahdanau", attention="additive"),
    "luong": dict(decoder="luong", input_feeding=True),
    "luong-nofeed": dict(decoder="luong", input_feeding=False),
}


def make(**overrides) -> RNNSeq2Seq:
    torch.manual_seed(0)
    return RNNSeq2Seq(**(BASE | overrides)).eval()


def batch():
    """Three right-padded sources of lengths 5, 2, 4 and target prefixes of length 4."""
    src = torch.tensor([[3, 4, 5, 6, 7], [8, 9, PAD, PAD, PAD], [10, 11, 12, 3, PAD]])
    tgt_in = torch.tensor([[BOS, 3, 4, 5], [BOS, 6, 7, 8], [BOS, 9, 10, 3]])
    return src, pad_mask_from_tokens(src, PAD), tgt_in


def run_steps(model, memory, state, tokens):
    """Feed tokens (B, T) one at a time -> log-probs (B, T, V), attention list, final state."""
    log_probs, attns = [], []
    for t in range(tokens.size(1)):
        lp, state, attn = model.decode_step(tokens[:, t], memory, state)
        log_probs.append(lp)
        attns.append(attn)
    return torch.stack(log_probs, dim=1), attns, state


GRID = [(d, c, bi) for d in DECODERS for c in ("gru", "lstm") for bi in (True, False)]
grid = pytest.mark.parametrize("decoder,cell,bidirectional", GRID)


def model_for(decoder, cell, bidirectional, **more):
    return make(cell=cell, bidirectional=bidirectional, **DECODERS[decoder], **more)


@grid
def test_decode_step_matches_forward(decoder, cell, bidirectional):
    model = model_for(decoder, cell, bidirectional)
    src, mask, tgt_in = batch()
    logits = model(src, mask, tgt_in)
    assert logits.shape == (3, 4, BASE["tgt_vocab_size"])
    memory = model.encode(src, mask)
    state = model.init_state(memory)
    assert isinstance(model, Seq2Seq) and isinstance(state, State) and isinstance(memory, Memory)
    log_probs, _, _ = run_steps(model, memory, state, tgt_in)
    assert log_probs.dtype == torch.float32
    torch.testing.assert_close(log_probs, logits.log_softmax(-1), atol=1e-5, rtol=0)
    torch.testing.assert_close(model.decode(tgt_in, memory), logits)


@grid
def test_reordered_state_and_memory_still_match(decoder, cell, bidirectional):
    """Search reorders (and repeats) hypotheses mid-sentence: steps must follow the rows."""
    model = model_for(decoder, cell, bidirectional)
    src, mask, tgt_in = batch()
    full = model(src, mask, tgt_in).log_softmax(-1)  # (B, T, V)
    memory = model.encode(src, mask)
    _, _, state = run_steps(model, memory, model.init_state(memory), tgt_in[:, :2])
    order = torch.tensor([2, 0, 0, 1])
    memory, state = memory.index_select(order), state.index_select(order)
    assert isinstance(state, RNNState) and state.hidden.shape[0] == 4
    rest, _, _ = run_steps(model, memory, state, tgt_in[order, 2:])
    torch.testing.assert_close(rest, full[order, 2:], atol=1e-5, rtol=0)


@grid
def test_extra_source_padding_changes_nothing(decoder, cell, bidirectional):
    model = model_for(decoder, cell, bidirectional)
    src, mask, tgt_in = batch()
    padded = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    logits = model(src, mask, tgt_in)
    torch.testing.assert_close(
        model(padded, pad_mask_from_tokens(padded, PAD), tgt_in), logits, atol=1e-5, rtol=0
    )
    # Padding also costs nothing inside the encoder: a batch of one, unpadded, agrees.
    alone = model(src[1:2, :2], mask[1:2, :2], tgt_in[1:2])
    torch.testing.assert_close(alone, logits[1:2], atol=1e-5, rtol=0)


@grid
def test_step_attention_sums_to_one_and_ignores_padding(decoder, cell, bidirectional):
    model = model_for(decoder, cell, bidirectional)
    src, mask, tgt_in = batch()
    memory = model.encode(src, mask)
    _, attns, _ = run_steps(model, memory, model.init_state(memory), tgt_in)
    if decoder == "none":
        assert all(attn is None for attn in attns)
        return
    for attn in attns:
        assert attn.shape == (3, src.size(1))
        torch.testing.assert_close(attn.sum(-1), torch.ones(3))
        assert (attn[mask] == 0).all() and (attn[~mask] > 0).all()


def test_input_feeding_feeds_the_attentional_state():
    """Luong sec. 3.3: the state carries h~_t, the vector that just predicted y_t."""
    model = make(decoder="luong", input_feeding=True)
    src, mask, tgt_in = batch()
    memory = model.encode(src, mask)
    state = model.init_state(memory)
    assert (state.feed == 0).all()
    for t in range(tgt_in.size(1)):
        log_probs, state, _ = model.decode_step(tgt_in[:, t], memory, state)
        assert state.feed.abs().sum() > 0
        torch.testing.assert_close(model.output(state.feed).log_softmax(-1), log_probs)
    assert make(decoder="luong", input_feeding=False).init_state(memory).feed is None


@pytest.mark.parametrize("window", [0, 2])
@pytest.mark.parametrize("attention", ATTENTION_KINDS)
@pytest.mark.parametrize("decoder", ["bahdanau", "luong"])
def test_every_attention_in_both_decoders(decoder, attention, window):
    model = make(decoder=decoder, attention=attention, local_window=window, cell="lstm")
    src, mask, tgt_in = batch()
    logits = model(src, mask, tgt_in)
    memory = model.encode(src, mask)
    log_probs, attns, _ = run_steps(model, memory, model.init_state(memory), tgt_in)
    torch.testing.assert_close(log_probs, logits.log_softmax(-1), atol=1e-5, rtol=0)
    for attn in attns:
        assert (attn[mask] == 0).all()
        if window:  # local-p is not renormalised (Luong eq. 10)
            assert (attn.sum(-1) <= 1 + 1e-6).all()
        else:
            torch.testing.assert_close(attn.sum(-1), torch.ones(3))


@pytest.mark.parametrize("bridge", ["zeros", "learned"])
@pytest.mark.parametrize("layers", [(1, 3), (3, 1), (2, 2)])
def test_bridge_layer_counts(bridge, layers):
    encoder_layers, decoder_layers = layers
    model = make(
        cell="lstm", bridge=bridge, encoder_layers=encoder_layers, decoder_layers=decoder_layers
    )
    src, mask, tgt_in = batch()
    memory = model.encode(src, mask)
    assert memory.extra["final_h"].shape == (3, encoder_layers, 8)
    # the final cell states of the encoder layers the bridge reads only: the top ones, or none
    read = 0 if bridge == "zeros" else min(encoder_layers, decoder_layers)
    assert memory.extra.get("final_c", torch.empty(3, 0, 8)).shape == (3, read, 8)
    torch.testing.assert_close(memory.extra["summary"], memory.extra["final_h"][:, -1])
    state = model.init_state(memory)
    assert state.hidden.shape == state.cell.shape == (3, decoder_layers, 8)
    if bridge == "zeros":
        assert (state.hidden == 0).all() and (state.cell == 0).all()
    else:  # top decoder layer starts from the top encoder layer
        top = model.bridge.h_proj[-1](memory.extra["final_h"][:, -1]).tanh()
        torch.testing.assert_close(state.hidden[:, -1], top)
    log_probs, _, _ = run_steps(model, memory, state, tgt_in)
    torch.testing.assert_close(
        log_probs, model(src, mask, tgt_in).log_softmax(-1), atol=1e-5, rtol=0
    )


def test_summary_is_the_final_state_of_both_directions():
    model = make(encoder_layers=1)
    src, mask, _ = batch()
    memory = model.encode(src, mask)
    half = BASE["hidden_size"] // 2
    lengths = (~mask).sum(1)
    states = memory.states  # forward half ends at the last real token, backward half at 0
    forward_last = states[torch.arange(3), lengths - 1, :half]
    torch.testing.assert_close(
        memory.extra["summary"], torch.cat([forward_last, states[:, 0, half:]], -1)
    )
    assert (states[mask] == 0).all()


def fp32_close(device: str) -> dict:
    """Tolerances for two fp32 computations of the same RNN: on a GPU, cuDNN's kernels (padded or packed input, a
    fused layer or the cell's steps) sum in other orders, up to 8e-6 apart on an H200 (2026-11-27)."""
    return dict(rtol=1e-5, atol=1e-6 if device == "cpu" else 5e-5)


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"),
                                    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
def test_the_encoder_gives_what_packing_gives_states_final_states_and_gradients(cell, bidirectional, layers, device):
    """The encoder as a GPU runs it, reading no source length on the host (`RNNEncoder._unpacked`), against its
    nn.GRU/nn.LSTM over the source packed by its lengths (`_packed`, what a CPU runs): states, final states (an
    LSTM's cell states rebuilt) and the gradients of every parameter, for sentences of 1 to 6 tokens (one as
    long as the batch), through randomly weighted sums of the outputs. On a GPU both are cuDNN's, in full fp32."""
    model = make(cell=cell, bidirectional=bidirectional, encoder_layers=layers, dropout=0.0)
    encoder = model.train().to(device).encoder
    src = torch.tensor([[3, 4, 5, 6, 7, 8], [9, PAD, PAD, PAD, PAD, PAD], [10, 11, 12, 3, PAD, PAD]], device=device)
    real = ~pad_mask_from_tokens(src, PAD)
    results, weights = [], None
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for run in (encoder._unpacked, encoder._packed):
            outputs = [x for x in run(encoder.embedding(src), real) if x is not None]
            weights = weights or [torch.randn_like(x) for x in outputs]
            encoder.zero_grad()
            sum((x * w).sum() for x, w in zip(outputs, weights, strict=True)).backward()
            results.append((outputs, {name: p.grad.clone() for name, p in encoder.named_parameters()}))
    (ours, our_grads), (packed, packed_grads) = results
    assert len(ours) == len(packed) == (3 if cell == "lstm" else 2)  # states, final h (and c)
    close = fp32_close(device)
    for x, y in zip(ours, packed, strict=True):
        torch.testing.assert_close(x, y, **close)
    assert (ours[0][~real] == 0).all()  # zeros at padding, as unpacking leaves them
    for name, grad in packed_grads.items():
        torch.testing.assert_close(our_grads[name], grad, **close, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize(("forget_bias", "rtol"), [(-8.0, 1e-6), (-3.0, 1e-6), (0.0, 1e-6), (8.0, 2e-5)])
def test_an_lstms_rebuilt_cell_states_keep_their_digits_over_a_long_sentence(forget_bias, rtol):
    """The rebuilt cell states take running products of the forget gates as sums of their logarithms: over
    1000 tokens with forget gates shut (log f near -8 a step), half-shut, between or open, they are nn.LSTM's
    own, packed, to 1e-6 (with the sums in fp32 the half-shut and middle cases miss it); open, c sums a
    thousand updates to some hundreds, each way rounding its own sum."""
    model = make(cell="lstm", embed_dim=16, hidden_size=32, dropout=0.0, src_vocab_size=50)
    encoder = model.encoder.train()
    with torch.no_grad():
        for name, p in encoder.rnn.named_parameters():
            if name.startswith("bias_ih"):
                p[p.numel() // 4: p.numel() // 2] = forget_bias  # rows i, f, g, o: the forget gate's
    torch.manual_seed(1)
    src = torch.randint(3, 50, (3, 1000))
    src[1, 300:] = PAD
    src[2, 1:] = PAD
    real = ~pad_mask_from_tokens(src, PAD)
    ours, packed = (way(encoder.embedding(src), real) for way in (encoder._unpacked, encoder._packed))
    torch.testing.assert_close(ours[2], packed[2], rtol=rtol, atol=1e-6)  # the final cell states
    for x, y in zip(ours[:2], packed[:2], strict=True):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-5)
    assert packed[2].abs().max() > (20 if forget_bias > 0 else 0.1)  # open gates: c sums many updates


def test_an_lstm_in_float64_rebuilds_its_cell_states_in_float64():
    """The rebuilt cell states sum in fp32 at least, as fused kernels keep c, and a float64 model's in float64:
    they were cast to fp32 and back, 1e-7 from nn.LSTM's where every other state agreed to 1e-16."""
    model = make(cell="lstm", bidirectional=True, encoder_layers=2, dropout=0.0).double()
    encoder = model.encoder.train()
    src = torch.tensor([[3, 4, 5, 6, 7, 8], [9, PAD, PAD, PAD, PAD, PAD], [10, 11, 12, 3, PAD, PAD]])
    real = ~pad_mask_from_tokens(src, PAD)
    ours, packed = (way(encoder.embedding(src), real) for way in (encoder._unpacked, encoder._packed))
    assert ours[2].dtype == torch.float64
    for x, y in zip(ours, packed, strict=True):
        torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-13)


def stepped_logits(model, src, mask, tgt_in):
    """Teacher forcing one decoder step after another, as a decoder that feeds its outputs back must."""
    memory = model.encode(src, mask)
    state, outputs = model.init_state(memory), []
    for embedded in model.dropout(model.tgt_embed(tgt_in)).unbind(1):
        output, state, _ = model.decoder(embedded, memory, state)
        outputs.append(output)
    return model._logits(torch.stack(outputs, dim=1))


AT_ONCE = {
    "none": dict(decoder="none"),
    "luong-general": dict(decoder="luong", input_feeding=False),
    "luong-additive-local": dict(decoder="luong", input_feeding=False, attention="additive", local_window=2),
    "luong-multihead": dict(decoder="luong", input_feeding=False, attention="multihead"),
}


@pytest.mark.parametrize("device", [pytest.param("cpu", id="cpu"),
                                    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("decoder_layers", [1, 2])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("decoder", list(AT_ONCE))
def test_a_decoder_fed_no_output_of_its_own_runs_teacher_forcing_at_once_as_its_steps_would(decoder, cell,
                                                                                           decoder_layers, device):
    """No attention, or Luong's without input feeding: every step's input is known before the first, so
    `forward` runs the cells over all steps as one fused call a layer (then attends with all queries at once),
    giving the logits and the gradients of every parameter that stepping gives. Bahdanau's decoder and input
    feeding read the step before: those step. On a GPU the fused call is cuDNN's, the steps cuBLAS's, in full
    fp32."""
    model = make(cell=cell, decoder_layers=decoder_layers, dropout=0.0, **AT_ONCE[decoder]).train().to(device)
    assert model.decoder.steps_at_once
    assert not make(decoder="luong", input_feeding=True).decoder.steps_at_once
    assert not make(decoder="bahdanau", attention="additive").decoder.steps_at_once
    src, mask, tgt_in = (x.to(device) for x in batch())
    results = []
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for run in (model, partial(stepped_logits, model)):
            model.zero_grad()
            logits = run(src, mask, tgt_in)
            (logits * torch.linspace(-1, 1, logits.numel(), device=device).view_as(logits)).sum().backward()
            results.append((logits, {name: p.grad.clone() for name, p in model.named_parameters()}))
    (at_once, grads), (stepped, stepped_grads) = results
    close = fp32_close(device)
    torch.testing.assert_close(at_once, stepped, **close)
    for name, grad in stepped_grads.items():
        torch.testing.assert_close(grads[name], grad, **close, msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("layers", [(3, 1), (3, 2), (1, 3), (2, 3)])
def test_an_lstm_encoder_gives_the_cell_states_its_learned_bridge_reads_and_no_others(layers, pack):
    """On CUDA each final cell state is rebuilt, so the encoder gives those of the layers decoder layers start
    from only (with fewer decoder layers, the top ones; with more, every one, layer 0 once): the decoder's first
    cell states are the bridge's projections of those the same encoder gives with every layer's."""
    encoder_layers, decoder_layers = layers
    model = make(cell="lstm", encoder_layers=encoder_layers, decoder_layers=decoder_layers, dropout=0.0)
    model.encoder.pack_off_cuda = pack
    src, mask, _ = batch()
    expected = sorted({max(0, encoder_layers - decoder_layers + layer) for layer in range(decoder_layers)})
    assert list(model.encoder.cell_layers) == expected
    state = model.init_state(model.encode(src, mask))
    model.encoder.cell_layers = tuple(range(encoder_layers))
    every = model.encoder(src, mask)[2]  # (B, Le, H)
    sources = [max(0, encoder_layers - decoder_layers + layer) for layer in range(decoder_layers)]
    for layer, source in enumerate(sources):
        projected = model.bridge.c_proj[layer](every[:, source]).tanh()
        torch.testing.assert_close(state.cell[:, layer], projected, rtol=0, atol=0)


def test_an_encoder_refuses_cell_layers_it_does_not_have_or_out_of_order():
    embedding = torch.nn.Embedding(10, 6)
    for cell_layers in ([2], [-1], [1, 0], [0, 0]):
        with pytest.raises(ValueError, match=rf"cell_layers \({', '.join(map(str, cell_layers))},?\) must be"):
            RNNEncoder(embedding=embedding, cell="lstm", hidden_size=8, layers=2, bidirectional=True, dropout=0.0,
                       cell_layers=cell_layers)


@pytest.mark.parametrize("pack", [True, False])
@pytest.mark.parametrize("cell", ["gru", "lstm"])
@pytest.mark.parametrize("layers", [1, 2])
def test_the_encoder_drops_out_between_its_layers_in_training_only(cell, layers, pack):
    """nn.GRU/nn.LSTM's dropout between layers, which the unpacked encoder applies itself: with the embeddings'
    dropout off, two training passes differ with two layers only, packed or not."""
    encoder = make(cell=cell, dropout=0.5, encoder_layers=layers).encoder
    encoder.dropout.p, encoder.pack_off_cuda = 0.0, pack  # no dropout on the embeddings
    src, mask, _ = batch()
    encoder.train()
    first, second = encoder(src, mask)[0], encoder(src, mask)[0]
    assert torch.equal(first, second) == (layers == 1)
    encoder.eval()
    assert torch.equal(encoder(src, mask)[0], encoder(src, mask)[0])


@pytest.mark.parametrize("tie", ["decoder", "all"])
def test_tied_embeddings(tie):
    model = make(tie_embeddings=tie, src_vocab_size=11)
    assert model.output.weight is model.tgt_embed.weight
    assert (model.encoder.embedding is model.tgt_embed) == (tie == "all")
    assert isinstance(model.pre_output, torch.nn.Linear)  # H 8 -> E 6
    src, mask, tgt_in = batch()
    assert model(src % 11, mask, tgt_in).shape == (3, 4, 11)
    # One (V, E) matrix for embedding and output; the H -> E projection is new.
    untied = make(src_vocab_size=11)
    expected = sum(p.numel() for p in untied.parameters()) - untied.output.weight.numel()
    expected += (
        model.pre_output.weight.numel() - (tie == "all") * untied.encoder.embedding.weight.numel()
    )
    assert sum(p.numel() for p in model.parameters()) == expected


@pytest.mark.parametrize(
    "overrides,message",
    [
        (dict(cell="rnn"), "cell 'rnn'"),
        (dict(hidden_size=7), r"hidden_size \(7\) must be even"),
        (dict(tie_embeddings="all"), r"src_vocab_size \(13\) != tgt_vocab_size \(11\)"),
        (dict(tie_embeddings="encoder"), "tie_embeddings 'encoder'"),
        (dict(decoder="transformer"), "decoder 'transformer'"),
        (dict(bridge="mean"), "bridge 'mean'"),
        (dict(attention="dot", local_window=-1), r"local_window \(-1\)"),
        (dict(attention="multihead", attention_heads=3), r"heads \(3\)"),
    ],
)
def test_invalid_arguments_raise_with_values(overrides, message):
    with pytest.raises(ValueError, match=message):
        RNNSeq2Seq(**(BASE | overrides))


def test_dropout_is_active_in_training_only():
    model = make()
    src, mask, tgt_in = batch()
    model.train()
    assert not torch.allclose(model(src, mask, tgt_in), model(src, mask, tgt_in))
    model.eval()
    torch.testing.assert_close(model(src, mask, tgt_in), model(src, mask, tgt_in))


# --------------------------------------------------------------------------- overfit


def reverse_task(n=10, vocab=10, seed=0):
    """n random sources of 3-5 tokens; targets are the reversed sources."""
    g = torch.Generator().manual_seed(seed)
    pairs = []
    for _ in range(n):
        length = int(torch.randint(3, 6, (1,), generator=g))
        pairs.append(torch.randint(3, vocab, (length,), generator=g))
    src = torch.nn.utils.rnn.pad_sequence(pairs, batch_first=True, padding_value=PAD)
    tgt = [torch.cat([torch.tensor([BOS]), p.flip(0), torch.tensor([EOS])]) for p in pairs]
    tgt = torch.nn.utils.rnn.pad_sequence(tgt, batch_first=True, padding_value=PAD)
    return src, tgt[:, :-1], tgt[:, 1:]


def greedy(model, src, mask, max_len):
    memory = model.encode(src, mask)
    state = model.init_state(memory)
    tokens = torch.full((src.size(0),), BOS)
    out = []
    for _ in range(max_len):
        log_probs, state, _ = model.decode_step(tokens, memory, state)
        tokens = log_probs.argmax(-1)
        out.append(tokens)
    return torch.stack(out, dim=1)  # (B, max_len)


@pytest.mark.parametrize("decoder", ["none", "bahdanau", "luong"])
def test_overfits_a_batch(decoder):
    src, tgt_in, tgt_out = reverse_task()
    mask = pad_mask_from_tokens(src, PAD)
    model = make(
        **DECODERS[decoder], src_vocab_size=10, tgt_vocab_size=10, embed_dim=16, hidden_size=32,
        encoder_layers=1, decoder_layers=1, dropout=0.0,
    )  # fmt: skip
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(60):  # exact from about step 40 on this batch
        logits = model(src, mask, tgt_in)
        loss = F.cross_entropy(logits.flatten(0, 1), tgt_out.flatten(), ignore_index=PAD)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with torch.no_grad():
        predicted = greedy(model, src, mask, tgt_out.size(1))
    real = tgt_out != PAD
    assert loss.item() < 0.1
    assert torch.equal(predicted[real], tgt_out[real])


# --------------------------------------------------------------------------- decoder steps by hand


def gru_by_hand(cell: torch.nn.GRUCell, x: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
    """One GRU step from the cell's weights (Cho et al., 2014; gates r, z, n in torch's row order)."""
    i_r, i_z, i_n = (x @ cell.weight_ih.T + cell.bias_ih).chunk(3, dim=-1)
    h_r, h_z, h_n = (h @ cell.weight_hh.T + cell.bias_hh).chunk(3, dim=-1)
    r, z = torch.sigmoid(i_r + h_r), torch.sigmoid(i_z + h_z)
    n = torch.tanh(i_n + r * h_n)
    return (1 - z) * n + z * h


def attend_by_hand(scores: torch.Tensor, memory: Memory) -> tuple[torch.Tensor, torch.Tensor]:
    """Scores (B, S) over the encoder states -> softmax over the real positions (B, S), context (B, H)."""
    weights = scores.masked_fill(memory.pad_mask, float("-inf")).softmax(-1)
    return weights, torch.einsum("bs,bsh->bh", weights, memory.states)


def luong_step_by_hand(model: RNNSeq2Seq, tokens: torch.Tensor, memory: Memory, feed, hidden: torch.Tensor):
    """Luong et al. (2015) with one GRU layer and "general" scores, from the model's weights:
    h_t = GRU([E y; h~_{t-1}], h_{t-1}) (no h~ without input feeding), a_t = softmax(h_t^T W_a h_s) (eq. 7-8),
    c_t = sum_s a_t(s) h_s, h~_t = tanh(W_c [c_t; h_t]) (eq. 5), log p = log_softmax(W_s h~_t + b) (eq. 6).
    Returns log p (B, V), h_t, h~_t (B, H) and a_t (B, S)."""
    decoder = model.decoder
    x = model.tgt_embed.weight[tokens]  # (B, E)
    if feed is not None:
        x = torch.cat([x, feed], dim=-1)
    h = gru_by_hand(decoder.cells.cells[0], x, hidden)  # (B, H)
    W_a = decoder.context.attention.score.W_a.weight  # (H, H)
    weights, context = attend_by_hand(torch.einsum("bi,ij,bsj->bs", h, W_a, memory.states), memory)
    attentional = torch.tanh(torch.cat([context, h], dim=-1) @ decoder.W_c.weight.T)  # (B, H)
    logits = attentional @ model.output.weight.T + model.output.bias  # (B, V)
    return logits.log_softmax(-1), h, attentional, weights


LUONG_BY_HAND = dict(decoder="luong", attention="general", cell="gru", decoder_layers=1, dropout=0.0)


def test_a_luong_step_is_eq_5_on_the_attention_context_and_the_cells_state():
    """A step of `decode_step` (with input feeding, past the first step so that the fed h~ is not 0) against
    the step computed from the model's weights by hand: the attentional state h~_t = tanh(W_c [c_t; h_t]) is
    what the output layer reads and what is fed to the next step."""
    model = make(**LUONG_BY_HAND, input_feeding=True)
    src, mask, tgt_in = batch()
    memory = model.encode(src, mask)
    _, state, _ = model.decode_step(tgt_in[:, 0], memory, model.init_state(memory))
    assert state.feed.abs().sum() > 0
    log_probs, after, attn = model.decode_step(tgt_in[:, 1], memory, state)
    expected, h, attentional, weights = luong_step_by_hand(model, tgt_in[:, 1], memory, state.feed,
                                                           state.hidden[:, 0])
    torch.testing.assert_close(attn, weights)
    torch.testing.assert_close(after.hidden[:, 0], h)
    torch.testing.assert_close(after.feed, attentional)
    torch.testing.assert_close(log_probs, expected)


def test_luong_teacher_forcing_at_once_is_eq_5_at_every_step():
    """Without input feeding `forward` runs the steps at once (`LuongDecoder.over_time`): its logits are those
    of eq. 5 and 6 computed step by step by hand from the model's weights."""
    model = make(**LUONG_BY_HAND, input_feeding=False)
    assert model.decoder.steps_at_once
    src, mask, tgt_in = batch()
    memory = model.encode(src, mask)
    hidden, expected = model.init_state(memory).hidden[:, 0], []
    for t in range(tgt_in.size(1)):
        log_probs, hidden, _, _ = luong_step_by_hand(model, tgt_in[:, t], memory, None, hidden)
        expected.append(log_probs)
    torch.testing.assert_close(model(src, mask, tgt_in).log_softmax(-1), torch.stack(expected, dim=1))


def test_a_bahdanau_step_is_the_readout_of_the_new_state_context_and_input():
    """Bahdanau et al. (2015), eq. 4-6 with additive scores, from the model's weights: the context from the
    previous state, e_s = v_a^T tanh(W_a s_{t-1} + U_a h_s + b), the cell fed [E y; c_t], and the deep output
    o_t = tanh(W_o [s_t; c_t; E y] + b_o) under the output layer."""
    model = make(decoder="bahdanau", attention="additive", cell="gru", decoder_layers=1, dropout=0.0)
    decoder, score = model.decoder, model.decoder.context.attention.score
    src, mask, tgt_in = batch()
    memory = model.encode(src, mask)
    _, state, _ = model.decode_step(tgt_in[:, 0], memory, model.init_state(memory))
    log_probs, after, attn = model.decode_step(tgt_in[:, 1], memory, state)
    previous, embedded = state.hidden[:, 0], model.tgt_embed.weight[tgt_in[:, 1]]  # (B, H), (B, E)
    hidden = torch.tanh((previous @ score.W_a.weight.T)[:, None] + memory.states @ score.U_a.weight.T
                        + score.U_a.bias)  # (B, S, A)
    weights, context = attend_by_hand(hidden @ score.v_a.weight[0], memory)
    s = gru_by_hand(decoder.cells.cells[0], torch.cat([embedded, context], dim=-1), previous)
    readout = torch.tanh(torch.cat([s, context, embedded], dim=-1) @ decoder.readout.weight.T + decoder.readout.bias)
    expected = (readout @ model.output.weight.T + model.output.bias).log_softmax(-1)
    torch.testing.assert_close(attn, weights)
    torch.testing.assert_close(after.hidden[:, 0], s)
    torch.testing.assert_close(log_probs, expected)
