"""The embedded demo region: a simulated private cloud + provider feed + schedulers.

``SimWorld`` implements the core ports on a virtual clock, deterministic for a
seed; ``generated_region`` builds a large synthetic region for benchmarks;
``demo_region`` is the built-in demo region's configuration.
"""

from __future__ import annotations

from spotctl.core.config import RegionConfig

from .generate import generated_region
from .knobs import Knobs
from .world import SimWorld

__all__ = ["Knobs", "SimWorld", "demo_region", "generated_region"]


def demo_region() -> RegionConfig:
    """The built-in demo region (six pools over two AZs), ignoring any user configuration."""
    from spotctl.core.config import load_config

    return load_config(env={}, system_path="/nonexistent/spotctl.toml",
                       user_path="/nonexistent/spotctl-user.toml").region("demo")
