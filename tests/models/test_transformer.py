import itertools
import math

import pytest
import torch
import torch.nn.functional as F

from nmt.models.contract import Memory, Seq2Seq
from nmt.models.masks import (
    block_bias,
    pad_mask_from_tokens,
    sentences_per_row,
)
from nmt.models.transformer import Transformer, TransformerState
from tests.models.tiny import padded_batch
from tests.op_counts import OpCounter

PAD, BOS, V = 0, 1, 13


def make_model(seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    kwargs = dict(
        src_vocab_size=V, tgt_vocab_size=V, pad_id=PAD, d_model=16, heads=4, encoder_layers=2, decoder_layers=2,
        ff_dim=32, dropout=0.1, attention_dropout=0.1, activation_dropout=0.1, activation="relu", norm="pre",
        positions="sinusoidal", max_positions=32, attention_impl="manual", tie_embeddings="decoder",
    )  # fmt: skip
    kwargs.update(overrides)
    return Transformer(**kwargs).eval()


def batch(seed: int = 1):
    """Source (3, 7) with padding in two rows, target prefix (3, 6) starting with BOS."""
    src, pad, tgt = padded_batch([5, 7, 3], vocab=V, seed=seed, tgt_len=6, low=2, pad_id=PAD)
    tgt[:, 0] = BOS
    return src, pad, tgt


# --------------------------------------------------------------------------- attention


def test_fp32_search_steps_on_a_cpu_attend_by_matrix_products_and_the_rest_by_the_fused_kernel():
    src, src_mask, tgt = batch()
    model = make_model(attention_impl="sdpa")
    fused = "_scaled_dot_product_flash_attention_for_cpu"
    with torch.no_grad():
        with OpCounter() as ops:
            memory = model.encode(src, src_mask)
            model.decode(tgt, memory)
        assert ops.counts[fused] == 2 + 2 * 2, ops.counts  # encoder self-attention, decoder self and cross
        state = model.init_state(memory)
        with OpCounter() as ops:
            model.decode_step(tgt[:, 0], memory, state)
        assert not ops.counts[fused] and ops.counts["bmm"] == 2 * 2 * 2, ops.counts  # two products a call
        model.to(torch.bfloat16)  # bf16 keeps the kernel: its products gained nothing and kept more memory
        memory = model.encode(src, src_mask)
        with OpCounter() as ops:
            model.decode_step(tgt[:, 0], memory, model.init_state(memory))
    assert ops.counts[fused] == 2 * 2 and not ops.counts["bmm"], ops.counts


@pytest.mark.parametrize("norm", ["pre", "post"])
def test_manual_and_sdpa_models_agree(norm):
    src, src_mask, tgt = batch()
    manual = make_model(norm=norm, attention_impl="manual")
    fused = make_model(norm=norm, attention_impl="sdpa")
    fused.load_state_dict(manual.state_dict())
    torch.testing.assert_close(fused(src, src_mask, tgt), manual(src, src_mask, tgt), atol=1e-5, rtol=0)


def _torch_reference(model: Transformer, *, norm: str, activation: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """torch's own encoder and decoder stacks (`nn.TransformerEncoder`/`nn.TransformerDecoder`) holding `model`'s
    weights: every residual, LayerNorm, attention and feed-forward as torch writes them, the final LayerNorms
    with pre-norm only."""
    d, heads, ff = 16, 4, 32
    pre = norm == "pre"
    kinds = dict(dim_feedforward=ff, dropout=0.0, activation=activation, batch_first=True, norm_first=pre,
                 dtype=torch.float64)
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(d, heads, **kinds), 2,
                                          norm=torch.nn.LayerNorm(d, dtype=torch.float64) if pre else None,
                                          enable_nested_tensor=False)
    decoder = torch.nn.TransformerDecoder(torch.nn.TransformerDecoderLayer(d, heads, **kinds), 2,
                                          norm=torch.nn.LayerNorm(d, dtype=torch.float64) if pre else None)
    ours = model.state_dict()

    def take(prefix: str, names: dict[str, str]) -> dict[str, torch.Tensor]:
        return {theirs: ours[f"{prefix}.{mine}"] for theirs, mine in names.items()}

    common = {"self_attn.in_proj_weight": "self_attn.qkv_proj.weight",
              "self_attn.in_proj_bias": "self_attn.qkv_proj.bias",
              "self_attn.out_proj.weight": "self_attn.out_proj.weight",
              "self_attn.out_proj.bias": "self_attn.out_proj.bias",
              "linear1.weight": "feed_forward.up.weight", "linear1.bias": "feed_forward.up.bias",
              "linear2.weight": "feed_forward.down.weight", "linear2.bias": "feed_forward.down.bias"}
    for i, layer in enumerate(encoder.layers):
        layer.load_state_dict(take(f"encoder.layers.{i}", {
            **common, "norm1.weight": "attn_res.norm.weight", "norm1.bias": "attn_res.norm.bias",
            "norm2.weight": "ff_res.norm.weight", "norm2.bias": "ff_res.norm.bias"}))
    for i, layer in enumerate(decoder.layers):
        prefix = f"decoder.layers.{i}"
        cross = {"multihead_attn.in_proj_weight": torch.cat([ours[f"{prefix}.cross_attn.q_proj.weight"],
                                                             ours[f"{prefix}.cross_attn.kv_proj.weight"]]),
                 "multihead_attn.in_proj_bias": torch.cat([ours[f"{prefix}.cross_attn.q_proj.bias"],
                                                           ours[f"{prefix}.cross_attn.kv_proj.bias"]])}
        layer.load_state_dict({**cross, **take(prefix, {
            **common, "multihead_attn.out_proj.weight": "cross_attn.out_proj.weight",
            "multihead_attn.out_proj.bias": "cross_attn.out_proj.bias",
            "norm1.weight": "self_res.norm.weight", "norm1.bias": "self_res.norm.bias",
            "norm2.weight": "cross_res.norm.weight", "norm2.bias": "cross_res.norm.bias",
            "norm3.weight": "ff_res.norm.weight", "norm3.bias": "ff_res.norm.bias"})})
    if pre:
        encoder.norm.load_state_dict(take("encoder.norm", {"weight": "weight", "bias": "bias"}))
        decoder.norm.load_state_dict(take("decoder.norm", {"weight": "weight", "bias": "bias"}))
    return encoder.eval(), decoder.eval()


@pytest.mark.parametrize("norm, activation", [("pre", "relu"), ("post", "gelu")])
@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_the_model_computes_what_torchs_own_transformer_computes_with_its_weights(norm, activation, impl):
    """Vaswani et al. (2017) end to end against an independent implementation: torch's `nn.TransformerEncoder`
    and `nn.TransformerDecoder` given the model's weights, fed sqrt(D) x embedding + PE(pos) with the sinusoids
    of sec. 3.5 written here, then the output projection. Padding is the key padding mask of both attentions
    over the source, and the target is causally masked."""
    d = 16
    model = make_model(norm=norm, activation=activation, attention_impl=impl, dropout=0.0, attention_dropout=0.0,
                       activation_dropout=0.0, tie_embeddings="none").double()
    encoder, decoder = _torch_reference(model, norm=norm, activation=activation)
    src, src_mask, tgt = batch()

    def embed(weight: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(tokens.size(1), dtype=torch.float64)[:, None]  # (L, 1)
        angle = pos / 10000 ** (torch.arange(0, d, 2, dtype=torch.float64) / d)  # (L, D/2)
        pe = torch.stack([angle.sin(), angle.cos()], dim=-1).flatten(1)  # (L, D): sin at 2i, cos at 2i + 1
        return weight[tokens] * math.sqrt(d) + pe

    with torch.no_grad():
        memory = encoder(embed(model.encoder.embed.weight, src), src_key_padding_mask=src_mask)
        causal = torch.nn.Transformer.generate_square_subsequent_mask(tgt.size(1), dtype=torch.float64)
        states = decoder(embed(model.decoder.embed.weight, tgt), memory, tgt_mask=causal,
                         memory_key_padding_mask=src_mask)
        expected = states @ model.output.weight.T  # (B, T, V)
        logits = model(src, src_mask, tgt)
    # the model's sinusoid table is stored in fp32 (about 1e-8 off fp64's); the rest runs in fp64
    torch.testing.assert_close(logits, expected, atol=1e-6, rtol=0)
    assert not torch.allclose(logits[0], logits[0, :1]), "every position differs"


# --------------------------------------------------------------------------- masks


@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_future_target_tokens_never_change_earlier_logits(impl):
    """Causal self-attention, masked by the manual path and by the fused kernels' own `is_causal` (the
    decoder builds no mask for them)."""
    src, src_mask, tgt = batch()
    model = make_model(attention_impl=impl)
    memory = model.encode(src, src_mask)
    logits = model.decode(tgt, memory)
    changed = tgt.clone()
    changed[:, 4:] = (changed[:, 4:] + 5) % (V - 2) + 2
    logits2 = model.decode(changed, memory)
    torch.testing.assert_close(logits2[:, :4], logits[:, :4], atol=1e-6, rtol=0)
    assert not torch.allclose(logits2[:, 4:], logits[:, 4:])


def test_extra_source_padding_changes_nothing_and_gets_zero_attention():
    src, src_mask, tgt = batch()
    model = make_model(attention_impl="sdpa")
    padded = torch.cat([src, torch.full((3, 4), PAD)], dim=1)
    padded_mask = pad_mask_from_tokens(padded, PAD)
    torch.testing.assert_close(
        model(padded, padded_mask, tgt), model(src, src_mask, tgt), atol=1e-5, rtol=0
    )
    memory = model.encode(padded, padded_mask)
    _, _, attn = model.decode_step(tgt[:, 0], memory, model.init_state(memory), need_attn=True)
    assert attn.shape == (3, 11)
    assert torch.all(attn[padded_mask] == 0)
    assert torch.all(attn[~padded_mask] > 0)
    torch.testing.assert_close(attn.sum(-1), torch.ones(3))


def test_source_padding_bias_is_built_once_for_the_encoder_and_every_decoder_step():
    src, src_mask, tgt = batch()
    model = make_model(attention_impl="sdpa")
    with OpCounter() as ops:
        model(src, src_mask, tgt)
    assert ops.counts["masked_fill_"] == 1, ops.counts  # the encoder's, which cross-attention reuses
    memory = model.encode(src, src_mask)
    state = model.init_state(memory, max_len=6)
    with OpCounter() as ops:
        model.decode_step(tgt[:, 0], memory, state)
    assert not ops.counts["masked_fill_"] and not ops.counts["zeros"], ops.counts


# --------------------------------------------------------------------------- incremental decoding


@pytest.mark.parametrize("norm", ["pre", "post"])
@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
@pytest.mark.parametrize("impl", ["manual", "sdpa"])
def test_decode_step_matches_full_decode_also_after_reordering(norm, positions, impl):
    src, src_mask, tgt = batch()
    model = make_model(norm=norm, positions=positions, attention_impl=impl)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory).log_softmax(-1)  # (B, T, V)
        state = model.init_state(memory)
        for t in range(3):
            log_probs, state, attn = model.decode_step(tgt[:, t], memory, state)
            assert log_probs.dtype == torch.float32 and attn is None
            torch.testing.assert_close(log_probs, full[:, t], atol=1e-5, rtol=0)
        assert state.step == 3 and state.self_kv[0][0].shape == (3, 4, 3, 4)  # (B, H, t, Dh)

        order = torch.tensor([2, 0, 0, 1])  # permute and duplicate hypotheses
        state, memory = state.index_select(order), memory.index_select(order)
        reordered = model.decode(tgt[order], model.encode(src[order], src_mask[order])).log_softmax(-1)
        for t in range(3, 6):
            log_probs, state, _ = model.decode_step(tgt[order, t], memory, state)
            torch.testing.assert_close(log_probs, reordered[:, t], atol=1e-5, rtol=0)


@pytest.mark.parametrize("max_len", [None, 8])  # grown caches, preallocated buffers
@pytest.mark.parametrize("grad", [False, True])  # a step that records gradients copies the rows apart
def test_reorders_in_a_row_are_taken_as_one_by_the_next_step(max_len, grad):
    """A reorder is taken when the next step extends the caches: two in a row (one dropping a hypothesis)
    give the full decode of the hypotheses they pick together, and the state reordered leaves its caches
    to the state it came from."""
    src, src_mask, tgt = batch()
    model = make_model(attention_impl="sdpa")
    with torch.set_grad_enabled(grad):
        memory = model.encode(src, src_mask)
        state = model.init_state(memory, max_len=max_len)
        for t in range(3):
            _, state, _ = model.decode_step(tgt[:, t], memory, state)
        first, then = torch.tensor([2, 0, 0, 1]), torch.tensor([3, 1, 0])
        rows = first[then]  # [1, 0, 2]
        taken = state.index_select(first).index_select(then)
        assert taken.self_kv is state.self_kv and torch.equal(taken.order, rows)
        memory = memory.index_select(rows)
        full = model.decode(tgt[rows], model.encode(src[rows], src_mask[rows])).log_softmax(-1)
        for t in range(3, 6):
            log_probs, taken, _ = model.decode_step(tgt[rows, t], memory, taken)
            assert taken.order is None and taken.self_kv[0][0].size(0) == 3
            torch.testing.assert_close(log_probs, full[:, t], atol=1e-5, rtol=0)


def test_cross_attention_keys_and_values_are_computed_once():
    src, src_mask, tgt = batch()
    model = make_model()
    calls = []
    for layer in model.decoder.layers:
        layer.cross_attn.kv_proj.register_forward_hook(lambda *_: calls.append(1))
    memory = model.encode(src, src_mask)
    state = model.init_state(memory)
    assert isinstance(state, TransformerState) and len(calls) == 2
    for t in range(4):
        _, state, _ = model.decode_step(tgt[:, t], memory, state, need_attn=True)
    assert len(calls) == 2


def test_decode_step_does_not_modify_the_state_it_is_given():
    src, src_mask, tgt = batch()
    model = make_model()
    memory = model.encode(src, src_mask)
    state0 = model.init_state(memory)
    _, state1, _ = model.decode_step(tgt[:, 0], memory, state0)
    assert state0.step == 0 and state0.self_kv[0][0].shape[2] == 0
    assert state1.step == 1 and state1.self_kv[0][0].shape[2] == 1


def test_attention_layer_and_head_can_be_chosen():
    src, src_mask, tgt = batch()
    model = make_model()
    memory = model.encode(src, src_mask)
    state = model.init_state(memory)
    mean = model.decode_step(tgt[:, 0], memory, state, need_attn=True)[2]
    model.attn_head = 2
    head = model.decode_step(tgt[:, 0], memory, state, need_attn=True)[2]
    model.attn_layer, model.attn_head = 0, None
    first = model.decode_step(tgt[:, 0], memory, state, need_attn=True)[2]
    for a in (head, first):
        torch.testing.assert_close(a.sum(-1), torch.ones(3))
        assert not torch.allclose(a, mean)


# --------------------------------------------------------------------------- parameters


def test_model_satisfies_the_contract():
    model = make_model()
    assert isinstance(model, Seq2Seq)
    assert (model.src_vocab_size, model.tgt_vocab_size, model.pad_id) == (V, V, PAD)
    src, src_mask, tgt = batch()
    memory = model.encode(src, src_mask)
    assert isinstance(memory, Memory) and memory.states.shape == (3, 7, 16)
    assert model(src, src_mask, tgt).shape == (3, 6, V)


def test_tie_embeddings():
    none = make_model(tie_embeddings="none")
    src_w, tgt_w, out_w = none.encoder.embed.weight, none.decoder.embed.weight, none.output.weight
    assert len({src_w.data_ptr(), tgt_w.data_ptr(), out_w.data_ptr()}) == 3

    dec = make_model(tie_embeddings="decoder", src_vocab_size=17)
    assert dec.output.weight is dec.decoder.embed.weight
    assert dec.encoder.embed.weight is not dec.decoder.embed.weight

    every = make_model(tie_embeddings="all")
    assert every.encoder.embed.weight is every.decoder.embed.weight is every.output.weight
    shared = sum(p.numel() for p in every.parameters())
    assert sum(p.numel() for p in none.parameters()) - shared == 2 * V * 16

    with pytest.raises(ValueError, match=r"src_vocab_size \(17\) != tgt_vocab_size \(13\)"):
        make_model(tie_embeddings="all", src_vocab_size=17)


def test_tied_model_state_dict_round_trip():
    src, src_mask, tgt = batch()
    a, b = make_model(seed=0, tie_embeddings="all"), make_model(seed=1, tie_embeddings="all")
    b.load_state_dict(a.state_dict())
    assert b.output.weight is b.encoder.embed.weight
    torch.testing.assert_close(b(src, src_mask, tgt), a(src, src_mask, tgt), rtol=0, atol=0)


def test_invalid_options_raise_with_values():
    with pytest.raises(ValueError, match=r"d_model \(18\).*heads \(4\)"):
        make_model(d_model=18)
    with pytest.raises(ValueError, match=r"norm \('mid'\)"):
        make_model(norm="mid")
    with pytest.raises(ValueError, match=r"positions \('rope'\)"):
        make_model(positions="rope")
    with pytest.raises(ValueError, match=r"attention_pack \(-8\) must be >= 0"):
        make_model(attention_pack=-8)


def test_initialisation():
    model = make_model(tie_embeddings="none", d_model=64, heads=4)
    assert torch.equal(model.encoder.embed.weight[PAD], torch.zeros(64))
    assert model.decoder.embed.weight[1:].std().item() == pytest.approx(64**-0.5, rel=0.15)
    bound = (6 / (64 + 64)) ** 0.5  # xavier-uniform of each (D, D) block, as if each were its own layer
    for attn in (model.encoder.layers[0].self_attn, model.decoder.layers[0].cross_attn):
        linears = [attn.qkv_proj] if attn.self_attention else [attn.q_proj, attn.kv_proj]
        for linear in (*linears, attn.out_proj):
            for block in linear.weight.split(64):
                assert block.abs().max() <= bound and block.abs().max() > 0.9 * bound
            assert torch.equal(linear.bias, torch.zeros(linear.out_features))


def test_dropout_is_active_only_in_training():
    src, src_mask, tgt = batch()
    for impl in ("manual", "sdpa"):
        model = make_model(attention_impl=impl, dropout=0.3, attention_dropout=0.3)
        ref = model(src, src_mask, tgt)
        torch.testing.assert_close(model(src, src_mask, tgt), ref, rtol=0, atol=0)
        model.train()
        noisy = model(src, src_mask, tgt)
        assert torch.isfinite(noisy).all() and not torch.allclose(noisy, ref)


# --------------------------------------------------------------------------- learning


def test_overfits_a_reversal_batch():
    g = torch.Generator().manual_seed(0)
    seqs = torch.randint(2, V, (8, 6), generator=g)
    src = seqs
    tgt_out = seqs.flip(1)
    tgt_in = torch.cat([torch.full((8, 1), BOS), tgt_out[:, :-1]], dim=1)
    model = make_model(d_model=32, heads=4, encoder_layers=1, decoder_layers=1, ff_dim=64, dropout=0.0,
                       attention_dropout=0.0, activation_dropout=0.0, attention_impl="sdpa")  # fmt: skip
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=5e-3)
    src_mask = pad_mask_from_tokens(src, PAD)
    for _ in range(100):
        loss = F.cross_entropy(model(src, src_mask, tgt_in).reshape(-1, V), tgt_out.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    assert loss.item() < 0.05
    assert torch.equal(model(src, src_mask, tgt_in).argmax(-1), tgt_out)
    # Greedy decoding through the incremental contract reproduces the targets too.
    memory = model.encode(src, src_mask)
    state, tokens, out = model.init_state(memory), torch.full((8,), BOS), []
    for _ in range(6):
        log_probs, state, _ = model.decode_step(tokens, memory, state)
        tokens = log_probs.argmax(-1)
        out.append(tokens)
    assert torch.equal(torch.stack(out, 1), tgt_out)


def test_decode_step_under_bf16_autocast():
    src, src_mask, tgt = batch()
    model = make_model(attention_impl="sdpa")
    with torch.autocast("cpu", dtype=torch.bfloat16), torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory).float().log_softmax(-1)
        state = model.init_state(memory)
        for t in range(3):
            log_probs, state, _ = model.decode_step(tgt[:, t], memory, state)
            assert log_probs.dtype == torch.float32
            assert state.self_kv[0][0].dtype == memory.extra["cross_kv"][0][0].dtype == torch.bfloat16
            torch.testing.assert_close(log_probs, full[:, t], atol=0.05, rtol=0)


@pytest.mark.parametrize("layout", ["q, kv", "q, k, v"])
def test_checkpoints_with_separate_projections_still_load(layout):
    """Weights saved before self-attention projected with one qkv_proj (q_proj and kv_proj), and before that
    keys and values with one kv_proj (k_proj and v_proj everywhere), load strictly and give the same model."""
    model = make_model().eval()
    old = {}
    for name, t in model.state_dict().items():
        if ".qkv_proj." in name:
            q, kv = t.split([16, 32])
            old[name.replace("qkv_proj", "q_proj")], old[name.replace("qkv_proj", "kv_proj")] = q.clone(), kv.clone()
        else:
            old[name] = t
    if layout == "q, k, v":
        for name in [n for n in old if ".kv_proj." in n]:
            old[name.replace("kv_proj", "k_proj")], old[name.replace("kv_proj", "v_proj")] = old.pop(name).chunk(2)
    assert not any(".qkv_proj." in name for name in old)
    assert any(".k_proj." in name for name in old) == (layout == "q, k, v")
    fresh = make_model(seed=1).eval()
    fresh.load_state_dict(old)  # strict: no key missing, none left over
    src, src_mask, tgt = batch()
    with torch.no_grad():
        assert torch.equal(fresh(src, src_mask, tgt), model(src, src_mask, tgt))


# --------------------------------------------------------------------------- sentences side by side


def test_sentences_per_row_is_the_largest_divisor_of_the_batch_that_fits():
    assert [sentences_per_row(b, length, 16) for b, length in [(6, 7), (8, 4), (12, 5), (12, 4), (7, 4), (3, 20)]] == [
        2, 4, 3, 4, 1, 1]
    assert sentences_per_row(5, 2, 128) == 5  # never more than the batch


@pytest.mark.parametrize("causal", [False, True])
def test_block_bias_lets_each_query_see_its_own_sentence_only(causal):
    group, queries, keys = 3, 4, 5
    pad = torch.rand(6, keys, generator=torch.Generator().manual_seed(0)) < 0.3
    bias = block_bias(pad, group, queries, keys, causal=causal, dtype=torch.float32)
    assert bias.shape == (2, 1, group * queries, group * keys)
    for r, i, j in itertools.product(range(2), range(group * queries), range(group * keys)):
        sentence, q, k = r * group + i // queries, i % queries, j % keys
        seen = i // queries == j // keys and not pad[sentence, k] and not (causal and k > q)
        assert bias[r, 0, i, j] == (0 if seen else float("-inf")), (r, i, j)
    assert block_bias(None, group, queries, queries, causal=True, dtype=torch.float32).shape == (1, 1, 12, 12)


@pytest.mark.parametrize("pack", [16, 48])
def test_sentences_side_by_side_give_the_same_logits_and_gradients(pack, monkeypatch):
    """Rows of 2 sentences (pack 16: sources of 7 positions, targets of 6) or the whole batch of 6 in one row
    (48): the encoder's, the causal and the cross-attention calls all packed, against a sentence a row."""
    src, src_mask, tgt = padded_batch([5, 7, 3, 7, 2, 6], vocab=V, seed=4, tgt_len=6, low=2, pad_id=PAD)
    tgt[:, 0] = BOS
    options = dict(attention_impl="sdpa", dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    single, packed = make_model(**options), make_model(attention_pack=pack, **options)
    packed.load_state_dict(single.state_dict())
    rows = []
    sdpa = F.scaled_dot_product_attention
    monkeypatch.setattr(F, "scaled_dot_product_attention", lambda q, *a, **kw: rows.append(q.shape[:3]) or sdpa(q, *a, **kw))
    (packed(src, src_mask, tgt).log_softmax(-1)[..., 3].sum()).backward()
    per_row = 2 if pack == 16 else 6
    assert rows == [(6 // per_row, 4, per_row * 7)] * 2 + [(6 // per_row, 4, per_row * 6)] * 4  # queries of each call
    rows.clear()
    single(src, src_mask, tgt).log_softmax(-1)[..., 3].sum().backward()
    assert {r[0] for r in rows} == {6}
    torch.testing.assert_close(packed(src, src_mask, tgt), single(src, src_mask, tgt), atol=1e-5, rtol=0)
    for (name, a), b in zip(packed.named_parameters(), single.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_search_steps_of_a_packed_model_match_its_full_decode():
    src, src_mask, tgt = batch()
    model = make_model(attention_impl="sdpa", attention_pack=32)
    with torch.no_grad():
        memory = model.encode(src, src_mask)
        full = model.decode(tgt, memory).log_softmax(-1)  # the batch of 3 in one row
        state = model.init_state(memory, max_len=6)
        for t in range(tgt.size(1)):  # a sentence a row
            log_probs, state, _ = model.decode_step(tgt[:, t], memory, state)
            torch.testing.assert_close(log_probs, full[:, t], atol=1e-5, rtol=0)


@pytest.mark.gpu
def test_on_a_gpu_sentences_side_by_side_run_the_memory_efficient_kernel_in_bf16():
    """Each of the 6 attention calls (2 encoder, 2 x 2 decoder) of the packed bf16 model, forward and backward, by
    the fused kernel that takes a bias, none falling back to plain matrix products; logits as a sentence a row."""
    from nmt import kernels

    src, src_mask, tgt = (t.cuda() for t in padded_batch([5, 7, 3, 7, 2, 6, 8, 4], vocab=V, seed=4, tgt_len=8,
                                                           low=2, pad_id=PAD))
    # heads of 16: the memory-efficient kernel takes bf16 heads of a multiple of 8 only
    options = dict(attention_impl="sdpa", d_model=64, dropout=0.0, attention_dropout=0.0, activation_dropout=0.0)
    single = make_model(**options).cuda().to(torch.bfloat16)
    packed = make_model(attention_pack=64, **options).cuda().to(torch.bfloat16)
    packed.load_state_dict(single.state_dict())
    with kernels.attention_kernels(torch.device("cuda", 0)), OpCounter() as ops:
        logits = packed(src, src_mask, tgt)
        logits.float().logsumexp(-1).sum().backward()
    assert ops.counts["_scaled_dot_product_efficient_attention"] == 6, ops.counts
    assert ops.counts["_scaled_dot_product_efficient_attention_backward"] == 6, ops.counts
    assert not any("math" in name or "flash" in name for name in ops.counts), ops.counts
    torch.testing.assert_close(logits.float(), single(src, src_mask, tgt).float(), atol=0.05, rtol=0.05)
