"""Answer scoring as in SQuAD and Search-R1: exact match and token F1 after normalization.

``normalize_answer`` lower-cases, drops punctuation, drops the articles *a*, *an*, *the*
and collapses whitespace, so "The Glass Harbor." and "glass  harbor" are the same answer.
A prediction is scored against every gold answer (aliases included) and keeps the best.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Iterable

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = str.maketrans("", "", string.punctuation)


def normalize_answer(text: str) -> str:
    """SQuAD normalization: lower case, no punctuation, no articles, single spaces.

    Punctuation goes before articles, so "the-end" becomes "theend" exactly as in the
    official SQuAD script (the order matters for hyphenated words).
    """
    text = text.lower().translate(_PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, golds: Iterable[str]) -> bool:
    """Whether the normalized prediction equals any normalized gold answer."""
    predicted = normalize_answer(prediction)
    return any(predicted == normalize_answer(gold) for gold in golds)


def f1_score(prediction: str, golds: Iterable[str]) -> float:
    """Best token-level F1 (bag of normalized words) of the prediction over the gold answers."""
    return max((_token_f1(prediction, gold) for gold in golds), default=0.0)


def _token_f1(prediction: str, gold: str) -> float:
    predicted, expected = normalize_answer(prediction).split(), normalize_answer(gold).split()
    common = sum((Counter(predicted) & Counter(expected)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(predicted), common / len(expected)
    return 2 * precision * recall / (precision + recall)
