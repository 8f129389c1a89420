"""Timestamps: one formatter and one parser for every module (stdlib only).

spotctl keeps time as float epoch seconds (UTC) everywhere inside; text appears only where a
timestamp crosses a boundary (an API, a scheduler, a report). These two functions are the only
conversions:

``iso(t, timespec="seconds")``
    RFC 3339 in UTC with a ``Z``: ``2026-01-01T00:00:00Z``. ``timespec`` is datetime's:
    ``"seconds"`` (Kubernetes annotations, Slurm, the simulator's feed), ``"milliseconds"``
    (the contract API's one format: ``…:00.000Z``), ``"microseconds"``, or ``"auto"``
    (microseconds only when there are any). ``"seconds"`` truncates (floor) like
    ``time.gmtime``; finer specs keep datetime's rounding to the microsecond. Pass
    ``sep=" "`` for a display form (``2026-01-01 00:00:00Z``). ``None`` and non-finite
    values give ``None`` (a field that is not set), so callers need not check.

``parse_ts(value, assume_utc=False)``
    RFC 3339 / ISO 8601 text (``Z``, ``z`` or an offset; fractions; a space for ``T``) or epoch
    seconds (int/float, not bool) → float epoch seconds; ``None`` → ``None``. Text without a
    time zone is refused (ValueError) unless ``assume_utc`` — for APIs that document UTC but
    omit the zone (OpenStack's ``2024-05-01T10:00:00.000000``). Non-finite numbers are refused.

Callers that want a default for a missing or malformed timestamp (Kubernetes'
``creationTimestamp`` → 0) say so where they call, not here.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone

_TIMESPECS = ("seconds", "milliseconds", "microseconds", "auto")


def iso(t: float | None, timespec: str = "seconds", *, sep: str = "T") -> str | None:
    """Epoch seconds as RFC 3339 UTC text ending in ``Z`` (see the module doc); None stays None."""
    if t is None or isinstance(t, bool) or not math.isfinite(t):
        return None
    if timespec not in _TIMESPECS:
        raise ValueError(f"timespec must be one of {', '.join(_TIMESPECS)}, not {timespec!r}")
    if timespec == "seconds":
        # floor, like time.gmtime: 59.9999999 is still second 59 (datetime would round it up)
        dt = datetime.fromtimestamp(math.floor(t), timezone.utc)
    else:
        dt = datetime.fromtimestamp(t, timezone.utc)
    return dt.replace(tzinfo=None).isoformat(sep=sep, timespec=timespec) + "Z"


def parse_ts(value: object, *, assume_utc: bool = False) -> float | None:
    """An RFC 3339 timestamp (or epoch seconds) as epoch seconds; None stays None (see the module doc)."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        t = float(value)
    elif isinstance(value, str):
        dt = datetime.fromisoformat(value.replace("z", "Z"))  # ValueError when it is not a timestamp
        if dt.tzinfo is None:
            if not assume_utc:
                raise ValueError(f"timestamp {value!r} has no time zone")
            dt = dt.replace(tzinfo=timezone.utc)
        t = dt.timestamp()
    else:
        raise ValueError(f"not a timestamp: {value!r}")
    if not math.isfinite(t):
        raise ValueError(f"not a finite timestamp: {value!r}")
    return t
