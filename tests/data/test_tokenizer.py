"""sentencepiece tokenizer: special ids, round trips, joint and separate vocabularies, persistence."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import sentencepiece as spm

from nmt.config import TokenizerConfig
from nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    Tokenizer,
    _sample,
    _without_input_paths,
    train_tokenizer,
)
from nmt.errors import DataError


@pytest.fixture(scope="module")
def separate(corpus: tuple[list[str], list[str]]) -> Tokenizer:
    return train_tokenizer(TokenizerConfig(vocab_size=40, joint=False, type="unigram"), *corpus, seed=0)


def test_special_ids_are_fixed(tokenizer: Tokenizer, separate: Tokenizer) -> None:
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    for sp in (tokenizer.src, separate.src, separate.tgt):
        assert (sp.pad_id(), sp.unk_id(), sp.bos_id(), sp.eos_id()) == (PAD_ID, UNK_ID, BOS_ID, EOS_ID)
        assert [sp.id_to_piece(i) for i in range(4)] == ["<pad>", "<unk>", "<s>", "</s>"]


def test_encode_decode_round_trip(tokenizer: Tokenizer, corpus: tuple[list[str], list[str]]) -> None:
    de, en = corpus
    assert tokenizer.decode_tgt(tokenizer.encode_tgt(en[:50])) == en[:50]
    assert tokenizer.decode_tgt(tokenizer.encode_src(de[:50])) == de[:50]  # joint: one model
    ids = tokenizer.encode_tgt(["the big dog"])[0]
    assert min(ids) > EOS_ID  # no specials from encode
    assert tokenizer.decode_tgt([[BOS_ID, *ids, EOS_ID, PAD_ID, PAD_ID]]) == ["the big dog"]


def test_unseen_characters_map_to_unk(tokenizer: Tokenizer) -> None:
    assert UNK_ID in tokenizer.encode_src(["hund Ω"])[0]


def test_joint_and_separate_vocabularies(tokenizer: Tokenizer, separate: Tokenizer, corpus: tuple[list[str], list[str]]) -> None:
    assert tokenizer.joint and tokenizer.src is tokenizer.tgt
    assert tokenizer.src_vocab_size == tokenizer.tgt_vocab_size == 80
    assert not separate.joint
    assert separate.src_vocab_size == separate.tgt_vocab_size == 40
    src_pieces = {separate.src.id_to_piece(i) for i in range(40)}
    tgt_pieces = {separate.tgt.id_to_piece(i) for i in range(40)}
    assert src_pieces != tgt_pieces
    de, en = corpus
    assert UNK_ID not in {i for ids in separate.encode_src(de) for i in ids}
    assert UNK_ID not in {i for ids in separate.encode_tgt(en) for i in ids}
    assert separate.decode_tgt(separate.encode_tgt(en[:20])) == en[:20]


@pytest.mark.parametrize("which", ["joint", "separate"])
def test_state_and_save_load_round_trips(
    which: str, tokenizer: Tokenizer, separate: Tokenizer, corpus: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    tok = tokenizer if which == "joint" else separate
    de, en = corpus[0][:20], corpus[1][:20]
    restored = Tokenizer.from_state(tok.to_state())
    tok.save(tmp_path)
    loaded = Tokenizer.load(tmp_path)
    assert loaded is not None
    expected_files = ["spm.model"] if which == "joint" else ["spm.src.model", "spm.tgt.model"]
    assert sorted(p.name for p in tmp_path.iterdir()) == expected_files
    for other in (restored, loaded):
        assert other.joint == tok.joint
        assert other.encode_src(de) == tok.encode_src(de) and other.encode_tgt(en) == tok.encode_tgt(en)
        assert other.to_state() == tok.to_state()


def test_load_from_an_empty_folder_gives_none(tmp_path: Path) -> None:
    assert Tokenizer.load(tmp_path) is None


def test_vocab_too_large_for_the_text_names_the_setting(corpus: tuple[list[str], list[str]]) -> None:
    with pytest.raises(DataError, match=r"tokenizer\.vocab_size \(5000\) is too large"):
        train_tokenizer(TokenizerConfig(vocab_size=5000), corpus[0][:50], corpus[1][:50])


def test_no_training_text_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no joint training text"):
        train_tokenizer(TokenizerConfig(vocab_size=50), ["", ""], [])


def test_decoding_drops_unk_as_well_as_the_other_special_ids(tokenizer: Tokenizer) -> None:
    """A hypothesis holding <unk> detokenizes as if it were not there (sentencepiece alone would write ' ⁇ ')."""
    ids = tokenizer.encode_tgt(["the big dog"])[0]
    assert tokenizer.tgt.decode([UNK_ID, *ids]) != "the big dog"  # the premise: sentencepiece shows unknowns
    assert tokenizer.decode_tgt([[BOS_ID, UNK_ID, *ids[:1], UNK_ID, *ids[1:], EOS_ID, PAD_ID]]) == [
        tokenizer.tgt.decode(ids)]
    assert tokenizer.decode_tgt([[UNK_ID, PAD_ID], []]) == ["", ""]


@pytest.mark.parametrize("k", [1, 3, 7, 12, 50])
def test_sentence_sample_is_k_non_empty_lines_in_corpus_order(k: int) -> None:
    """`tokenizer.max_sentences` bounds the text sentencepiece trains on: k lines exactly (all when there are fewer),
    never an empty one, in the order of the corpus, the same for the same seed."""
    lines = [f"line {i}" if i % 4 else "" for i in range(48)]  # 36 non-empty lines
    text = [line for line in lines if line]
    for seed in range(20):
        sample = _sample(lines, k, seed)
        assert len(sample) == min(k, len(text))
        assert sample == [line for line in text if line in set(sample)]  # distinct and in corpus order
        assert _sample(iter(lines), k, seed) == sample  # reproducible, and from a one-pass iterator
    if k < len(text):  # a sample, not the first k lines: over seeds every line gets drawn
        drawn = {line for seed in range(500) for line in _sample(lines, k, seed)}
        assert drawn == set(text)


@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_input_paths_are_dropped_byte_for_byte_as_protobuf_drops_them(
    model_type: str, corpus: tuple[list[str], list[str]], tmp_path: Path
) -> None:
    """`_without_input_paths` reads the wire format itself, so that nmt needs no protobuf package; its
    bytes are those of sentencepiece's own generated protobuf module (where protobuf is installed)."""
    pb2 = pytest.importorskip("sentencepiece.sentencepiece_model_pb2")
    files = [tmp_path / "a-long-folder-name" / "src.txt", tmp_path / "tgt.txt"]
    files[0].parent.mkdir()
    for path, lines in zip(files, corpus):
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    raw = io.BytesIO()
    spm.SentencePieceTrainer.train(model_writer=raw, input=",".join(map(str, files)), model_type=model_type,
                                   vocab_size=60, minloglevel=2, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID,
                                   eos_id=EOS_ID)
    model = raw.getvalue()
    proto = pb2.ModelProto()
    proto.ParseFromString(model)
    assert list(proto.trainer_spec.input) == [str(f) for f in files]
    proto.trainer_spec.ClearField("input")
    stripped = _without_input_paths(model)
    assert stripped == proto.SerializeToString()
    assert str(files[0]).encode() not in stripped and len(stripped) < len(model)
    before, after = (spm.SentencePieceProcessor(model_proto=m) for m in (model, stripped))
    assert before.encode(corpus[0][:20]) == after.encode(corpus[0][:20])


def test_a_model_cut_short_is_refused_not_misread() -> None:
    with pytest.raises(ValueError, match="not a sentencepiece model"):
        _without_input_paths(b"\x12\x05ab")  # trainer_spec announces 5 bytes, 2 follow
