"""The built-in demo region's configuration: pure data.

The simulator (``spotctl.sim``) builds its world from these pools; the config
loader offers them as the ``demo`` region when no configuration exists.
"""

from __future__ import annotations

from typing import Any

DEMO_REGION_NAME = "demo"

DEMO_POOLS: dict[str, dict[str, Any]] = {
    "gp-az1": {
        "kind": "vm", "class": "headroom", "az": "az1", "flavor": "spot.gp.8x32",
        "on_demand_price": 0.42,
        "vcpu": 8, "ram_mb": 32768, "gpus": 0, "max_nodes": 40, "boot_seconds": 90,
        "kubernetes": {"labels": {"spot.pool": "gp"}, "taints": ["spot=true:NoSchedule"]},
        "slurm": {"partition": "spot", "features": ["gp"]},
    },
    "gp-az2": {
        "kind": "vm", "class": "headroom", "az": "az2", "flavor": "spot.gp.8x32",
        "on_demand_price": 0.42,
        "vcpu": 8, "ram_mb": 32768, "gpus": 0, "max_nodes": 40, "boot_seconds": 90,
        "kubernetes": {"labels": {"spot.pool": "gp"}, "taints": ["spot=true:NoSchedule"]},
        "slurm": {"partition": "spot", "features": ["gp"]},
    },
    "mem-az1": {
        "kind": "vm", "class": "reserved-idle", "az": "az1", "flavor": "spot.mem.16x128",
        "on_demand_price": 1.15,
        "vcpu": 16, "ram_mb": 131072, "gpus": 0, "max_nodes": 16, "boot_seconds": 120,
        "kubernetes": {"labels": {"spot.pool": "mem"}, "taints": ["spot=true:NoSchedule"]},
        "slurm": {"partition": "spot", "features": ["gp", "highmem"]},
    },
    "gp-rsv-az2": {
        "kind": "vm", "class": "reserved-idle", "az": "az2", "flavor": "spot.gp.8x32",
        "on_demand_price": 0.42,
        "vcpu": 8, "ram_mb": 32768, "gpus": 0, "max_nodes": 24, "boot_seconds": 90,
        "kubernetes": {"labels": {"spot.pool": "gp"}, "taints": ["spot=true:NoSchedule"]},
        "slurm": {"partition": "spot", "features": ["gp"]},
    },
    "bm-cpu-az1": {
        "kind": "baremetal", "class": "headroom", "az": "az1",
        "on_demand_price": 4.9,
        "resource_class": "baremetal.cpu.64", "flavor": "spot.bm.cpu64",
        "vcpu": 64, "ram_mb": 524288, "gpus": 0, "max_nodes": 6, "boot_seconds": 600,
        "cleaning_seconds": 900,
        "kubernetes": {"labels": {"spot.pool": "bm"}, "taints": ["spot=true:NoSchedule"]},
        "slurm": {"partition": "spot-bm", "features": ["bm", "gp"]},
    },
    "bm-gpu-az2": {
        "kind": "baremetal", "class": "reserved-idle", "az": "az2",
        "on_demand_price": 12.6,
        "resource_class": "baremetal.gpu.a100x4", "flavor": "spot.bm.gpu4",
        "vcpu": 32, "ram_mb": 262144, "gpus": 4, "max_nodes": 4, "boot_seconds": 600,
        "cleaning_seconds": 900,
        "kubernetes": {"labels": {"spot.pool": "gpu"}, "taints": ["spot=true:NoSchedule", "nvidia.com/gpu=present:NoSchedule"]},
        "slurm": {"partition": "spot-gpu", "features": ["gpu", "a100"]},
    },
}

DEMO_REGION: dict[str, Any] = {
    "backend": "sim",
    "seed": 7,
    "budget": {"rate": 0.5, "burst": 30},
    "policy": {
        "spend_cap_per_hour": 60.0,
        "disruption_budget_pct": 20.0,
        "idle_ttl_seconds": 600,
        "drain_seconds": 120,
        "failure_ttl_seconds": 900,
        "default_pod_seconds": 3600,
        "no_notice_max_seconds": 7200,
        "currency": "EUR",
    },
    "pools": DEMO_POOLS,
}
