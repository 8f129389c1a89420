"""How a plan input is named: its digest's canonical text, written in parts (issue 14).

:meth:`spotctl.core.plan_input.PlanInput.digest` is the SHA-256 of the input's canonical JSON (sorted keys,
no spaces, ASCII). Its large parts, the demand and the nodes, are written here without building the JSON of
every class's pools again and again: each distinct pool set (:func:`pool_sets`) is encoded once, and each
class from a template (:func:`demand_json`) that writes what the JSON encoder writes. A pool's recorded form
(:func:`pool_to_dict`, :func:`pool_from_dict`) is here too.
"""

from __future__ import annotations

import json
from json.encoder import encode_basestring_ascii
from typing import Any

from .models import KubernetesBinding, PoolClass, PoolKind, PoolSpec, Shape, SlurmBinding

JSON = json.JSONEncoder(separators=(",", ":"), default=str)
SORTED_JSON = json.JSONEncoder(sort_keys=True, separators=(",", ":"), default=str)
MARKS = ("\x00spotctl:demand\x00", "\x00spotctl:nodes\x00")  # where the two large parts go in the digest's text
#: Digest versions, recorded with the input (none: 1), so that a replay names a recorded input as it was
#: named. Version 1 (plans recorded before issue 14, and the smaller inputs of its first rounds): SHA-256 of
#: the canonical JSON of the input with each class's pools. Version 2 (every new input): SHA-256 of the
#: canonical JSON of the recorded form (``to_dict``: each distinct pool set once), the very text the store
#: records, so that naming and recording the input encode it once.
DIGEST_VERSION = 2  # of new inputs
DIGEST_VERSIONS = (1, 2)  # that a recorded input may carry


def pool_sets(demand: Any, prefix: tuple[list[tuple[str, ...]], list[int]] | None = None,
              ) -> tuple[list[tuple[str, ...]], list[int]]:
    """The distinct pool sets of ``demand`` (classes), in order of first use, and each class's set. Classes
    that share a pools tuple (``build_input`` interns them) cost one look-up each, not one per pool.
    ``prefix``: what this returned for the first classes of ``demand`` (only the rest are looked at)."""
    sets: list[tuple[str, ...]] = list(prefix[0]) if prefix else []
    of_class = list(prefix[1]) if prefix else []
    by_value: dict[tuple[str, ...], int] = {t: i for i, t in enumerate(sets)}
    by_id: dict[int, int] = {}
    for d in demand[len(of_class):]:
        i = by_id.get(id(d.pools))
        if i is None:
            i = by_value.setdefault(d.pools, len(sets))
            if i == len(sets):
                sets.append(d.pools)
            by_id[id(d.pools)] = i
        of_class.append(i)
    return sets, of_class


def demand_json(demand: Any, sets: list[tuple[str, ...]], of_class: list[int], *, v2: bool) -> str:
    """``[c.to_dict() for c in demand]`` as canonical JSON; ``v2``: each class's ``pools`` as ``pool_set``
    (its index in ``sets``), as :meth:`~spotctl.core.plan_input.PlanInput.to_dict` records it."""
    pools = [f'"pool_set":{i}' for i in range(len(sets))] if v2 else [
        f'"pools":{JSON.encode(list(t))}' for t in sets]
    esc = encode_basestring_ascii  # what the encoder writes for a str (ensure_ascii)
    parts = []
    for d, i in zip(demand, of_class):
        s = d.shape
        try:
            if not (type(d.count) is type(d.expected_seconds) is type(d.priority) is type(s.gpus)
                    is type(s.ram_mb) is type(s.vcpu) is int):
                raise TypeError
            parts.append(f'{{"count":{d.count},"examples":[{",".join(map(esc, d.examples))}],"expected_seconds":'
                         f'{d.expected_seconds},"key":{esc(d.key)},{pools[i]},"priority":{d.priority},'
                         f'"scheduler":{esc(d.scheduler)},"shape":{{"gpus":{s.gpus},"ram_mb":{s.ram_mb},'
                         f'"vcpu":{s.vcpu}}}}}')
        except TypeError:  # a value of another type (a replayed record's float, say): as the encoder writes it
            c = d.to_dict()
            if v2:
                del c["pools"]
                c["pool_set"] = i
            parts.append(SORTED_JSON.encode(c))
    return "[" + ",".join(parts) + "]"


def pool_to_dict(p: PoolSpec) -> dict[str, Any]:
    return {
        "name": p.name, "kind": str(p.kind), "class": str(p.pool_class), "az": p.az, "shape": p.shape.to_dict(),
        "flavor": p.flavor, "resource_class": p.resource_class, "aggregate": p.aggregate, "image": p.image,
        "networks": p.networks, "max_nodes": p.max_nodes,
        "kubernetes": {"labels": [list(x) for x in p.kubernetes.labels], "taints": list(p.kubernetes.taints)},
        "slurm": {"partition": p.slurm.partition, "features": list(p.slurm.features)},
        "boot_seconds": p.boot_seconds, "cleaning_seconds": p.cleaning_seconds, "list_price": p.list_price,
    }


def pool_from_dict(d: dict[str, Any]) -> PoolSpec:
    return PoolSpec(
        name=d["name"], kind=PoolKind(d["kind"]), pool_class=PoolClass(d["class"]), az=d["az"],
        shape=Shape(**d["shape"]), flavor=d["flavor"], resource_class=d["resource_class"], aggregate=d["aggregate"],
        image=d["image"], networks=d["networks"], max_nodes=d["max_nodes"],
        kubernetes=KubernetesBinding(labels=tuple(tuple(x) for x in d["kubernetes"]["labels"]),
                                     taints=tuple(d["kubernetes"]["taints"])),
        slurm=SlurmBinding(partition=d["slurm"]["partition"], features=tuple(d["slurm"]["features"])),
        boot_seconds=d["boot_seconds"], cleaning_seconds=d["cleaning_seconds"], list_price=d["list_price"],
    )
