"""A generated character corpus with real structure, so a tiny model has something to learn.

Theory of operation
-------------------
The demo must train on text that ships with the code (nothing is downloaded)
and that a model of a few hundred thousand parameters can learn in minutes on
two CPU cores, far below the unigram entropy, so that "gm converges like
data-parallel training" is a claim about learning and not about noise.

The text comes from a small probabilistic grammar over a fixed lexicon:

* declaratives with number agreement between subject and verb
  (``the cat sees a dog.`` / ``three old cats see the dog.``), optionally with a
  relative clause that puts distance between them
  (``the dogs that the cat chases sleep.``) and a prepositional phrase;
* the article ``a``/``an`` chosen by the next word's first letter;
* yes/no questions whose auxiliary agrees with the subject
  (``does the cat see a dog?`` / ``do the cats sleep?``);
* paragraphs of a few sentences separated by newlines.

A model learns spelling first (words are fixed strings), then which word class
comes next, then agreement across a clause. Word choices are Zipf-weighted so
frequent words dominate, like real text. Generation is a pure function of its
seed (``random.Random``), so every process of a run rebuilds the same stream.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence

import attrs
import numpy as np
import numpy.typing as npt

VOCAB = "\n ,.?abcdefghijklmnopqrstuvwxyz"
"""Every character the grammar can emit; a token is an index into this string."""

Ids = npt.NDArray[np.uint8]


@attrs.frozen
class Words:
    """A word class and how often each of its words is drawn."""

    words: tuple[str, ...]
    weights: tuple[float, ...]


def _words(text: str, *, zipf: bool) -> Words:
    """Open classes get Zipf weights 1/rank (a few common words, a long tail, as in
    natural text); small closed classes are drawn uniformly."""
    words = tuple(text.split())
    weights = tuple(1.0 / (rank + 1) if zipf else 1.0 for rank in range(len(words)))
    return Words(words, weights)


NOUNS = _words(
    "cat dog bird fox horse lamb farmer teacher robot sailor king queen "
    "wolf goat baker doctor painter tiger rabbit student",
    zipf=True,
)
TRANSITIVE = _words("see chase help follow find watch carry call visit paint feed greet", zipf=True)
INTRANSITIVE = _words("sleep run sing laugh wait swim dance rest", zipf=True)
ADJECTIVES = _words("big small old young happy tired clever brave quiet red", zipf=True)
ADVERBS = _words("today quickly slowly again often outside", zipf=False)
PREPOSITIONS = _words("near behind under beside with", zipf=False)
PLURAL_DETS = _words("two three four five many some these the the the", zipf=False)
SINGULAR_DETS = _words("the a one this every", zipf=False)


def _s_form(word: str) -> str:
    """The regular English -s form (plural noun, third-person singular verb)."""
    if word.endswith(("s", "sh", "ch", "x")):
        return word + "es"
    if word.endswith("y") and word[-2] not in "aeiou":
        return word[:-1] + "ies"
    return word + "s"


class Grammar:
    """Draws sentences from the grammar with one seeded generator."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def _pick(self, words: Words) -> str:
        return self._rng.choices(words.words, weights=words.weights)[0]

    def _chance(self, p: float) -> bool:
        return self._rng.random() < p

    def noun_phrase(self, plural: bool, *, clause: bool = True) -> str:
        """Determiner, optional adjective, noun; maybe a relative clause or a PP."""
        words = [self._pick(PLURAL_DETS if plural else SINGULAR_DETS)]
        if self._chance(0.4):
            words.append(self._pick(ADJECTIVES))
        noun = self._pick(NOUNS)
        words.append(_s_form(noun) if plural else noun)
        if words[0] == "a" and words[1][0] in "aeiou":
            words[0] = "an"
        if clause and self._chance(0.2):
            inner_plural = self._chance(0.5)
            inner = self.noun_phrase(inner_plural, clause=False)
            words += ["that", inner, self.verb(transitive=True, plural=inner_plural)]
        elif clause and self._chance(0.15):
            words += [self._pick(PREPOSITIONS), self.noun_phrase(self._chance(0.3), clause=False)]
        return " ".join(words)

    def verb(self, *, transitive: bool, plural: bool) -> str:
        """A verb agreeing with its subject's number."""
        base = self._pick(TRANSITIVE if transitive else INTRANSITIVE)
        return base if plural else _s_form(base)

    def predicate(self, plural: bool, *, finite: bool = True) -> str:
        """Verb (finite: agreeing; else bare, after an auxiliary), object, maybe an adverb."""
        transitive = self._chance(0.65)
        verb = self.verb(transitive=transitive, plural=plural or not finite)
        words = [verb]
        if transitive:
            words.append(self.noun_phrase(self._chance(0.35), clause=False))
        if self._chance(0.25):
            words.append(self._pick(ADVERBS))
        return " ".join(words)

    def sentence(self) -> str:
        """A declarative (80%) or a yes/no question (20%)."""
        plural = self._chance(0.4)
        if self._chance(0.2):
            aux = "do" if plural else "does"
            return f"{aux} {self.noun_phrase(plural)} {self.predicate(plural, finite=False)}?"
        return f"{self.noun_phrase(plural)} {self.predicate(plural)}."

    def paragraph(self) -> str:
        count = self._rng.randint(2, 5)
        return " ".join(self.sentence() for _ in range(count)) + "\n"


def generate(seed: int, n_chars: int) -> str:
    """At least ``n_chars`` characters of text, then cut to exactly ``n_chars``."""
    grammar = Grammar(seed)
    parts: list[str] = []
    size = 0
    while size < n_chars:
        part = grammar.paragraph()
        parts.append(part)
        size += len(part)
    return "".join(parts)[:n_chars]


_INDEX = np.full(256, 255, dtype=np.uint8)
_INDEX[np.frombuffer(VOCAB.encode("ascii"), dtype=np.uint8)] = np.arange(len(VOCAB))


def encode(text: str) -> Ids:
    """Token ids of ``text``; a character outside :data:`VOCAB` is a ValueError."""
    ids = _INDEX[np.frombuffer(text.encode("ascii"), dtype=np.uint8)]
    if ids.size and int(ids.max()) == 255:
        bad = sorted({c for c in text if c not in VOCAB})
        raise ValueError(f"characters outside the demo vocabulary: {bad!r}")
    return ids


def decode(ids: Sequence[int] | Ids) -> str:
    return "".join(VOCAB[int(i)] for i in ids)


def unigram_entropy_nats(ids: Ids) -> float:
    """Entropy of the character frequencies: the loss of a model that ignores context."""
    counts = np.bincount(ids, minlength=len(VOCAB)).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def uniform_entropy_nats() -> float:
    """The loss of an untrained model that spreads its bets evenly over the vocabulary."""
    return math.log(len(VOCAB))
