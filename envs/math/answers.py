"""Final-answer extraction and checking for math replies.

``extract_answer`` finds the final answer in free text, trying in order: GSM8K's
``#### N``, the last ``\\boxed{...}`` (MATH), the last "the answer is N" / "Answer: N",
then the last number anywhere. ``answers_match`` compares two answers exactly as
rationals when both parse as numbers (``1,234``, ``-3.50``, ``7/2``, ``\\frac{7}{2}``,
``$12``, ``45%`` all parse), and as normalized strings otherwise (MATH's symbolic answers:
no algebraic equivalence is attempted).
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = r"-?\d(?:[\d,]*\d)?(?:\.\d+)?(?:\s*/\s*\d+)?|-?\.\d+"
_NUMBER_RE = re.compile(_NUMBER)
_HASHES = re.compile(r"####\s*([^\n]+)")
_ANSWER_IS = re.compile(r"(?:answer\s+is|answer\s*:)\s*:?\s*([^\n]+)", re.IGNORECASE)
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]+)\}\{([^{}]+)\}")
_LATEX_NOISE = re.compile(
    r"\\left|\\right|\\!|\\,|\\;|\\ |\$|\\text\{[^{}]*\}|\\mbox\{[^{}]*\}|\^\\circ|\^\{\\circ\}"
)
_UNIT_WORDS = re.compile(r"[a-zA-Z%]+\.?$")


def extract_answer(text: str) -> str | None:
    """The final answer written in ``text`` (stripped of trailing punctuation), or ``None``."""
    for find in (_after_hashes, last_boxed, _after_answer_is, _last_number):
        found = find(text)
        if found:
            return found.strip().rstrip(".").strip()
    return None


def _after_hashes(text: str) -> str | None:
    matches = _HASHES.findall(text)
    return matches[-1] if matches else None


def last_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), nested braces kept."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    opening = text.index("{", start)
    depth = 0
    for i in range(opening, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[opening + 1 : i]
    return None  # unbalanced: the reply was cut off


def _after_answer_is(text: str) -> str | None:
    matches = _ANSWER_IS.findall(text)
    if not matches:
        return None
    # "The answer is 42 apples." -> the number when there is one, else the phrase.
    phrase = matches[-1]
    return _first_number(phrase) or phrase


def _first_number(text: str) -> str | None:
    match = _NUMBER_RE.search(text)
    return match.group(0) if match else None


def _last_number(text: str) -> str | None:
    matches = _NUMBER_RE.findall(text)
    return matches[-1] if matches else None


def parse_number(text: str) -> Fraction | None:
    """``text`` as an exact rational: ints, decimals, ``a/b``, ``\\frac{a}{b}``, with
    thousands commas, a currency sign, a percent sign or a trailing unit word allowed.
    ``None`` when it is not a plain number."""
    cleaned = _FRAC.sub(r"(\1)/(\2)", _LATEX_NOISE.sub("", text)).strip()
    cleaned = _UNIT_WORDS.sub("", cleaned).strip().replace(",", "").replace(" ", "")
    cleaned = cleaned.replace("(", "").replace(")", "")
    if not re.fullmatch(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:/-?\d+(?:\.\d*)?)?", cleaned):
        return None
    numerator, _, denominator = cleaned.partition("/")
    try:
        return Fraction(numerator) / Fraction(denominator) if denominator else Fraction(numerator)
    except ZeroDivisionError:
        return None


def normalize_text_answer(text: str) -> str:
    """Symbolic answers compared as strings: LaTeX spacing and ``\\left``/``\\right``
    dropped, ``\\dfrac`` as ``\\frac``, no whitespace, no trailing period."""
    text = _LATEX_NOISE.sub("", text).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    return re.sub(r"\s+", "", text).rstrip(".")


def canonical_answer(text: str | None) -> str | None:
    """A key equal for equal answers (for voting): the reduced fraction of a number, else
    the normalized string; ``None`` for no answer."""
    if text is None:
        return None
    number = parse_number(text)
    return str(number) if number is not None else normalize_text_answer(text)


def answers_match(predicted: str | None, gold: str) -> bool:
    """Whether ``predicted`` (an extracted answer) equals ``gold``: exactly as rationals when
    both are numbers, else as normalized strings."""
    if predicted is None:
        return False
    return canonical_answer(predicted) == canonical_answer(gold)


def is_correct(reply: str, gold: str) -> bool:
    """Whether the final answer written in ``reply`` equals ``gold``."""
    return answers_match(extract_answer(reply), gold)
