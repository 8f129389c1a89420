"""How tables write values: one way for each kind, so that every table reads the same.

JSON and YAML carry the raw values (numbers, epoch seconds, lists); only tables go through here. A
table's header names the unit (``price/node-h (EUR)``, ``boot (s)``), and its cells use these:

- times: ``2026-12-01 18:14:46Z`` (UTC, to the second) — :func:`ts`;
- durations: ``45s``, ``12m``, ``3h05m``, ``2d04h`` — :func:`duration`;
- times where the seconds matter (latencies, notice leads): ``0.128s``, ``120s`` — :func:`seconds`;
- node shapes: ``8 vCPU/32 GiB`` and ``/1 GPU`` when it has some — :func:`shape`;
- money: 4 decimals, the currency once in the header — :func:`money`;
- shares: ``91.3 %`` — :func:`pct`;
- counts by name: ``kubernetes 20, slurm 22`` — :func:`counts`; lists: ``a, b`` — :func:`items`;
- configuration values: ``true``, ``a, b``, ``k=v`` — :func:`setting`;
- nothing known: ``-`` (never ``None``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

NONE = "-"


def ts(t: float | None) -> str:
    """A time, UTC to the second: ``2026-12-01 18:14:46Z``."""
    if t is None:
        return NONE
    from datetime import datetime, timezone

    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%SZ")


def duration(seconds: float | None) -> str:
    """A duration, to the unit that reads: ``45s``, ``12m``, ``3h05m``, ``2d04h``."""
    if seconds is None:
        return NONE
    from spotctl.core.textfmt import duration_text  # the form the planner's explanations use too

    return duration_text(seconds)


def seconds(value: float | None) -> str:
    """A time counted in seconds, where the seconds matter (a latency, a notice lead, a deadline):
    ``0.128s``, ``2.5s``, ``120s``, ``1250s`` (three significant digits under 10 s, whole seconds above)."""
    if value is None:
        return NONE
    if abs(value) < 10 and value != int(value):
        return f"{value:.3g}s"
    return f"{int(round(value))}s"


def shape(vcpu: float, ram_mb: float, gpus: float = 0) -> str:
    """A node or unit shape: ``8 vCPU/32 GiB``, ``0.5 vCPU/512 MiB``, ``8 vCPU/64 GiB/1 GPU``."""
    cpu = f"{vcpu:g}"
    ram = f"{ram_mb / 1024:g} GiB" if ram_mb >= 1024 else f"{ram_mb:g} MiB"
    out = f"{cpu} vCPU/{ram}"
    if gpus:
        out += f"/{gpus:g} GPU"
    return out


def shape_of(d: Mapping[str, Any] | Any) -> str:
    """:func:`shape` of a mapping or object with ``vcpu``, ``ram_mb`` and ``gpus``."""
    get = d.get if isinstance(d, Mapping) else (lambda k, default=0: getattr(d, k, default))
    return shape(get("vcpu", 0) or 0, get("ram_mb", 0) or 0, get("gpus", 0) or 0)


def money(value: float | None) -> str:
    """An amount (a price per node-hour, a cost): 4 decimals, the currency in the column header."""
    return NONE if value is None else f"{value:.4f}"


def pct(value: float | None, digits: int = 1) -> str:
    """A share given in percent (``91.3`` → ``91.3 %``)."""
    return NONE if value is None else f"{value:.{digits}f} %"


def ratio_pct(part: float, whole: float, digits: int = 1) -> str:
    """``part`` of ``whole`` as a percentage; ``-`` when there is no whole."""
    return NONE if not whole else pct(100.0 * part / whole, digits)


def counts(d: Mapping[str, Any] | None) -> str:
    """Counts by name, sorted by name: ``kubernetes 20, slurm 22`` (``-`` when empty)."""
    if not d:
        return NONE
    return ", ".join(f"{k} {v}" for k, v in sorted(d.items()))


def items(xs: Iterable[Any] | None) -> str:
    """A list: ``a, b, c`` (``-`` when empty)."""
    out = ", ".join(str(x) for x in (xs or ()))
    return out or NONE


def text(value: Any) -> str:
    """Any other value as a cell: ``-`` for None, lists and mappings written as above, never a repr."""
    if value is None:
        return NONE
    if isinstance(value, Mapping):
        return counts(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        return items(value)
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def setting(value: Any) -> str:
    """A configuration value as TOML would write it, unquoted: ``true``, ``a, b``, ``k=v, k2=v2``; a
    multi-line string as its first line and the line count; ``-`` when unset."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or NONE
    if isinstance(value, str) and "\n" in value.strip():
        lines = value.strip().splitlines()
        return f"{lines[0]} … ({len(lines)} lines)"
    return text(value)
