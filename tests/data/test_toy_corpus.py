"""The embedded toy corpus: byte-exact regeneration, corpus invariants, known translations."""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.data import toy_corpus as tc
from nmt.data import toy_lexicon as lex
from nmt.data.toy_corpus import Clause, NounPhrase, PrepPhrase
from nmt.data.toy_lexicon import ADJECTIVE, NOUN, PREP, VERB

TOY = Path(__file__).resolve().parents[2] / "data" / "toy"
FILES = [f"{split}.{lang}" for split in tc.DEFAULT_SIZES for lang in ("en", "de")]
CAN = next(m for m in lex.MODALS if m.en == "can")


def read(split: str, lang: str) -> list[str]:
    return (TOY / f"{split}.{lang}").read_text(encoding="utf-8").split("\n")[:-1]


def the(noun: str, **kw) -> NounPhrase:
    return NounPhrase(noun=NOUN[noun], **kw)


def both(c: Clause, order: str = "main", front: tuple[str, str] = ("", "")) -> tuple[str, str]:
    """English and German sentences of one clause, after an optional fronted word pair."""
    en = [front[0]] if front[0] else []
    de = [front[1]] if front[1] else []
    return tc.finish(en + tc.english_clause(c)), tc.finish(de + tc.german_clause(c, order))


# ---------------------------------------------------------------- committed files


def test_regeneration_is_byte_identical(tmp_path: Path) -> None:
    tc.main(["--out", str(tmp_path)])
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(FILES)
    assert sorted(p.name for p in TOY.iterdir()) == sorted([*FILES, "README.md"])
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (TOY / name).read_bytes(), name


@pytest.mark.parametrize("split", list(tc.DEFAULT_SIZES))
def test_split_sizes_lengths_and_format(split: str) -> None:
    en, de = read(split, "en"), read(split, "de")
    assert len(en) == len(de) >= tc.DEFAULT_SIZES[split]
    for side in (en, de):
        lengths = [len(line.split()) for line in side]
        assert min(lengths) >= 3 and max(lengths) <= 40
        assert all(line == line.strip() and line.endswith(".") for line in side)
        assert all(line[0].isupper() or line[0].isdigit() for line in side)  # "23 dogs ..."
    assert len(set(zip(en, de, strict=True))) == len(en)  # no duplicate pair
    for lang in ("en", "de"):
        assert (TOY / f"{split}.{lang}").stat().st_size < 5 * 2**20


def test_no_valid_or_test_sentence_in_train() -> None:
    train = set(read("train", "en"))
    for split in ("valid", "test"):
        assert not train & set(read(split, "en")), split
    assert not set(read("valid", "en")) & set(read("test", "en"))


def test_long_sentences_are_frequent() -> None:
    lengths = [len(line.split()) for line in read("train", "en")]
    assert 13 <= sum(lengths) / len(lengths) <= 16
    assert sum(n >= 25 for n in lengths) / len(lengths) >= 0.15


def test_names_are_copied_verbatim() -> None:
    names = set(lex.NAMES)
    for en, de in zip(read("valid", "en"), read("valid", "de"), strict=True):
        en_names = sorted(w.strip(".,") for w in en.split() if w.strip(".,") in names)
        assert en_names == sorted(w.strip(".,") for w in de.split() if w.strip(".,") in names), en


# ---------------------------------------------------------------- known answers


@pytest.mark.parametrize(("n", "en", "de"), [
    (2, "two", "zwei"), (16, "sixteen", "sechzehn"), (17, "seventeen", "siebzehn"), (21, "twenty-one", "einundzwanzig"),
    (23, "twenty-three", "dreiundzwanzig"), (30, "thirty", "dreißig"), (99, "ninety-nine", "neunundneunzig"),
])
def test_numbers(n: int, en: str, de: str) -> None:
    assert tc.english_number(n, digits=False) == en
    assert tc.english_number(n, digits=True) == str(n)
    assert tc.german_number(n) == de


@pytest.mark.parametrize(("np", "case", "de"), [
    (the("dog", det="a", adjs=(ADJECTIVE["big"],)), "nom", "ein großer Hund"),
    (the("dog", det="a", adjs=(ADJECTIVE["big"],)), "acc", "einen großen Hund"),
    (the("dog", det="a", adjs=(ADJECTIVE["big"],)), "dat", "einem großen Hund"),
    (the("cat", det="this", adjs=(ADJECTIVE["old"],)), "dat", "dieser alten Katze"),
    (the("child", det="our", adjs=(ADJECTIVE["happy"],)), "nom", "unser glückliches Kind"),
    (the("dog", det="", plural=True, count=23, adjs=(ADJECTIVE["big"],)), "nom", "dreiundzwanzig große Hunde"),
    (the("dog", det="", plural=True, count=3, adjs=(ADJECTIVE["big"],)), "dat", "drei großen Hunden"),
    (the("coffee", det="", adjs=(ADJECTIVE["hot"],)), "acc", "heißen Kaffee"),
    (the("milk", det="", adjs=(ADJECTIVE["cold"],)), "dat", "kalter Milch"),
    (the("girl", det="no", plural=True), "dat", "keinen Mädchen"),
])
def test_noun_phrase_agreement(np: NounPhrase, case: str, de: str) -> None:
    assert " ".join(tc.german_np(np, case)) == de


def test_dative_after_mit_and_contraction() -> None:
    c = Clause(subj=the("man"), verb=VERB["sees {o}"], obj=the("dog"),
               pps=(PrepPhrase(PREP["with"], the("child", plural=True)), PrepPhrase(PREP["in"], the("garden"))))
    assert both(c) == ("The man sees the dog with the children in the garden.",
                       "Der Mann sieht den Hund mit den Kindern im Garten.")


def test_verb_final_after_weil() -> None:
    c = Clause(subj=the("man"), verb=VERB["sees {o}"], obj=the("dog"))
    assert ["weil", *tc.german_clause(c, "sub")] == "weil der Mann den Hund sieht".split()


def test_separable_verb_particle_goes_last() -> None:
    c = Clause(subj=the("woman"), verb=VERB["calls {o} up"], obj=the("child"))
    assert both(c) == ("The woman calls the child up.", "Die Frau ruft das Kind an.")
    assert " ".join(tc.german_clause(c, "sub")) == "die Frau das Kind anruft"
    modal = Clause(subj=the("woman", plural=True), verb=VERB["calls {o} up"], obj=the("child"), modal=CAN)
    assert both(modal) == ("The women can call the child up.", "Die Frauen können das Kind anrufen.")
    assert " ".join(tc.german_clause(modal, "sub")) == "die Frauen das Kind anrufen können"


def test_verb_second_after_fronted_adverb() -> None:
    c = Clause(subj=the("man"), verb=VERB["eats {o}"], obj=the("bread", det=""))
    assert both(c, "inverted", ("today", "heute")) == ("Today the man eats bread.", "Heute isst der Mann Brot.")


def test_recipient_comes_before_theme_in_dative() -> None:
    c = Clause(subj=NounPhrase(name="Anna"), verb=VERB["gives {o} to {i}"], obj=the("ball", det="a"),
               iobj=the("child"))
    assert both(c) == ("Anna gives a ball to the child.", "Anna gibt dem Kind einen Ball.")


def test_relative_pronoun_agrees_with_head_and_gap() -> None:
    head = the("man", plural=True)
    rel = Clause(subj=the("child"), verb=VERB["helps {o}"], obj=head, gap="obj")
    c = Clause(subj=NounPhrase(noun=NOUN["man"], plural=True, rel=rel), verb=VERB["sleeps"])
    assert both(c) == ("The men that the child helps sleep.", "Die Männer, denen das Kind hilft, schlafen.")
    rel = Clause(subj=the("dog"), verb=VERB["sees {o}"], obj=the("cat"), gap="subj")
    c = Clause(subj=the("man"), verb=VERB["loves {o}"], obj=the("dog", rel=rel))
    assert both(c) == ("The man loves the dog that sees the cat.", "Der Mann liebt den Hund, der die Katze sieht.")


def test_english_plural_verb() -> None:
    forms = ["cries", "washes {o}", "goes shopping", "sees {o}", "wants to", "can", "dances"]
    assert [lex.english_plural_verb(f) for f in forms] == ["cry", "wash {o}", "go shopping", "see {o}",
                                                          "want to", "can", "dance"]
