"""Kubernetes quantities ("500m", "1.5", "2Ki", "1e3"), read exactly as the API server reads
them (k8s.io/apimachinery/pkg/api/resource), and the value it keeps for a quota's cpu. Pure, the
standard library only: the plan compares a quota's limits with a TeamSpace's spec by these."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import Any

# The CRD bounds spec.cpu to this length; the controller holds to it too, so that a server
# without that bound cannot feed it a value it would spend a pass parsing or printing.
MAX_CPU_LENGTH = 64
# <sign><digits>[.<digits>] followed by a binary-SI suffix, a decimal-SI suffix or an exponent.
_QUANTITY = re.compile(r"([+-]?)([0-9]+(?:\.[0-9]*)?|\.[0-9]+)"
                       r"(?:(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE]([+-]?[0-9]+))?")
_SUFFIX = {"": Fraction(1), "n": Fraction(1, 10**9), "u": Fraction(1, 10**6),
           "m": Fraction(1, 1000), "k": Fraction(10**3), "M": Fraction(10**6),
           "G": Fraction(10**9), "T": Fraction(10**12), "P": Fraction(10**15),
           "E": Fraction(10**18), "Ki": Fraction(2**10), "Mi": Fraction(2**20),
           "Gi": Fraction(2**30), "Ti": Fraction(2**40), "Pi": Fraction(2**50),
           "Ei": Fraction(2**60)}
# Exponents beyond this are out of any range the API server stores.
_MAX_EXPONENT = 100


def quantity(text: Any) -> Fraction | None:
    """The exact value of a Kubernetes quantity string, or None when it is not one."""
    if isinstance(text, bool) or not isinstance(text, (str, int)):
        return None
    text = str(text)
    if len(text) > MAX_CPU_LENGTH:
        return None
    m = _QUANTITY.fullmatch(text)
    if m is None:
        return None
    sign, number, suffix, exponent = m.groups()
    value = Fraction(number if not number.endswith(".") else number[:-1])
    if exponent is not None:
        if abs(int(exponent)) > _MAX_EXPONENT:
            return None
        value *= Fraction(10) ** int(exponent)
    else:
        value *= _SUFFIX[suffix or ""]
    return -value if sign == "-" else value


def same_quantity(a: Any, b: Any) -> bool:
    qa, qb = quantity(a), quantity(b)
    return qa is not None and qa == qb


def stored_cpu(value: Fraction) -> Fraction:
    """The value the API server keeps for a quota's cpu: rounded up to a whole milli-CPU
    (measured on 1.36: "0.0005", "500u" and "100n" are stored as "1m", "1500u" as "2m")."""
    return Fraction(math.ceil(value * 1000), 1000)
