"""Custom `${name:...}` resolvers. Registered in one place so every entry point sees the same set."""

from __future__ import annotations

import math
from functools import reduce
import operator

from omegaconf import OmegaConf


def _number(value):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"expected a number, got {value!r}")
    return value


def _mul(*values):
    return reduce(operator.mul, (_number(v) for v in values), 1)


def _div(a, b):
    result = _number(a) / _number(b)
    return int(result) if isinstance(a, int) and isinstance(b, int) and result.is_integer() else result


RESOLVERS = {
    "mul": _mul,
    "add": lambda *values: sum(_number(v) for v in values),
    "sub": lambda a, b: _number(a) - _number(b),
    "div": _div,
    "floordiv": lambda a, b: _number(a) // _number(b),
    "ceildiv": lambda a, b: -(-_number(a) // _number(b)),
    "min": lambda *values: min(_number(v) for v in values),
    "max": lambda *values: max(_number(v) for v in values),
    "pow2ceil": lambda a: 1 << max(0, math.ceil(math.log2(_number(a)))),
}


def register_omegaconf_resolvers() -> None:
    for name, fn in RESOLVERS.items():
        OmegaConf.register_new_resolver(name, fn, replace=True)
