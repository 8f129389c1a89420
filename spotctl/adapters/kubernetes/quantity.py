"""Kubernetes resource quantities and what a pod asks of a node: :func:`parse_quantity`,
:func:`pod_resources` (containers, sidecars, init containers, overhead) and :func:`to_shape`
(whole vCPUs, MiB, GPUs)."""

from __future__ import annotations

import math
import re
from typing import Any

from spotctl.core.models import Shape

GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu")

_QTY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:[eE]([+-]?\d+))?(Ki|Mi|Gi|Ti|Pi|Ei|n|u|m|k|M|G|T|P|E)?$")
_SUFFIX = {None: 1, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
           "E": 1e18, "Ki": 2 ** 10, "Mi": 2 ** 20, "Gi": 2 ** 30, "Ti": 2 ** 40, "Pi": 2 ** 50, "Ei": 2 ** 60}


def parse_quantity(value: Any) -> float:
    """A Kubernetes resource quantity ("500m", "1.5", "4Gi", "1e3") as a number of base units."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    m = _QTY.match(str(value).strip())
    if not m:
        raise ValueError(f"invalid quantity {value!r}")
    n = float(m.group(1)) * _SUFFIX[m.group(3)]
    if m.group(2):
        n *= 10 ** int(m.group(2))
    if n < 0:
        raise ValueError(f"negative quantity {value!r}")
    return n


def _requests_of(container: dict) -> tuple[float, float, float]:
    res = container.get("resources") or {}
    req = dict(res.get("limits") or {})  # requests default to limits when only limits are set
    req.update(res.get("requests") or {})
    cpu = parse_quantity(req["cpu"]) if "cpu" in req else 0.0
    mem = parse_quantity(req["memory"]) if "memory" in req else 0.0
    gpu = sum(parse_quantity(req[g]) for g in GPU_RESOURCES if g in req)
    return cpu, mem, gpu


def pod_resources(spec: dict) -> tuple[float, float, float]:
    """What the pod asks of a node (cores, bytes, GPUs): containers (plus sidecars) vs. the largest init
    container, plus the pod overhead."""
    cpu = mem = gpu = 0.0
    init_cpu = init_mem = init_gpu = 0.0
    side_cpu = side_mem = side_gpu = 0.0
    for c in spec.get("initContainers") or []:
        c_cpu, c_mem, c_gpu = _requests_of(c)
        if c.get("restartPolicy") == "Always":  # a sidecar: runs alongside the containers
            side_cpu, side_mem, side_gpu = side_cpu + c_cpu, side_mem + c_mem, side_gpu + c_gpu
        else:
            init_cpu, init_mem, init_gpu = (max(init_cpu, side_cpu + c_cpu), max(init_mem, side_mem + c_mem),
                                            max(init_gpu, side_gpu + c_gpu))
    for c in spec.get("containers") or []:
        c_cpu, c_mem, c_gpu = _requests_of(c)
        cpu, mem, gpu = cpu + c_cpu, mem + c_mem, gpu + c_gpu
    cpu, mem, gpu = max(cpu + side_cpu, init_cpu), max(mem + side_mem, init_mem), max(gpu + side_gpu, init_gpu)
    overhead = spec.get("overhead") or {}
    cpu += parse_quantity(overhead["cpu"]) if "cpu" in overhead else 0.0
    mem += parse_quantity(overhead["memory"]) if "memory" in overhead else 0.0
    return cpu, mem, gpu


def to_shape(cpu: float, mem: float, gpu: float) -> Shape:
    """Whole vCPUs (rounded up), MiB (rounded up) and GPUs."""
    return Shape(vcpu=math.ceil(cpu - 1e-9), ram_mb=math.ceil(mem / 2 ** 20 - 1e-9), gpus=math.ceil(gpu - 1e-9))
