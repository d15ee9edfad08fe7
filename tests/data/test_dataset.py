"""Tokenized splits: ids and lengths, the length and ratio filters, and split preparation."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
import torch
from datasets import Dataset

from nmt.config import CorpusConfig, DataConfig, TokenizerConfig, config_from_dict
from nmt.data.cleaning import PY_WHITESPACE
from nmt.data.dataset import prepare_split, tokenize_pairs
from nmt.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, Tokenizer, train_tokenizer
from nmt.errors import DataError
from nmt.models import build_model
from nmt.translate import Translator
from tests.conftest import tiny_config_dict


def pair_dataset(src: list[str], tgt: list[str]) -> Dataset:
    return Dataset.from_dict({"src": src, "tgt": tgt})


def test_ids_lengths_and_text_columns(tokenizer: Tokenizer, corpus: tuple[list[str], list[str]]) -> None:
    de, en = corpus[0][:50], corpus[1][:50]
    ds, report = tokenize_pairs(pair_dataset(de, en), tokenizer, max_len=None, max_ratio=0.0)
    assert report == {"too_long": 0, "ratio": 0}
    assert ds.column_names == ["src", "tgt", "src_ids", "tgt_ids", "src_len", "tgt_len"]
    assert ds.features["src_ids"].feature.dtype == "int32"
    assert ds["src"] == de and ds["tgt"] == en
    for row, src_ids, tgt_ids in zip(ds, tokenizer.encode_src(de), tokenizer.encode_tgt(en)):
        assert row["src_ids"] == [*src_ids, EOS_ID]
        assert row["tgt_ids"] == tgt_ids and BOS_ID not in tgt_ids and EOS_ID not in tgt_ids
        assert row["src_len"] == len(src_ids) + 1
        assert row["tgt_len"] == len(tgt_ids) + 1


def test_filters_drop_exactly_the_expected_pairs(tokenizer: Tokenizer, corpus: tuple[list[str], list[str]]) -> None:
    de, en = corpus[0][:200], corpus[1][:200]
    # Unbalanced pairs: one word against many.
    de += ["hund", "hund hund hund hund"]
    en += ["dog dog dog dog", "dog"]
    src_len = [len(ids) + 1 for ids in tokenizer.encode_src(de)]
    tgt_len = [len(ids) + 1 for ids in tokenizer.encode_tgt(en)]
    max_len, max_ratio = 25, 2.0
    too_long = [s > max_len or t > max_len for s, t in zip(src_len, tgt_len)]
    unbalanced = [not long and max(s, t) / min(s, t) > max_ratio for s, t, long in zip(src_len, tgt_len, too_long)]
    assert sum(too_long) > 0 and sum(unbalanced) >= 2  # the data exercises both filters
    expected = [(d, e) for d, e, a, b in zip(de, en, too_long, unbalanced) if not (a or b)]

    ds, report = tokenize_pairs(pair_dataset(de, en), tokenizer, max_len=max_len, max_ratio=max_ratio)
    assert report == {"too_long": sum(too_long), "ratio": sum(unbalanced)}
    assert list(zip(ds["src"], ds["tgt"])) == expected
    assert max(ds["src_len"]) <= max_len and max(ds["tgt_len"]) <= max_len


def test_tokenizing_is_cached_by_tokenizer(tmp_path: Path, tokenizer: Tokenizer, corpus: tuple[list[str], list[str]]) -> None:
    pair_dataset(*corpus).save_to_disk(tmp_path / "pairs")
    source = Dataset.load_from_disk(tmp_path / "pairs")
    first, _ = tokenize_pairs(source, tokenizer, max_len=None, max_ratio=0.0)
    again, _ = tokenize_pairs(source, Tokenizer.from_state(tokenizer.to_state()), max_len=None, max_ratio=0.0)
    assert first.cache_files and again.cache_files == first.cache_files
    assert Path(first.cache_files[0]["filename"]).parent == tmp_path / "pairs"
    other = train_tokenizer(TokenizerConfig(vocab_size=60), corpus[0], corpus[1])
    third, _ = tokenize_pairs(source, other, max_len=None, max_ratio=0.0)
    assert third.cache_files != first.cache_files


def test_parallel_tokenizing_matches_serial(tokenizer: Tokenizer, corpus: tuple[list[str], list[str]]) -> None:
    ds = pair_dataset(*corpus)
    serial, _ = tokenize_pairs(ds, tokenizer, max_len=None, max_ratio=0.0)
    parallel, _ = tokenize_pairs(ds, tokenizer, max_len=None, max_ratio=0.0, num_proc=2)
    assert parallel["src_ids"] == serial["src_ids"] and parallel["tgt_ids"] == serial["tgt_ids"]


def write_corpus(prefix: Path, de: list[str], en: list[str]) -> None:
    prefix.with_suffix(".de").write_text("".join(f"{line}\n" for line in de), encoding="utf-8")
    prefix.with_suffix(".en").write_text("".join(f"{line}\n" for line in en), encoding="utf-8")


def test_prepare_split_filters_training_only(tmp_path: Path, tokenizer: Tokenizer) -> None:
    de = ["hund", "", "katze hund baum haus mann frau kind buch", "haus"]
    en = ["dog", "nothing", "cat dog tree house man woman child book", "house"]
    write_corpus(tmp_path / "split", de, en)
    spec = CorpusConfig(kind="text", path=str(tmp_path / "split"))
    cfg = DataConfig(train=spec, valid=spec, max_len=8, max_ratio=0.0)

    train, report = prepare_split(spec, cfg, tokenizer, cache_dir=tmp_path / "cache", train=True)
    assert train.column_names == ["src_ids", "tgt_ids", "src_len", "tgt_len"]  # no text: nothing reads it
    assert train["src_ids"][:] == [[*ids, EOS_ID] for ids in tokenizer.encode_src(["hund", "haus"])]
    assert report == {"pairs": 4, "empty": 1, "too_long": 1, "ratio": 0, "kept": 2}
    valid, report = prepare_split(spec, cfg, tokenizer, cache_dir=tmp_path / "cache", train=False)
    assert valid["tgt"] == ["dog", "cat dog tree house man woman child book", "house"]
    assert report["kept"] == 3 and report["too_long"] == 0


def test_prepare_split_with_nothing_left_names_split_and_filter(tmp_path: Path, tokenizer: Tokenizer) -> None:
    write_corpus(tmp_path / "train", ["katze hund baum haus", "mann frau kind buch", ""], ["cat dog tree house", "man woman child book", "x"])
    write_corpus(tmp_path / "dev", ["", " "], ["a", "b"])
    train = CorpusConfig(kind="text", path=str(tmp_path / "train"))
    valid = CorpusConfig(kind="text", path=str(tmp_path / "dev"))
    cfg = DataConfig(train=train, valid=valid, max_len=3)
    with pytest.raises(DataError, match=r"data\.train \(.*train\): no pairs left of 3 read: dropped 1 with an empty side, 2 longer than data\.max_len=3"):
        prepare_split(train, cfg, tokenizer, cache_dir=tmp_path / "cache", train=True)
    with pytest.raises(DataError, match=r"data\.valid \(.*dev\): no pairs left of 2 read: dropped 2 with an empty side$"):
        prepare_split(valid, cfg, tokenizer, cache_dir=tmp_path / "cache", train=False)


def test_ratio_filter_keeps_a_pair_exactly_at_max_ratio_and_drops_the_ones_above(tokenizer: Tokenizer) -> None:
    """`max_ratio` is the largest ratio kept: a pair at exactly max(src_len, tgt_len) / min(...) == max_ratio stays."""
    de = [" ".join(["hund"] * a) for a in range(1, 7) for _ in range(1, 7)]
    en = [" ".join(["dog"] * b) for _ in range(1, 7) for b in range(1, 7)]
    lens = [(len(s) + 1, len(t) + 1) for s, t in zip(tokenizer.encode_src(de), tokenizer.encode_tgt(en))]
    ratios = [Fraction(max(s, t), min(s, t)) for s, t in lens]
    max_ratio = 2.0
    assert Fraction(max_ratio) in ratios and any(r > max_ratio for r in ratios)  # both sides of the limit occur
    expected = [(d, e) for d, e, r in zip(de, en, ratios) if r <= Fraction(max_ratio)]

    ds, report = tokenize_pairs(pair_dataset(de, en), tokenizer, max_len=None, max_ratio=max_ratio)
    assert list(zip(ds["src"], ds["tgt"])) == expected
    assert report == {"too_long": 0, "ratio": len(de) - len(expected)}


def test_validation_splits_are_not_ratio_filtered(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """`data.max_ratio` drops unbalanced training pairs only: validation keeps every cleaned pair, as for max_len."""
    de = ["hund", "hund hund hund hund", "katze", "haus"]
    en = ["dog dog dog dog", "dog", "cat", "house"]
    write_corpus(tmp_path / "split", de, en)
    lens = [(len(s) + 1, len(t) + 1) for s, t in zip(tokenizer.encode_src(de), tokenizer.encode_tgt(en))]
    unbalanced = [max(s, t) > 2 * min(s, t) for s, t in lens]
    assert unbalanced == [True, True, False, False]  # the premise: two pairs above a ratio of 2
    spec = CorpusConfig(kind="text", path=str(tmp_path / "split"))
    cfg = DataConfig(train=spec, valid=spec, max_len=100, max_ratio=2.0)

    train, report = prepare_split(spec, cfg, tokenizer, cache_dir=tmp_path / "cache", train=True)
    assert report == {"pairs": 4, "empty": 0, "too_long": 0, "ratio": 2, "kept": 2}
    assert train["src_ids"][:] == [[*ids, EOS_ID] for ids in tokenizer.encode_src(["katze", "haus"])]
    valid, report = prepare_split(spec, cfg, tokenizer, cache_dir=tmp_path / "cache", train=False)
    assert report["ratio"] == 0 and report["kept"] == 4
    assert list(zip(valid["src"], valid["tgt"])) == list(zip(de, en))



def test_training_reads_a_sentence_as_translation_does(tmp_path: Path, tokenizer: Tokenizer) -> None:
    """A training pair's source ids are those the translator reads in its line, whatever whitespace the line
    holds: sentencepiece alone keeps a vertical tab, NEL or U+001C to U+001F as pieces of their own, which
    translation folds into a space."""
    spaces = PY_WHITESPACE.replace("\n", "")  # '\n' ends the line
    de = [f"{c}der{c}hund{c}{c}sieht  die katze{c}" for c in spaces] + ["der\thund\x85\x85sieht\r"]
    en = ["the dog sees the cat"] * len(de)
    write_corpus(tmp_path / "train", de, en)
    spec = CorpusConfig(kind="text", path=str(tmp_path / "train"))
    train, report = prepare_split(spec, DataConfig(train=spec), tokenizer, cache_dir=tmp_path / "cache", train=True)
    assert report["kept"] == len(de)

    cfg = config_from_dict(tiny_config_dict(tmp_path, tmp_path / "run"))
    model = build_model(cfg.model, src_vocab_size=tokenizer.src_vocab_size, tgt_vocab_size=tokenizer.tgt_vocab_size,
                        pad_id=PAD_ID)
    translator = Translator(model, tokenizer, cfg, torch.device("cpu"))
    read = [nbest[0].src_tokens for nbest in translator.translate_nbest(de, beam=1, max_len_a=0.0, max_len_b=1)]
    assert [tokenizer.src_pieces(ids) for ids in train["src_ids"]] == read
