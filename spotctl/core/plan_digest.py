"""How a plan input is named: its digest's canonical text, written in parts (issue 14).

:meth:`spotctl.core.plan_input.PlanInput.digest` is the SHA-256 of the input's canonical JSON (sorted keys,
no spaces, ASCII). Its large parts, the demand and the nodes, are written here without building the JSON of
every class's pools again and again: each distinct pool set (:func:`pool_sets`) is encoded once, and each
class from a template (:func:`demand_json`) that writes what the JSON encoder writes. A pool's recorded form
(:func:`pool_to_dict`, :func:`pool_from_dict`) is here too.

From version 3 on, the nodes and the demand are recorded as columns (:func:`node_columns`,
:func:`demand_columns`): one list per field, which the JSON encoder writes in C, where the per-item forms of
versions 1 and 2 cost a dict (or a template) per node and class. Each item is still read once (its fields a
row, the rows transposed in C): a walk per field over 100k scattered objects cost more than it saved. The
nodes are named in a quarter of version 2's time, the demand of 10k classes in 90 % of it (of 100k distinct
classes in about the same), and the recorded text is a third to a half of version 2's (compressed, as the store
keeps it, a fifth smaller). :func:`node_rows` and :func:`demand_rows` read the columns back as the per-item
forms, for ``PlanInput.from_dict``.
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
#: Version 3 (every new input): the same with the nodes and the demand as columns (:func:`node_columns`,
#: :func:`demand_columns`).
DIGEST_VERSION = 3  # of new inputs
DIGEST_VERSIONS = (1, 2, 3)  # that a recorded input may carry
#: A node's fields as version 3 records them, one column each (``used`` as three); the last two only when some
#: node has a value (as versions 1 and 2 record them only when known, so that an input without keeps its name)
NODE_COLUMNS = ("id", "pool", "state", "used_vcpu", "used_ram_mb", "used_gpus", "host", "running", "cordoned",
                "idle_since", "notice", "price", "drain_started", "protected_until", "protect_closed",
                "cordoned_by_us", "known")
NODE_OPTIONAL = ("launched_at", "work_started_at")
#: A demand class's fields as version 3 records them (``shape`` as three, ``pools`` as the index of its pool set)
DEMAND_COLUMNS = ("key", "scheduler", "vcpu", "ram_mb", "gpus", "priority", "expected_seconds", "count",
                  "pool_set", "examples")


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


def node_columns(nodes: Any) -> dict[str, list[Any]]:
    """The nodes (``NodeView``) as version 3 records them: a list per field (:data:`NODE_COLUMNS`, and each of
    :data:`NODE_OPTIONAL` that some node has). Each node is read once, its fields a row, and the rows turned
    into columns in C (:func:`_columns`): a walk per field would read 100k scattered objects ten times over."""
    rows = [(n.id, n.pool, n.state.value, u.vcpu, u.ram_mb, u.gpus, n.host, n.running, n.cordoned, n.idle_since,
             notice_dict(n.notice), n.price, n.drain_started, n.protected_until,
             n.protect_closed, n.cordoned_by_us, n.known, n.launched_at, n.work_started_at)
            for n in nodes for u in (n.used,)]
    cols = _columns(NODE_COLUMNS + NODE_OPTIONAL, rows)
    for name in NODE_OPTIONAL:
        if all(v is None for v in cols[name]):
            del cols[name]
    return cols


def _columns(names: tuple[str, ...], rows: list[tuple[Any, ...]]) -> dict[str, list[Any]]:
    """Rows of fields in the order of ``names`` as a list per name (transposed in C)."""
    return dict(zip(names, map(list, zip(*rows)))) if rows else {name: [] for name in names}


def notice_dict(n: Any) -> dict[str, Any] | None:
    """A node's notice as recorded (every version); None: none."""
    if n is None:
        return None
    return {"id": n.id, "instance_id": n.instance_id, "kind": str(n.kind), "issued_at": n.issued_at,
            "deadline": n.deadline, "reason": n.reason, "pool": n.pool}


def demand_columns(demand: Any, of_class: list[int]) -> dict[str, list[Any]]:
    """The demand classes as version 3 records them: a list per field (:data:`DEMAND_COLUMNS`), each class's
    pools as the index of its pool set (``of_class``, :func:`pool_sets`); each class read once (see
    :func:`node_columns`)."""
    rows = [(d.key, d.scheduler, s.vcpu, s.ram_mb, s.gpus, d.priority, d.expected_seconds, d.count, i, d.examples)
            for d, i in zip(demand, of_class) for s in (d.shape,)]  # (a tuple is written as a JSON array)
    return _columns(DEMAND_COLUMNS, rows)


def _rows(cols: Any, required: tuple[str, ...], optional: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Columns (a dict of equal-length lists, ``required`` all there) as one dict per item; ValueError when
    they are not (a record damaged or of another program)."""
    if not isinstance(cols, dict):
        raise ValueError(f"columns must be an object, not {type(cols).__name__}")
    missing = [k for k in required if k not in cols]
    if missing:
        raise ValueError(f"columns {missing} missing")
    names = [*required, *(k for k in optional if k in cols)]
    if any(not isinstance(cols[k], list) for k in names):
        raise ValueError("every column must be a list")
    sizes = {len(cols[k]) for k in names}
    if len(sizes) > 1:
        raise ValueError(f"columns of different lengths {sorted(sizes)}")
    return [dict(zip(names, values)) for values in zip(*(cols[k] for k in names))]


def node_rows(cols: Any) -> list[dict[str, Any]]:
    """Version 3's node columns read back as the per-node form of versions 1 and 2 (``used`` a shape dict)."""
    return [_shape_of(r, "used", "used_") for r in _rows(cols, NODE_COLUMNS, NODE_OPTIONAL)]


def demand_rows(cols: Any) -> list[dict[str, Any]]:
    """Version 3's demand columns read back as the per-class form of version 2 (``shape`` a dict, ``pool_set``)."""
    return [_shape_of(r, "shape", "") for r in _rows(cols, DEMAND_COLUMNS)]


def _shape_of(row: dict[str, Any], name: str, prefix: str) -> dict[str, Any]:
    """``row`` with its three shape columns (``prefix`` + vcpu, ram_mb, gpus) put back as one dict ``name``."""
    row[name] = {k: row.pop(prefix + k) for k in ("vcpu", "ram_mb", "gpus")}
    return row


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
