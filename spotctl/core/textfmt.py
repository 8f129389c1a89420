"""How the planner's explanations write values: durations, times to come and node shapes.

The same forms the CLI's tables use (``spotctl.cli.fmt`` writes durations with :func:`duration_text`), so
that an explanation and the table beside it read alike: ``45s``, ``12m``, ``3h05m``, ``2d04h``;
``2026-12-02 01:58:40Z (in 6h27m)``; ``8 vCPU/32 GiB``, ``/1 GPU`` when it has some.
"""

from __future__ import annotations

from .models import Shape
from .timefmt import iso


def duration_text(seconds: float) -> str:
    """A duration, to the unit that reads: ``45s``, ``12m``, ``3h05m``, ``2d04h`` (``-`` before a negative one)."""
    s = round(seconds)
    if s < 0:
        return f"-{duration_text(-s)}"
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m"
    if s < 2 * 86_400:
        return f"{s // 3600}h{(s % 3600) // 60:02d}m"
    return f"{s // 86_400}d{(s % 86_400) // 3600:02d}h"


def when_text(t: float, now: float) -> str:
    """A time to come, and how far off: ``2026-12-02 01:58:40Z (in 6h27m)``."""
    return f"{iso(t, sep=' ')} (in {duration_text(max(0.0, t - now))})"


def shape_text(s: Shape) -> str:
    """A node or unit shape: ``8 vCPU/32 GiB``, ``2 vCPU/512 MiB``, ``32 vCPU/256 GiB/4 GPU``."""
    ram = f"{s.ram_mb / 1024:g} GiB" if s.ram_mb >= 1024 else f"{s.ram_mb} MiB"
    return f"{s.vcpu} vCPU/{ram}" + (f"/{s.gpus} GPU" if s.gpus else "")
