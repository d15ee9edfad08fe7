"""sentencepiece tokenizer: special ids, round trips, joint and separate vocabularies, persistence."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
import sentencepiece as spm

from nmt.config import TokenizerConfig
from nmt.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    MAX_SENTENCE_BYTES,
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


@pytest.mark.parametrize(("content", "why"), [(b"", "an empty file"), (b"junk", "INTERNAL: ")])
def test_a_damaged_model_in_the_run_directory_names_the_file_and_what_to_do(
    separate: Tokenizer, tmp_path: Path, content: bytes, why: str
) -> None:
    # Resuming a run whose spm.model was emptied or overwritten failed with "RuntimeError: INTERNAL: ..." and exit 1.
    separate.save(tmp_path)
    (tmp_path / "spm.tgt.model").write_bytes(content)
    with pytest.raises(DataError, match=rf"^{re.escape(str(tmp_path / 'spm.tgt.model'))}: not a sentencepiece model "
                                        rf"\({why}.*\), damaged since the run wrote it: restore it, or start the run "
                                        r"over with --restart$"):
        Tokenizer.load(tmp_path)


def test_vocab_too_large_for_the_text_names_the_setting(corpus: tuple[list[str], list[str]]) -> None:
    with pytest.raises(DataError, match=r"tokenizer\.vocab_size \(5000\) is too large"):
        train_tokenizer(TokenizerConfig(vocab_size=5000), corpus[0][:50], corpus[1][:50])


def test_no_training_text_is_a_data_error() -> None:
    with pytest.raises(DataError, match="no joint training text"):
        train_tokenizer(TokenizerConfig(vocab_size=50), ["", ""], [])


def test_text_whose_every_sentence_is_too_long_to_learn_from_says_how_to_fix_it(
        corpus: tuple[list[str], list[str]]) -> None:
    """A file whose lines end in '\\r' alone is one line of all its text, which sentencepiece skips: the error was
    its internal check, "INTERNAL: src/trainer_interface.cc(467) [!sentences_.empty()]"."""
    src, tgt = ("\r".join(side * 10) for side in corpus)
    assert min(len(src.encode()), len(tgt.encode())) > MAX_SENTENCE_BYTES
    with pytest.raises(DataError) as err:
        train_tokenizer(TokenizerConfig(vocab_size=50), [src], [tgt], where="data.train (mac/train)")
    assert str(err.value) == ("data.train (mac/train): every sentence of the joint text is longer than the 65,536 "
                              "bytes sentencepiece learns from; only '\\n' ends a line: convert a file whose lines end "
                              "in '\\r' alone (an old Mac file) with `tr '\\r' '\\n'`, or split its text into sentences")


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


def _many_scripts(n: int) -> tuple[list[str], list[str]]:
    """English sources and targets in scripts beyond Latin, each with characters NFKC changes or drops: Chinese
    with full-width punctuation and digits, Persian with ZWNJ, Hindi with combining marks, Hebrew with points,
    and emoji outside the BMP joined by ZWJ."""
    han = [chr(0x4E00 + 61 * i) for i in range(40)]
    targets = ["".join(han[(n * 7 + i) % 40] for i in range(4)) + "\uff0c" + han[n % 40] + "\uff11\u3002",
               "\u0645\u06cc\u200c\u062e\u0648\u0627\u0647\u0645 \u06a9\u062a\u0627\u0628",
               "\u0915\u094d\u0937\u093f\u0924\u093f\u091c \u0939\u093f\u0902\u0926\u0940\u0964",
               "\u05e9\u05b8\u05c1\u05dc\u05d5\u05b9\u05dd \U0001F468\u200d\U0001F469\u200d\U0001F467 \U0001F44D\U0001F3FD"]
    tgt = [targets[i % 4] if i % 4 else targets[0].replace(han[0], han[i % 40]) for i in range(n)]
    return [f"the sentence number {i}" for i in range(n)], tgt


def test_a_normalization_that_changes_the_target_text_warns_and_identity_keeps_it_byte_for_byte(caplog) -> None:
    """sentencepiece's default NFKC turns the Chinese full-width comma into ',' and Persian's ZWNJ into a space:
    the model then writes text its references do not hold. Training says so, and `identity` keeps the text."""
    src, tgt = _many_scripts(80)
    with caplog.at_level("WARNING", logger="nmt.data.tokenizer"):
        nfkc = train_tokenizer(TokenizerConfig(vocab_size=150), src, tgt, seed=0, where="data.train (t)")
    assert nfkc.decode_tgt(nfkc.encode_tgt(tgt[:2])) == [tgt[0].replace("\uff0c", ",").replace("\uff11", "1"),
                                                          tgt[1].replace("\u200c", " ")]
    assert [r.getMessage() for r in caplog.records] == [
        "data.train (t): sentencepiece's nmt_nfkc normalization changes 40 of 80 target sentences ('\uff0c' U+FF0C "
        "becomes ','): the model learns and writes the normalized text, which the references do not hold; set "
        "tokenizer.normalization: identity to keep the text as it is"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="nmt.data.tokenizer"):
        identity = train_tokenizer(TokenizerConfig(vocab_size=150, normalization="identity"), src, tgt, seed=0)
        separate = train_tokenizer(TokenizerConfig(vocab_size=100, normalization="identity", joint=False), src, tgt)
    assert not caplog.records
    for tokenizer in (identity, separate):
        assert tokenizer.decode_tgt(tokenizer.encode_tgt(tgt)) == tgt
        assert UNK_ID not in sum(tokenizer.encode_tgt(tgt), [])


def test_a_vocabulary_below_the_characters_of_chinese_says_which_coverage_is_usual() -> None:
    """A Chinese corpus has thousands of characters; at coverage 1.0 each takes a piece, and the error names
    the coverage sentencepiece advises for it."""
    han = [chr(0x4E00 + i) for i in range(600)]
    tgt = ["".join(han[(n * 13 + i * 7) % 600] for i in range(8)) + "\u3002" for n in range(300)]
    src = [f"sentence {n}" for n in range(300)]
    with pytest.raises(DataError) as err:
        train_tokenizer(TokenizerConfig(vocab_size=300), src, tgt, where="data.train (zh)")
    assert re.fullmatch(r"tokenizer.vocab_size \(300\) is below the (\d+) pieces that the characters of the joint "
                        r"text of data.train \(zh\) and the special symbols take; raise it to at least \1, or lower "
                        r"tokenizer.character_coverage \(1\) \(0.9995 is usual for Chinese and Japanese, whose "
                        r"thousands of characters include many rare ones: those then become <unk>\)", str(err.value))
    with pytest.raises(DataError, match=r"lower tokenizer.character_coverage \(0.9995\)$"):
        train_tokenizer(TokenizerConfig(vocab_size=300, character_coverage=0.9995), src, tgt, where="data.train (zh)")


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
