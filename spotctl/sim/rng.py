"""Stable randomness for the simulator.

Everything random in the demo region is drawn from generators keyed by stable
values (the world's seed plus names and integers), never from Python's salted
``hash()`` of a string, so a world is reproducible across processes and
machines: same seed, same region, same calls at the same times → same world.
"""

from __future__ import annotations

import hashlib
import math
import random

_M64 = (1 << 64) - 1
_INV53 = 1.0 / 9007199254740992.0  # 2**-53


def stable_int(*parts: object) -> int:
    """A 64-bit integer from the parts' text, identical in every process."""
    text = "\x1f".join(str(p) for p in parts)
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big")


def keyed(*parts: object) -> random.Random:
    """A fresh generator keyed by ``parts`` (seed first, by convention)."""
    return random.Random(stable_int(*parts))


def mix(a: int, b: int = 0, c: int = 0) -> float:
    """A fast uniform draw in [0, 1) from up to three integers (splitmix64 finaliser).

    Used in hot paths (per host per hour) where seeding a ``random.Random``
    would cost too much.
    """
    z = (a * 0x9E3779B97F4A7C15 + b * 0xBF58476D1CE4E5B9 + c * 0x94D049BB133111EB + 0x632BE59BD9B4E019) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    z ^= z >> 31
    return (z >> 11) * _INV53


def poisson(r: random.Random, lam: float) -> int:
    """A Poisson draw (Knuth for small means, a rounded normal for large ones)."""
    if lam <= 0:
        return 0
    if lam > 30:
        return max(0, int(round(r.gauss(lam, math.sqrt(lam)))))
    limit = math.exp(-lam)
    k, p = 0, r.random()
    while p > limit:
        k += 1
        p *= r.random()
    return k


def uuid_from(r: random.Random) -> str:
    """A UUID-4-shaped identifier drawn from ``r``."""
    h = f"{r.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{'89ab'[int(h[16], 16) & 3]}{h[17:20]}-{h[20:32]}"


def diurnal(t: float, peak_hour: float = 14.0) -> float:
    """A smooth day curve in [-1, 1], +1 at ``peak_hour`` UTC, -1 twelve hours later."""
    hour = (t % 86400.0) / 3600.0
    return math.cos(2.0 * math.pi * (hour - peak_hour) / 24.0)
