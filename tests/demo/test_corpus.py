"""The generated corpus: deterministic, closed vocabulary, and structured enough to learn."""

from __future__ import annotations

import math
import re
from collections import Counter

import numpy as np
import pytest

from gm_shell.demo import corpus

TEXT = corpus.generate(seed=7, n_chars=60_000)
SENTENCES = [s.strip() for s in re.findall(r"[^.?\n]+[.?]", TEXT)]


def test_same_seed_same_text_and_other_seed_other_text() -> None:
    assert corpus.generate(7, 60_000) == TEXT
    assert corpus.generate(8, 60_000) != TEXT
    assert len(TEXT) == 60_000


def test_encode_decode_round_trip_and_reject_foreign_characters() -> None:
    ids = corpus.encode(TEXT)
    assert ids.dtype == np.uint8
    assert int(ids.max()) < len(corpus.VOCAB)
    assert corpus.decode(ids) == TEXT
    with pytest.raises(ValueError, match="outside the demo vocabulary"):
        corpus.encode("Hello!")


def test_questions_agree_with_their_subject() -> None:
    """``does`` takes a singular head noun, ``do`` a plural one (with an -s: no singular
    noun of the lexicon ends in s). The head follows the determiner and maybe an adjective."""
    questions = [s.split() for s in SENTENCES if s.endswith("?")]
    assert len(questions) > 50
    for words in questions:
        head = words[3] if words[2] in corpus.ADJECTIVES.words else words[2]
        assert words[0] in ("do", "does")
        assert (words[0] == "do") == head.endswith("s"), words


def test_article_an_exactly_before_vowels() -> None:
    pairs = re.findall(r"(?:^|[ ])(an?) (\w)", TEXT)
    assert pairs
    for article, initial in pairs:
        assert (article == "an") == (initial in "aeiou")


def test_every_sentence_ends_with_a_full_stop_or_a_question_mark() -> None:
    for paragraph in TEXT.split("\n")[:-1]:  # the last paragraph is cut at n_chars
        assert paragraph.endswith((".", "?"))


def _conditional_entropy(ids: np.ndarray, order: int) -> float:
    """Entropy (nats) of a character given the ``order`` before it, from counts."""
    contexts: Counter[bytes] = Counter()
    joint: Counter[bytes] = Counter()
    raw = ids.tobytes()
    for i in range(order, len(raw)):
        contexts[raw[i - order : i]] += 1
        joint[raw[i - order : i + 1]] += 1
    n = sum(joint.values())
    return -sum(c / n * math.log(c / contexts[k[:-1]]) for k, c in joint.items())


def test_context_predicts_far_better_than_unigram_frequencies() -> None:
    """The structure a model can learn: 4 characters of context cut the entropy by > half."""
    ids = corpus.encode(TEXT)
    unigram = corpus.unigram_entropy_nats(ids)
    assert 2.5 < unigram < corpus.uniform_entropy_nats()
    assert _conditional_entropy(ids, 4) < 0.5 * unigram
