"""Export a trained Transformer to CTranslate2, a C++ inference engine for Transformer models.

    nmt export --format ctranslate2 -c runs/multi30k_transformer/best.pt -o ct2_model

writes a CTranslate2 model folder (`model.bin`, `config.json`, the vocabularies)
and the sentencepiece model(s) beside it, so the folder alone is enough to translate:

    import ctranslate2, sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file="ct2_model/spm.model")
    translator = ctranslate2.Translator("ct2_model")
    pieces = sp.encode(["Ein Mann fährt Fahrrad."], out_type=str)
    out = translator.translate_batch(pieces, beam_size=5)
    sp.decode(out[0].hypotheses[0])

How our Transformer maps onto CTranslate2's `TransformerSpec`, piece by piece:

- pre-norm or post-norm residual blocks: the spec's `pre_norm`; each block's
  LayerNorm is the `layer_norm` of the attention or feed-forward spec it wraps,
  and pre-norm stacks end in the spec's final `layer_norm` (post-norm ones have none);
- embeddings are multiplied by sqrt(D) in both (`scale_embeddings`);
- positions: CTranslate2's built-in sinusoidal table is OpenNMT-tf's (all sines,
  then all cosines, frequencies 10000^(-i / (D/2 - 1)), the first token at
  position 1: measured, it scores like that table to 2e-6), while ours interleaves
  sin and cos at 10000^(-2i / D) from position 0 (Vaswani et al., 2017, §3.5); so
  our table, or the learned one, is written into `position_encodings`, row p
  serving the token at position p in both;
- self-attention projections are fused into one (3D, D) matrix in q, k, v
  order; cross-attention keeps the query apart and fuses k, v;
- ReLU, or erf GELU (torch's `nn.GELU()`, CTranslate2's `Activation.GELU`);
- tied embeddings are the same array three times, which the spec stores once;
- the output projection has no bias in our model; the export gives it one that
  is 0 everywhere except -inf on PAD and BOS, because `nmt.decode.search` never
  emits those two tokens and CTranslate2 has no such rule of its own;
- the source gets EOS appended, as `nmt` reads it (`add_source_eos`), and the
  target starts from BOS (`decoder_start_token`).

With these, greedy output is the same as `nmt translate --beam 1` (the tests
compare them token for token). Search settings that differ are the caller's to
pass: CTranslate2's `max_decoding_length` is one number for the batch (ours is
`max_len_a * S + max_len_b` per sentence), its `min_decoding_length` defaults to 1
(ours to 0), and its length penalty divides by length ** alpha, not by GNMT's
((5 + length) / 6) ** alpha, so beam search can rank a few hypotheses
differently (greedy scores are divided by it too: pass `length_penalty=0` for
the plain log-probability). Scores are a little higher than `nmt`'s: the -inf
bias renormalises each step over the vocabulary less PAD and BOS, where `nmt`
normalises over all of it and then excludes them. Positions end at the model's
`max_positions` in both engines: CTranslate2 raises an error past it, so keep its
`max_input_length` and `max_decoding_length` (1024 and 256 by default) within it.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from nmt.checkpoint import load_checkpoint, model_from_checkpoint
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer
from nmt.errors import UserError
from nmt.fileio import check_folder_to_write, disk_full, disk_full_error, umask

if TYPE_CHECKING:
    from ctranslate2.specs import TransformerSpec

    from nmt.models.multihead import MultiHeadAttention
    from nmt.models.transformer import Transformer
    from nmt.models.transformer_layers import Residual

FORMATS = ("ctranslate2",)
QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
"""CTranslate2's weight types (`ctranslate2.specs.model_spec.ACCEPTED_MODEL_TYPES`); none: as trained (float32)."""
_MODEL_FILES = ("model.bin", "config.json")
"""What makes a folder a CTranslate2 model."""
_EXPORT_FILE = re.compile(r"^(model\.bin|config\.json|\w+_vocabulary\.(json|txt)|spm(\.src|\.tgt)?\.model)$")
"""Every file an export writes: `--force` replaces a folder that holds nothing else."""


def export_checkpoint(
    checkpoint: str | Path, output_dir: str | Path, *, format: str = "ctranslate2",
    quantization: str | None = None, force: bool = False,
) -> Path:
    """Convert a Transformer checkpoint into a CTranslate2 model folder with its sentencepiece model(s).

    Args:
        checkpoint: an `nmt` checkpoint (best.pt, an averaged one...).
        output_dir: the folder to create.
        format: one of `FORMATS`.
        quantization: one of `QUANTIZATIONS`, or None to keep float32 weights.
        force: replace `output_dir` if it holds an earlier CTranslate2 model.

    Returns:
        `output_dir`.

    Raises:
        UserError: unknown format or quantization, ctranslate2 not installed, an RNN
            checkpoint, or an `output_dir` that exists (and is not an export to replace).
    """
    if format not in FORMATS:
        raise UserError(f"--format {format!r}: not one of {', '.join(FORMATS)}")
    if quantization is not None and quantization not in QUANTIZATIONS:
        raise UserError(f"--quantization {quantization!r}: not one of {', '.join(QUANTIZATIONS)}")
    output = Path(output_dir)
    _check_output(output, force)
    _import_ctranslate2()
    model, tokenizer, cfg = model_from_checkpoint(load_checkpoint(checkpoint), source=checkpoint)
    if cfg.model.type != "transformer":
        raise UserError(f"{checkpoint}: an {cfg.model.type.upper()} model; CTranslate2 runs Transformers only, "
                        "so only Transformer checkpoints can be exported")
    spec = transformer_spec(model.eval(), tokenizer)
    spec.validate()
    spec.optimize(quantization=quantization)
    _write_model(spec, tokenizer, output)
    return output


def _write_model(spec: TransformerSpec, tokenizer: Tokenizer, output: Path) -> None:
    """Save `spec` and the sentencepiece model(s) as the folder `output`, replacing an earlier export there.

    Written beside the destination, then renamed: an error leaves no half-written model behind and an
    earlier export as it was. `output` is resolved first: "." or "x/.." name no folder beside them
    (`Path(".").parent` is "." itself), so the new model would be written inside the one it replaces.
    """
    target = output.resolve()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        spec.save(str(staging))
        tokenizer.save(staging)
        # mkdtemp's 0700 (and 0600 of files written atomically) would hide the model from colleagues
        mask = umask()
        staging.chmod(0o777 & ~mask)
        for path in staging.iterdir():
            path.chmod(0o666 & ~mask)
        _swap_in(staging, target)
    except BaseException as err:
        shutil.rmtree(staging, ignore_errors=True)
        if disk_full(err):
            raise disk_full_error(output, "a model already there is unchanged") from None
        raise


def _swap_in(staging: Path, target: Path) -> None:
    """Rename `staging` to `target`; an earlier `target` is moved aside first, and back if the rename fails."""
    if not target.exists():
        staging.rename(target)
        return
    previous = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
    target.replace(previous)  # onto the empty folder mkdtemp made
    try:
        staging.rename(target)
    except BaseException:
        previous.replace(target)
        raise
    shutil.rmtree(previous, ignore_errors=True)


def transformer_spec(model: Transformer, tokenizer: Tokenizer) -> TransformerSpec:
    """The CTranslate2 `TransformerSpec` holding `model`'s weights and `tokenizer`'s vocabularies.

    See the module docstring for how each part maps. The spec is not yet validated.
    """
    from ctranslate2.specs import (  # optional (the export extra): deferred
        TransformerSpec,
        common_spec,
    )

    encoder, decoder = model.encoder, model.decoder
    ffn = encoder.layers[0].feed_forward
    activation = common_spec.Activation.RELU if isinstance(ffn.act, nn.ReLU) else common_spec.Activation.GELU
    if isinstance(ffn.act, nn.GELU) and ffn.act.approximate != "none":
        raise UserError(f"GELU approximation {ffn.act.approximate!r} has no CTranslate2 equivalent")
    pre_norm = isinstance(encoder.norm, nn.LayerNorm)
    spec = TransformerSpec.from_config(
        (len(encoder.layers), len(decoder.layers)), encoder.layers[0].self_attn.heads,
        pre_norm=pre_norm, activation=activation,
    )
    eps = encoder.layers[0].attn_res.norm.eps
    _set_config(spec, tokenizer, eps)

    enc = spec.encoder
    enc.embeddings[0].weight = _array(encoder.embed.weight)
    enc.position_encodings.encodings = _positions(encoder.positions)
    if pre_norm:
        _set_norm(enc.layer_norm, encoder.norm)
    for layer_spec, layer in zip(enc.layer, encoder.layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.attn_res)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.ff_res)

    dec = spec.decoder
    dec.embeddings.weight = _array(decoder.embed.weight)
    dec.position_encodings.encodings = _positions(decoder.positions)
    if pre_norm:
        _set_norm(dec.layer_norm, decoder.norm)
    for layer_spec, layer in zip(dec.layer, decoder.layers):
        _set_self_attention(layer_spec.self_attention, layer.self_attn, layer.self_res)
        _set_cross_attention(layer_spec.attention, layer.cross_attn, layer.cross_res)
        _set_feed_forward(layer_spec.ffn, layer.feed_forward, layer.ff_res)
    dec.projection.weight = _array(model.output.weight)
    bias = np.zeros(model.output.weight.shape[0], dtype=np.float32)
    bias[[PAD_ID, BOS_ID]] = -np.inf  # never emitted, as in nmt's search
    dec.projection.bias = bias

    spec.register_source_vocabulary(_pieces(tokenizer.src))
    spec.register_target_vocabulary(_pieces(tokenizer.tgt))
    return spec


# --------------------------------------------------------------------------- helpers


def _set_config(spec: TransformerSpec, tokenizer: Tokenizer, eps: float) -> None:
    config = spec.config
    config.unk_token = tokenizer.tgt.id_to_piece(UNK_ID)
    config.bos_token = config.decoder_start_token = tokenizer.tgt.id_to_piece(BOS_ID)
    config.eos_token = tokenizer.tgt.id_to_piece(EOS_ID)
    config.add_source_eos = True  # nmt's encoder reads "... </s>"
    config.layer_norm_epsilon = eps


def _set_self_attention(spec, attn: MultiHeadAttention, res: Residual) -> None:
    _set_norm(spec.layer_norm, res.norm)
    _set_linear(spec.linear[0], attn.qkv_proj)  # (3D, D): q, k, v
    _set_linear(spec.linear[1], attn.out_proj)


def _set_cross_attention(spec, attn: MultiHeadAttention, res: Residual) -> None:
    _set_norm(spec.layer_norm, res.norm)
    _set_linear(spec.linear[0], attn.q_proj)
    _set_linear(spec.linear[1], attn.kv_proj)  # (2D, D): k, v of the encoder output
    _set_linear(spec.linear[2], attn.out_proj)


def _set_feed_forward(spec, ffn, res: Residual) -> None:
    _set_norm(spec.layer_norm, res.norm)
    _set_linear(spec.linear_0, ffn.up)
    _set_linear(spec.linear_1, ffn.down)


def _set_linear(spec, *linears: nn.Linear) -> None:
    """One linear layer, or several stacked along the output dimension (a fused projection)."""
    spec.weight = _array(torch.cat([lin.weight for lin in linears], dim=0))  # (out, in)
    spec.bias = _array(torch.cat([lin.bias for lin in linears], dim=0))


def _set_norm(spec, norm: nn.LayerNorm) -> None:
    spec.gamma = _array(norm.weight)
    spec.beta = _array(norm.bias)


def _positions(positions: nn.Module) -> np.ndarray:
    """The (L, D) table of `SinusoidalPositions` or `LearnedPositions`."""
    table = positions.table if hasattr(positions, "table") else positions.weight
    return _array(table)


def _array(t: Tensor) -> np.ndarray:
    return np.ascontiguousarray(t.detach().float().cpu().numpy())


def _pieces(sp) -> list[str]:
    return [sp.id_to_piece(i) for i in range(sp.get_piece_size())]


def _check_output(output: Path, force: bool) -> None:
    if output.is_symlink():
        raise UserError(f"{output}: a symbolic link; give the folder it points to ({os.path.realpath(output)}) "
                        "or a new folder")
    if output.exists() and not output.is_dir():
        raise UserError(f"{output}: exists and is not a folder; give a new folder for the model")
    check_folder_to_write(output, "-o")
    if output.is_dir() and any(output.iterdir()):
        is_model = all((output / name).is_file() for name in _MODEL_FILES)
        if not is_model:
            raise UserError(f"{output}: folder exists and is not a CTranslate2 model; give a new folder")
        if not force:
            raise UserError(f"{output}: already holds a CTranslate2 model; add --force to replace it")
        others = sorted(p.name for p in output.iterdir() if not _EXPORT_FILE.match(p.name))
        if others:
            raise UserError(f"{output}: holds files an export does not write (such as {others[0]!r}), which "
                            "--force would delete; give a new folder")


def _import_ctranslate2() -> None:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        raise UserError("ctranslate2 is not installed; install it with: pip install 'nmt[export]'") from None
