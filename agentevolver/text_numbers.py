"""Numbers written in text: the one grammar the task manager reads answers, proofs and tool results with.

A number may carry a sign, thousands separators ("3,500"), a decimal part, an exponent, or start with the
point (".5"). The answer grader, the proof check and the environment writer must agree on what counts as a
number: a task whose answer the writer renders as one number must be provable by the proof check and
gradable by the grader, so the three read with these functions and not with three copies of one regex.

Not read with this grammar, on purpose: the environments' own answer parsers (``env_service``, behind the
environment, with their own stricter forms) and the task filters' number fingerprints (strings compared as
written, see :mod:`agentevolver.module.task_manager.filters`).
"""

from __future__ import annotations

import re

__all__ = ["one_number", "read_numbers"]

_UNSIGNED = r"\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+]?\d+)?|\.\d+"
_UNSIGNED_NUMBER = re.compile(_UNSIGNED)
_SIGNED_NUMBER = re.compile(rf"[-+]?(?:{_UNSIGNED})")
_ONE_NUMBER = re.compile(rf"\s*([-+]?(?:{_UNSIGNED}))\s*")


def read_numbers(text: str, *, signed: bool = True) -> list[float]:
    """Every number in ``text``, in order. ``signed=False`` reads "17 - 5" as 17 and 5 (an expression's
    operands), ``signed=True`` as 17 and -5 (a reply that states a negative value)."""
    pattern = _SIGNED_NUMBER if signed else _UNSIGNED_NUMBER
    return [float(found.replace(",", "")) for found in pattern.findall(text)]


def one_number(text: str) -> str | None:
    """The number ``text`` consists of (surrounding spaces dropped, as written otherwise), or None when
    ``text`` is anything but exactly one number."""
    found = _ONE_NUMBER.fullmatch(text)
    return found.group(1) if found else None
