"""Servers that spotctl itself runs (reference receivers, APIs served by the simulator)."""
