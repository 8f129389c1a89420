"""What slurmrestd sends, read: numbers and states of every API generation, hostlists, array specs,
TRES strings, error entries, and a pending job as the work units more nodes would start.

Pure functions (no I/O, no clock): :mod:`.scheduler` reads the payloads and calls these.

Object shapes: v0.0.38 sends plain numbers, v0.0.40+ ``{"set", "infinite", "number"}`` objects,
state lists, and partition limits under ``maximums`` (see :func:`_num`, :func:`_flags`,
:func:`partition_max_nodes`). Names with a leading underscore are this package's own helpers
(the scheduler and the REST client use them), not spotctl's API.
"""

from __future__ import annotations

import math
import re
from typing import Any, overload

from spotctl.core.models import Exclusion, PoolSpec, Scheduler, Shape, WorkUnit

ESLURM_INVALID_NODE_NAME = 2018  # slurm_errno.h: "Invalid node name specified"

# Pending reasons that more nodes would fix (Priority: only when jobs ahead wait for resources).
_RESOURCE_REASONS = {"Resources", "PartitionNodeLimit", "ReqNodeNotAvail", "NodeDown",
                     "Nodes_required_for_job_are_DOWN,_DRAINED_or_reserved_for_jobs_in_higher_priority_partitions"}
_EXCLUDED_REASONS = {
    "JobHeldUser": "held by its user (JobHeldUser)",
    "JobHeldAdmin": "held by an administrator (JobHeldAdmin)",
    "Dependency": "waits for a dependency",
    "DependencyNeverSatisfied": "dependency can never be satisfied",
    "BeginTime": "begin time is in the future",
    "None": "not yet evaluated by the Slurm scheduler",
}
_NO_TIME_LIMIT = 4294967294  # Slurm's NO_VAL / INFINITE minutes (v0.0.38 plain numbers)


def version_key(v: str) -> tuple[int, ...]:
    """An API version (``v0.0.40``) as a sortable tuple."""
    return tuple(int(x) for x in v.lstrip("v").split("."))


def _error_numbers(body: dict[str, Any] | None) -> set[int]:
    """The Slurm error numbers of an answer's ``errors`` entries."""
    errs = (body or {}).get("errors") or []
    return {e["error_number"] for e in errs if isinstance(e, dict) and isinstance(e.get("error_number"), int)} \
        if isinstance(errs, list) else set()


def error_message(body: dict[str, Any] | None, text: str) -> str:
    """slurmrestd's error entries; the raw text only when the answer is not JSON (``body`` None)."""
    if body is not None:
        errs = body.get("errors") or []
        parts = []
        for e in errs if isinstance(errs, list) else []:
            if isinstance(e, dict):
                parts.append(" / ".join(str(e[k]) for k in ("description", "error", "source") if e.get(k)))
        return "; ".join(p for p in parts if p) or "no error message"
    return (text or "").strip()[:300] or "no error message"


@overload
def _num(v: object, default: None = None) -> float | None: ...


@overload
def _num(v: object, default: float) -> float: ...


def _num(v: object, default: float | None = None) -> float | None:
    """A number from either form: plain (v0.0.38) or ``{"set", "infinite", "number"}`` (v0.0.39+);
    ``default`` when unset, infinite or absent. ValueError when it is not a number."""
    if isinstance(v, dict):
        if not v.get("set", True) or v.get("infinite"):
            return default
        v = v.get("number")
    if v is None or isinstance(v, bool):
        return default
    if isinstance(v, (int, float)):
        return v
    raise ValueError(f"not a number: {v!r}")


def _flags(v: Any) -> set[str]:
    """Job or node states as a set of upper-case words ("idle", ["IDLE", "DRAIN"], "IDLE+DRAIN")."""
    if v is None:
        return set()
    items = v if isinstance(v, list) else [v]
    out: set[str] = set()
    for item in items:
        out.update(p.upper() for p in str(item).split("+") if p)
    return out


def _text(v: Any) -> str:
    """A string field that newer versions may send as a list (joined with commas); "" for none."""
    if v is None:
        return ""
    if isinstance(v, list):
        return ",".join(str(x) for x in v)
    return str(v)


def partition_max_nodes(p: dict[str, Any]) -> float | None:
    """A partition's MaxNodes (per job), None when unlimited or not given.

    v0.0.38/v0.0.39: ``maximum_nodes_per_job``; v0.0.40+: ``maximums.nodes`` (``{"set", "infinite", "number"}``).
    """
    maximums = p.get("maximums")
    if isinstance(maximums, dict) and "nodes" in maximums:
        return _num(maximums["nodes"], None)
    return _num(p.get("maximum_nodes_per_job"), None)


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist (``a-n[1-3,7],b[01-02]``) into names."""
    out: list[str] = []
    for part in re.findall(r"[^,\[]+(?:\[[^\]]*\])?[^,\[]*(?:\[[^\]]*\][^,\[]*)*", expr or ""):
        out.extend(_expand_one(part))
    return out


def _expand_one(s: str) -> list[str]:
    m = re.search(r"\[([^\]]*)\]", s)
    if not m:
        return [s] if s else []
    head, tail = s[: m.start()], s[m.end():]
    names: list[str] = []
    for rng in m.group(1).split(","):
        if "-" in rng:
            lo, hi = rng.split("-", 1)
            width = len(lo) if lo.startswith("0") else 0
            names.extend(f"{head}{i:0{width}d}" for i in range(int(lo), int(hi) + 1))
        else:
            names.append(head + rng)
    return [n2 for n in names for n2 in _expand_one(n + tail)]


def array_tasks(spec: str) -> list[str]:
    """Task ids left in an array spec such as ``3-9%2``, ``1,4,7-8`` or ``0-15:4``."""
    spec = spec.split("%", 1)[0]
    out: list[str] = []
    for part in spec.split(","):
        part, _, step = part.partition(":")
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(str(i) for i in range(int(lo), int(hi) + 1, int(step or 1)))
        elif part.strip():
            out.append(part.strip())
    return out


_GPU = re.compile(r"gpu(?::[\w.-]+)?[:=](\d+)")
_MEM = re.compile(r"(?:^|,)mem=(\d+(?:\.\d+)?)([KMGT]?)", re.IGNORECASE)


def _gpus(*specs: str) -> int:
    """The GPU count of the first TRES/GRES spec that names one (``gres/gpu:a100:2``, ``gpu=3``); 0 when none."""
    for s in specs:
        m = _GPU.search(s or "")
        if m:
            return int(m.group(1))
    return 0


def _mem_mb(tres: str) -> int | None:
    """The ``mem=`` of a TRES string in MiB; None when it has none."""
    m = _MEM.search(tres or "")
    if not m:
        return None
    scale = {"": 1, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}[m.group(2).upper()]
    return int(float(m.group(1)) * scale)


def short_of_nodes(pending: list[dict[str, Any]]) -> set[str]:
    """Partitions where some pending job waits for resources (a job pending for Priority there counts)."""
    out: set[str] = set()
    for j in pending:
        if _text(j.get("state_reason")) in _RESOURCE_REASONS:
            out.update(p for p in _text(j.get("partition")).split(",") if p)
    return out


def job_units(j: dict[str, Any], pools: dict[str, PoolSpec], partitions: dict[str, dict[str, Any]],
              short_of_nodes: set[str], default_time_limit: int) -> tuple[list[WorkUnit], Exclusion | None]:
    """A pending job as work units (one per node and array task), or the reason more nodes would not
    start it. ``partitions`` are needed for PartitionNodeLimit only; ``default_time_limit`` is the
    expected duration of a job without a time limit. KeyError/TypeError/ValueError: a malformed job."""
    job_id = j["job_id"]
    if not isinstance(job_id, int):
        raise TypeError(f"job_id is {type(job_id).__name__}")
    uid = f"slurm/{job_id}"
    reason = _text(j.get("state_reason")) or "None"
    parts = [p for p in _text(j.get("partition")).split(",") if p]
    node_count = int(_num(j.get("node_count"), 1) or 1)

    def excl(why: str) -> tuple[list[WorkUnit], Exclusion]:
        return [], Exclusion(uid, Scheduler.SLURM, why)

    if reason in _EXCLUDED_REASONS:
        return excl(_EXCLUDED_REASONS[reason])
    if reason.startswith("JobHeld"):
        return excl(f"held ({reason})")
    if reason == "Priority" and not short_of_nodes.intersection(parts):
        return excl("waits for priority behind jobs that are not short of nodes")
    if reason == "PartitionNodeLimit":
        limits = [x for x in (partition_max_nodes(partitions.get(p, {})) for p in parts) if x is not None and x >= 0]
        if limits and node_count > max(limits):
            return excl("asks more nodes than its partition allows per job (MaxNodes)")
    if reason == "ReqNodeNotAvail" and _text(j.get("required_nodes")):
        return excl("pinned to specific nodes that are unavailable")
    if reason not in _RESOURCE_REASONS and reason != "Priority":
        return excl(f"pending for {reason}: more nodes would not start it")
    if _text(j.get("required_nodes")):
        return excl("pinned to specific nodes (--nodelist)")
    feat_expr = _text(j.get("features"))
    if re.search(r"[|\[\]*()!]", feat_expr):
        return excl("feature expression with OR/counts is not mapped to pools")
    features = tuple(sorted({f for f in re.split(r"[&,]", feat_expr) if f}))

    cpus_total = int(_num(j.get("cpus"), 1) or 1)
    cpus = max(math.ceil(cpus_total / node_count), int(_num(j.get("minimum_cpus_per_node"), 0) or 0), 1)
    mem = _num(j.get("memory_per_node"))
    per_cpu = _num(j.get("memory_per_cpu"))
    if mem is None and per_cpu is not None:
        mem = per_cpu * cpus
    if mem is None:
        total = _mem_mb(_text(j.get("tres_req_str")))
        mem = math.ceil(total / node_count) if total else 0
    gpus = _gpus(_text(j.get("tres_per_node")), _text(j.get("gres_detail")))
    if not gpus:
        per_job = _gpus(_text(j.get("tres_per_job")))
        gpus = math.ceil(per_job / node_count) if per_job else 0
    limit = _num(j.get("time_limit"))
    expected = int(limit) * 60 if limit and limit < _NO_TIME_LIMIT else default_time_limit
    priority = int(_num(j.get("priority"), 0) or 0)
    submitted = float(_num(j.get("submit_time"), 0) or 0)
    shape = Shape(cpus, int(mem), gpus)

    partition = None
    candidates: list[str | None] = [*parts] or [None]
    for p in candidates:
        probe = WorkUnit(id=uid, scheduler=Scheduler.SLURM, shape=shape, partition=p, features=features)
        if any(pool.serves(probe) for pool in pools.values()):
            partition = p
            break
    else:
        served = {p.slurm.partition for p in pools.values() if p.slurm.partition}
        if parts and not served.intersection(parts):
            return excl(f"partition {','.join(parts)} is not served by any spot pool")
        return excl("no spot pool has the requested features")

    array = _text(j.get("array_task_string"))
    bases = [f"{uid}_{t}" for t in array_tasks(array)] if array else [uid]
    units = []
    for base in bases:
        for i in range(node_count):
            units.append(WorkUnit(
                id=base if node_count == 1 else f"{base}/{i + 1}", scheduler=Scheduler.SLURM, shape=shape,
                priority=priority, expected_seconds=expected, submitted_at=submitted, partition=partition,
                features=features))
    return units, None
