"""argparse value types shared by the command-line programs."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TypeVar

N = TypeVar("N", int, float)


def _non_negative(kind: Callable[[str], N], what: str) -> Callable[[str], N]:
    def convert(value: str) -> N:
        try:
            number = kind(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not {what}") from None
        if number < 0:
            raise argparse.ArgumentTypeError(f"{value!r} is negative")
        return number

    return convert


non_negative_float = _non_negative(float, "a number")
non_negative_int = _non_negative(int, "a whole number")
