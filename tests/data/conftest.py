"""Shared data fixtures: a generated toy parallel corpus and a real sentencepiece model trained on it."""

from __future__ import annotations

import random

import pytest

from nmt.config import TokenizerConfig
from nmt.data.tokenizer import Tokenizer, train_tokenizer

# A tiny lexicon: word i of one language translates word i of the other.
EN = "the a cat dog house tree sees likes eats big small red green man woman child book reads runs today and with".split()
DE = "der ein katze hund haus baum sieht mag isst gross klein rot gruen mann frau kind buch liest laeuft heute und mit".split()


def toy_corpus(n: int, seed: int = 0) -> tuple[list[str], list[str]]:
    """`n` parallel sentences (German, English) of 2 to 10 words, reproducible from the seed."""
    rng = random.Random(seed)
    de, en = [], []
    for _ in range(n):
        words = [rng.randrange(len(EN)) for _ in range(rng.randint(2, 10))]
        de.append(" ".join(DE[w] for w in words))
        en.append(" ".join(EN[w] for w in words))
    return de, en


@pytest.fixture(scope="session")
def corpus() -> tuple[list[str], list[str]]:
    return toy_corpus(400)


@pytest.fixture(scope="session")
def tokenizer(corpus: tuple[list[str], list[str]]) -> Tokenizer:
    """A joint BPE model with 80 pieces trained on the toy corpus."""
    de, en = corpus
    return train_tokenizer(TokenizerConfig(vocab_size=80, joint=True), de, en, seed=0)
