"""Built-in verifiers, usable as `reward.function=psrl.rewards.builtin:<name>`.

math_answer   1.0 when the response's final answer (the last \\boxed{...}, else the last number)
              equals `answer` as a number, a fraction or normalised LaTeX, else 0.0
exact_match   1.0 when the stripped response equals the stripped `answer`
regex_format  1.0 when the response matches reward.kwargs.pattern (re.fullmatch, DOTALL)
"""

from __future__ import annotations

import re
from fractions import Fraction

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\[dt]?frac\{([^{}]*)\}\{([^{}]*)\}")
_TEXT = re.compile(r"\\(?:text|mathrm|textbf|mbox)\{([^{}]*)\}")


def math_answer(response: str, answer: str) -> float:
    """Compare the response's final answer with the reference (see the module docstring)."""
    predicted = extract_final_answer(response)
    if predicted is None:
        return 0.0
    reference = extract_boxed(answer) or answer
    return 1.0 if answers_equal(predicted, reference) else 0.0


def exact_match(response: str, answer: str) -> float:
    return 1.0 if response.strip() == str(answer).strip() else 0.0


def regex_format(response: str, pattern: str) -> float:
    return 1.0 if re.fullmatch(pattern, response.strip(), flags=re.DOTALL) else 0.0


def extract_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...} (or \\fbox{...}), braces balanced; None when there is none."""
    start = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if start < 0:
        return None
    brace = text.find("{", start)
    if brace < 0:
        return None
    depth = 0
    for position in range(brace, len(text)):
        if text[position] == "{":
            depth += 1
        elif text[position] == "}":
            depth -= 1
            if depth == 0:
                return text[brace + 1 : position]
    return None


def extract_final_answer(text: str) -> str | None:
    """The last boxed answer, else the last number in the text."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def answers_equal(predicted: str, reference: str) -> bool:
    a, b = normalize(predicted), normalize(reference)
    if a == b:
        return True
    x, y = _as_number(a), _as_number(b)
    return x is not None and y is not None and x == y


def normalize(text: str) -> str:
    """Strip LaTeX decoration that does not change the value: $, spaces, \\left/\\right, \\text{}, units of degrees."""
    text = _TEXT.sub(r"\1", text)
    text = _FRAC.sub(r"(\1)/(\2)", text)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "$", "^\\circ", "^{\\circ}", "\\%", "%"):
        text = text.replace(token, "")
    text = "".join(text.split())
    text = text.removesuffix(".")
    return text


def _as_number(text: str) -> Fraction | None:
    text = text.replace(",", "")
    match = re.fullmatch(r"\(?(-?[\d.]+)\)?/\(?(-?[\d.]+)\)?", text)
    try:
        if match:
            return Fraction(match.group(1)) / Fraction(match.group(2))
        return Fraction(text)
    except (ValueError, ZeroDivisionError):
        return None
