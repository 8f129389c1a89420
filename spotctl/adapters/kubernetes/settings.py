"""How the Kubernetes adapter behaves: :class:`Settings`, read from ``[regions.R.kubernetes]``."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Settings:
    """How the adapter behaves (from ``[regions.R.kubernetes]``; the keys are in the package doc)."""

    namespace: str | None = None
    timeout_seconds: float = 10.0
    watch_idle_seconds: float = 0.3
    watch_max_seconds: float = 10.0
    cordon_taint: str = "spotctl.io/reclaim"
    expected_seconds_annotation: str = "spotctl.io/expected-seconds"
    default_pod_seconds: int = 3600
    deadline_margin_seconds: float = 10.0
    page_size: int = 500
    node_label_selector: str | None = None
