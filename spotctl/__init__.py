"""spotctl — Spot Capacity Orchestrator for on-premises OpenStack clouds."""

__version__ = "0.1.0"
