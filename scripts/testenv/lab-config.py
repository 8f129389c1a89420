#!/usr/bin/env python3
"""Merge the test services' fragments into one `lab` region and print its path.

The richest lab that is up: the OpenStack test cloud's config (backend = "openstack") when that
cloud is up, else the Slurm test env's config (simulated cloud); then the real schedulers'
endpoint tables: `[regions.lab.slurm]` and `[regions.lab.kubernetes]`. Pool bindings come with
the base config. Used by `scripts/testenv/all env` (export SPOTCTL_CONFIG=...).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(os.environ.get("SPOTCTL_TESTENV_ROOT", "/var/tmp/spotctl-testenv"))


def table(text: str, header: str) -> str:
    """The text of one TOML table (from its header to the next header)."""
    m = re.search(rf"^\[{re.escape(header)}\]\s*$(.*?)(?=^\[|\Z)", text, re.S | re.M)
    return f"[{header}]{m.group(1)}" if m else ""


def main() -> int:
    openstack = ROOT / "openstack" / "spotctl.toml"
    slurm = ROOT / "slurm" / "spotctl.toml"
    k8s = ROOT / "k8s" / "lab-kubernetes.toml"
    if openstack.exists() and os.environ.get("SPOTCTL_TESTENV_OPENSTACK_UP") == "1":
        base = openstack.read_text()
        extra = [table(slurm.read_text(), "regions.lab.slurm")] if slurm.exists() else []
        extra += [table(k8s.read_text(), "regions.lab.kubernetes")] if k8s.exists() else []
    elif slurm.exists():
        base = slurm.read_text()
        extra = [k8s.read_text()] if k8s.exists() else []
    else:
        print("lab-config: neither the OpenStack nor the Slurm test env has written a config", file=sys.stderr)
        return 1
    merged = base.rstrip() + "\n\n" + "\n\n".join(x.strip() for x in extra if x.strip()) + "\n"
    tomllib.loads(merged)  # valid TOML or fail loudly
    out = ROOT / "lab.toml"
    out.write_text(merged)
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
