"""The embedded toy corpus: a deterministic English -> German-like parallel corpus.

One grammar writes an English sentence and its German translation together, so the
German side is a function of the English side: one correct output per input. The
corpus is small enough for a Transformer to learn in minutes on a CPU, yet it cannot
be translated word by word; each phenomenon below needs attention over the source:

* agreement: German articles and adjective endings follow the noun's gender, number
  and case (nominative subject, accusative object, dative after "mit", "von", "in"...,
  for "helfen"-type verbs and for the recipient of "geben"); relative pronouns agree
  with their head noun ("der Mann, dem das Kind hilft", "die Männer, denen ...");
* reordering: verb-final subordinate and relative clauses ("weil der Mann den Hund
  sieht"), separable particles and infinitives at the clause end ("ruft das Kind an",
  "kann das Kind anrufen"), verb second after a fronted adverb or clause ("heute isst
  der Mann Brot"), recipient before theme ("gives the ball to the child" -> "gibt dem
  Kind den Ball");
* numbers: 2..99 as English words or digits, German words with the unit first
  ("23" -> "dreiundzwanzig"), and plural agreement after the numeral;
* names: proper names copied verbatim.

Sentences have 3..40 words; coordination, subordinate and relative clauses and
prepositional phrases give the long tail on which a fixed-vector encoder degrades.
Every choice is drawn from one `random.Random(seed)` over tables in a fixed order, so
every machine writes the same bytes: `python -m nmt.data.toy_corpus --out data/toy`.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from types import MappingProxyType

from nmt.data.toy_lexicon import (
    ADJ_ENDINGS,
    ADJECTIVES,
    ADVERBS,
    CONTRACTIONS,
    COORDINATORS,
    DE_TENS,
    DE_UNITS,
    DEFINITE,
    DER_WORD,
    DETERMINERS,
    EIN_WORD,
    EN_TENS,
    EN_UNITS,
    MODALS,
    NAMES,
    NOUNS,
    PREPS,
    RELATIVE,
    SUBORDINATORS,
    VERBS,
    Noun,
    Verb,
    Word,
)

DEFAULT_SEED = 1234
DEFAULT_SIZES = MappingProxyType({"train": 20000, "valid": 500, "test": 500})
MIN_WORDS, MAX_WORDS = 3, 40


# ---------------------------------------------------------------- phrases


def english_number(n: int, digits: bool) -> str:
    """English numeral for 2..99: tens before units, hyphenated ("twenty-three"), or digits."""
    if digits or n < 20:
        return str(n) if digits else EN_UNITS[n]
    tens, unit = divmod(n, 10)
    return EN_TENS[tens] + (f"-{EN_UNITS[unit]}" if unit else "")


def german_number(n: int) -> str:
    """German numeral for 2..99: the unit comes first, joined by 'und' ("dreiundzwanzig");
    'eins' shortens to 'ein' inside the compound ("einundzwanzig")."""
    if n < 20:
        return DE_UNITS[n]
    tens, unit = divmod(n, 10)
    if unit == 0:
        return DE_TENS[tens]
    return ("ein" if unit == 1 else DE_UNITS[unit]) + "und" + DE_TENS[tens]


@dataclass(frozen=True)
class NounPhrase:
    """A name, or determiner (or numeral) + adjectives + noun, with at most one modifier."""

    noun: Noun | None = None
    name: str = ""
    det: str = "the"  # key of DETERMINERS
    plural: bool = False
    count: int = 0  # numeral 2..99 in place of the determiner (then det is "" and plural)
    digits: bool = False  # the English numeral is written in digits
    adjs: tuple[Word, ...] = ()
    pp: PrepPhrase | None = None
    rel: Clause | None = None


@dataclass(frozen=True)
class PrepPhrase:
    prep: Word
    np: NounPhrase


@dataclass(frozen=True)
class Clause:
    """Subject + verb (+ modal) + objects + prepositional phrases (+ 'that'-clause).

    In a relative clause `gap` says which of subj/obj is the head noun, which English
    and German replace by a relative pronoun at the front of the clause.
    """

    subj: NounPhrase
    verb: Verb
    obj: NounPhrase | None = None
    iobj: NounPhrase | None = None  # recipient of a give-type verb
    modal: Verb | None = None
    pps: tuple[PrepPhrase, ...] = ()
    comp: Clause | None = None  # the 'that'-clause of a verb of saying
    gap: str = ""  # "", "subj" or "obj"


def english_np(np: NounPhrase) -> list[str]:
    """English noun phrase; "a" becomes "an" before a vowel."""
    if np.name:
        words = [np.name]
    else:
        det = DETERMINERS[np.det]
        article = english_number(np.count, np.digits) if np.count else det.en_pl if np.plural else det.en
        rest = [adj.en for adj in np.adjs] + [np.noun.en_pl if np.plural else np.noun.en]
        if article == "a" and rest[0][0] in "aeiou":
            article = "an"
        words = [article, *rest] if article else rest
    if np.pp:
        words += english_pp(np.pp)
    if np.rel:
        words += english_clause(np.rel)
    return words


def german_np(np: NounPhrase, case: str) -> list[str]:
    """German noun phrase in `case`: the determiner and every adjective take the endings of
    the noun's gender/number and the case; the declension of the adjectives (weak, mixed,
    strong) depends on the determiner; dative plural nouns add -n unless ending in -n/-s.
    A relative clause is fenced by commas."""
    if np.name:
        words = [np.name]
    else:
        g = "pl" if np.plural else np.noun.gender
        det = DETERMINERS[np.det]
        if np.count:
            article = german_number(np.count)
        elif det.kind == "definite":
            article = DEFINITE[case][g]
        elif det.kind == "bare":
            article = ""
        else:
            article = det.de + (DER_WORD if det.kind == "der" else EIN_WORD)[case][g]
        noun = np.noun.de_pl if np.plural else np.noun.de
        if np.plural and case == "dat" and noun[-1] not in "ns":
            noun += "n"
        ending = ADJ_ENDINGS[det.kind][case][g]
        words = ([article] if article else []) + [adj.de + ending for adj in np.adjs] + [noun]
    if np.pp:
        words += german_pp(np.pp)
    if np.rel:
        words += [",", *german_clause(np.rel, "sub"), ","]
    return words


def english_pp(pp: PrepPhrase) -> list[str]:
    return [pp.prep.en, *english_np(pp.np)]


def german_pp(pp: PrepPhrase) -> list[str]:
    """Preposition + noun phrase in the case it governs; 'in dem' -> 'im', 'von dem' -> 'vom'."""
    words = [pp.prep.de, *german_np(pp.np, pp.prep.tag.split()[0])]
    if (words[0], words[1]) in CONTRACTIONS:
        words[:2] = [CONTRACTIONS[words[0], words[1]]]
    return words


def english_clause(c: Clause) -> list[str]:
    """English clause, always subject-verb-object; the relative pronoun leads a relative clause."""
    plural = c.subj.plural
    template = c.verb.en_pl if plural or c.modal else c.verb.en
    obj = "" if c.obj is None or c.gap == "obj" else " ".join(english_np(c.obj))
    iobj = " ".join(english_np(c.iobj)) if c.iobj else ""
    words = template.format(o=obj, i=iobj).split()
    if c.modal:
        words = (c.modal.en_pl if plural else c.modal.en).split() + words
    if c.gap == "subj":
        words = ["who" if c.subj.noun.kind == "p" else "that", *words]
    else:
        words = (["that"] if c.gap == "obj" else []) + english_np(c.subj) + words
    for pp in c.pps:
        words += english_pp(pp)
    if c.comp:
        words += english_clause(c.comp)
    return words


def german_clause(c: Clause, order: str) -> list[str]:
    """German clause in one of three word orders around the finite verb:

    "main" (verb second after the subject), "inverted" (verb first, after a fronted
    adverb or clause), "sub" (verb final, for subordinate and relative clauses). The
    recipient (dative) precedes the object, prepositional phrases follow; the separable
    particle or the infinitive of a modal closes the clause, and in verb-final order the
    particle fuses with the verb ("anruft", "anrufen kann").
    """
    v, plural = c.verb, c.subj.plural
    lead: list[str] = []
    if c.gap:
        head, case = (c.subj, "nom") if c.gap == "subj" else (c.obj, "dat" if v.kind == "d" else "acc")
        lead = [RELATIVE[case]["pl" if head.plural else head.noun.gender]]
    subj = [] if c.gap == "subj" else german_np(c.subj, "nom")
    middle = german_np(c.iobj, "dat") if c.iobj else []
    if c.obj and c.gap != "obj":
        middle += german_np(c.obj, "dat" if v.kind == "d" else "acc")
    for pp in c.pps:
        middle += german_pp(pp)
    verb = v.de_pl if plural else v.de
    if c.modal:
        finite, end = (c.modal.de_pl if plural else c.modal.de), [v.particle + v.de_pl]
    else:
        finite, end = verb, [v.particle] if v.particle else []
    comp = [",", "dass", *german_clause(c.comp, "sub"), ","] if c.comp else []
    if order == "sub":
        cluster = [*end, finite] if c.modal else [v.particle + verb]
        return lead + subj + middle + cluster + comp
    if order == "main":
        return subj + [finite] + middle + end + comp
    return [finite] + subj + middle + end + comp


def finish(words: list[str]) -> str:
    """Sentence from words: commas attach to the word before, are never doubled nor left
    before the final period; first letter capitalised."""
    out: list[str] = []
    for word in words:
        if word != "," or (out and out[-1] != ","):
            out.append(word)
    while out[-1] == ",":
        out.pop()
    text = " ".join(out).replace(" ,", ",") + "."
    return text[0].upper() + text[1:]


# ---------------------------------------------------------------- random sentences


@cache
def _nouns(kinds: str) -> tuple[Noun, ...]:
    return tuple(n for n in NOUNS if n.kind in kinds)


@cache
def _adjectives(kind: str) -> tuple[Word, ...]:
    return tuple(a for a in ADJECTIVES if kind in a.tag)


@cache
def _verbs(kinds: str, subject: str = "", obj: str = "") -> tuple[Verb, ...]:
    return tuple(v for v in VERBS if v.kind in kinds and subject in v.subjects and obj in v.objects)


def make_np(rng: random.Random, kinds: str, *, mods: bool) -> NounPhrase:
    """Random noun phrase of one of `kinds`; `mods` allows a PP or relative-clause modifier."""
    if "p" in kinds and rng.random() < 0.15:
        return NounPhrase(name=rng.choice(NAMES))
    noun = rng.choice(_nouns(kinds))
    count, digits = 0, False
    if noun.kind in "mw":  # mass nouns: singular, often without article
        det, plural = rng.choice(("the", "the", "", "", "this", "no", "my", "our")), False
    else:
        det = rng.choice(("the", "the", "the", "a", "a", "this", "no", "my", "his", "her", "our", "", "#"))
        plural = det in ("", "#") or (det != "a" and rng.random() < 0.3)
        if det == "#":
            det, count = "", rng.randint(2, 12) if rng.random() < 0.5 else rng.randint(13, 99)
            digits = count > 12 and rng.random() < 0.5
    adjs = tuple(rng.sample(_adjectives(noun.kind), rng.choice((0, 0, 0, 0, 1, 1, 2))))
    np = NounPhrase(noun=noun, det=det, plural=plural, count=count, digits=digits, adjs=adjs)
    roll = rng.random() if mods else 1.0
    if roll < 0.12:
        return replace(np, pp=make_pp(rng))
    if roll < 0.24:
        return replace(np, rel=make_relative(rng, np))
    return np


def make_pp(rng: random.Random) -> PrepPhrase:
    """Random prepositional phrase with a plain noun phrase."""
    prep = rng.choice(PREPS)
    return PrepPhrase(prep, make_np(rng, prep.tag.split()[1], mods=False))


def make_relative(rng: random.Random, head: NounPhrase) -> Clause:
    """Relative clause on `head`: the head is its subject ("who sees the dog") or its
    object ("that the man sees"); German picks the pronoun by the head's gender/number
    and the case of the gap ("der", "den", "dem", "denen")."""
    modal = rng.choice(MODALS) if rng.random() < 0.15 else None
    pps = (make_pp(rng),) if rng.random() < 0.25 else ()
    if head.noun.kind in "pa" and rng.random() < 0.6:
        verb = rng.choice(_verbs("itd", head.noun.kind))
        obj = make_np(rng, verb.objects, mods=False) if verb.kind != "i" else None
        return Clause(subj=head, verb=verb, obj=obj, modal=modal, pps=pps, gap="subj")
    verb = rng.choice(_verbs("td", "", head.noun.kind))
    subj = make_np(rng, verb.subjects, mods=False)
    return Clause(subj=subj, verb=verb, obj=head, modal=modal, pps=pps, gap="obj")


def make_clause(rng: random.Random, *, rich: bool = True) -> Clause:
    """Random clause; `rich` allows modifiers, 'that'-clauses and more PPs.

    Modifiers are only put where the English stays unambiguous: none on objects of
    separable or give-type verbs, and no verb PPs after an object's relative clause.
    """
    verb = rng.choice(_verbs("itdgs" if rich else "itdg"))
    subj = make_np(rng, verb.subjects, mods=rich)
    obj = iobj = comp = modal = None
    if verb.kind in "tdg":
        obj = make_np(rng, verb.objects, mods=rich and verb.kind in "td" and not verb.particle)
    if verb.kind == "g":
        iobj = make_np(rng, "p", mods=False)
    if verb.kind == "s":
        comp = make_clause(rng, rich=False)
    elif rng.random() < 0.2:
        modal = rng.choice(MODALS)
    n_pps = 0 if verb.kind in "gs" or (obj and obj.rel) else rng.choice((0, 0, 0, 1, 1, 2) if rich else (0, 0, 1))
    pps = tuple(make_pp(rng) for _ in range(n_pps))
    return Clause(subj=subj, verb=verb, obj=obj, iobj=iobj, modal=modal, pps=pps, comp=comp)


def main_clause(rng: random.Random, *, rich: bool = True) -> tuple[list[str], list[str]]:
    """Main clause; a fronted adverb ("today") moves the German verb before the subject (V2)."""
    c = make_clause(rng, rich=rich)
    if rng.random() < 0.25:
        adv = rng.choice(ADVERBS)
        return [adv.en, *english_clause(c)], [adv.de, *german_clause(c, "inverted")]
    return english_clause(c), german_clause(c, "main")


def clause_group(rng: random.Random) -> tuple[list[str], list[str]]:
    """Main clause alone, followed by a subordinate clause, or preceded by one (which
    takes the first place, so the German main verb comes right after its comma)."""
    roll = rng.random()
    if roll < 0.6:
        return main_clause(rng)
    conj, sub = rng.choice(SUBORDINATORS), make_clause(rng, rich=False)
    en_sub, de_sub = [conj.en, *english_clause(sub)], [conj.de, *german_clause(sub, "sub")]
    if roll < 0.85:
        en, de = main_clause(rng)
        return en + en_sub, de + [","] + de_sub + [","]
    main = make_clause(rng)
    return en_sub + [","] + english_clause(main), de_sub + [","] + german_clause(main, "inverted")


def make_sentence(rng: random.Random) -> tuple[str, str]:
    """One sentence pair: a short main clause, or a clause group, often coordinated with a
    second one (the long tail)."""
    if rng.random() < 0.4:
        en, de = main_clause(rng, rich=False)
        return finish(en), finish(de)
    en, de = clause_group(rng)
    if rng.random() < 0.5:
        coord = rng.choice(COORDINATORS)
        en2, de2 = clause_group(rng)
        en, de = [*en, coord.en, *en2], [*de, *coord.de.split(), *de2]
    return finish(en), finish(de)


# ---------------------------------------------------------------- corpus and CLI


def generate(
    *, seed: int = DEFAULT_SEED, sizes: Mapping[str, int] = DEFAULT_SIZES
) -> dict[str, list[tuple[str, str]]]:
    """Distinct sentence pairs of MIN_WORDS..MAX_WORDS words on both sides, split by `sizes`.

    Source sentences are never repeated, so no valid or test sentence is in train.
    """
    rng = random.Random(seed)
    seen: set[str] = set()  # membership only: never iterated, so hash order cannot leak
    pairs: list[tuple[str, str]] = []
    while len(pairs) < sum(sizes.values()):
        en, de = make_sentence(rng)
        if en in seen or not all(MIN_WORDS <= len(s.split()) <= MAX_WORDS for s in (en, de)):
            continue
        seen.add(en)
        pairs.append((en, de))
    splits, start = {}, 0
    for name, size in sizes.items():
        splits[name], start = pairs[start:start + size], start + size
    return splits


def write_corpus(out: Path, *, seed: int = DEFAULT_SEED, sizes: Mapping[str, int] = DEFAULT_SIZES) -> list[Path]:
    """Write `{split}.en` and `{split}.de` under `out`, UTF-8, one sentence per line."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, pairs in generate(seed=seed, sizes=sizes).items():
        for side, lang in enumerate(("en", "de")):
            path = out / f"{split}.{lang}"
            path.write_text("".join(pair[side] + "\n" for pair in pairs), encoding="utf-8", newline="\n")
            paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    for split, size in DEFAULT_SIZES.items():
        parser.add_argument(f"--{split}", type=int, default=size, help=f"{split} pairs")
    args = parser.parse_args(argv)
    sizes = {split: getattr(args, split) for split in DEFAULT_SIZES}
    for path in write_corpus(args.out, seed=args.seed, sizes=sizes):
        print(path)


if __name__ == "__main__":
    main()
