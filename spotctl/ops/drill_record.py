"""A reclaim drill's record, read back: the stored drill, the region's list of drills, where one stands,
the replacements launched for its victims, and the facts its score is computed from (``spotctl
exercise-reclaim list|status|report``). :mod:`spotctl.ops.drill` runs drills and writes the record."""

from __future__ import annotations

import json

from spotctl.core.contract import SeenNotice
from spotctl.core.drill import DrainRound, DrillFacts, ReplacementLaunch, SeenTransition, VictimFacts, replaced_nodes
from spotctl.core.drill import score as score_drill
from spotctl.core.errors import NotFoundError

from .contract import seen_notice
from .runtime import Runtime

INDEX_KEY = "drill:index"


def key(drill_id: str) -> str:
    """The store key of a drill's record."""
    return f"drill:{drill_id}"


def load(rt: Runtime, drill_id: str) -> dict:
    raw = rt.store.get_value(key(drill_id))
    if raw is None:
        raise NotFoundError(f"no drill {drill_id!r} in region {rt.region.name!r}",
                            hint="`spotctl exercise-reclaim list` shows the region's drills")
    return json.loads(raw)


def drills(rt: Runtime) -> list[dict]:
    out = []
    for d in json.loads(rt.store.get_value(INDEX_KEY) or "[]")[::-1]:
        x = load(rt, d)
        out.append({k: x[k] for k in ("id", "pool", "status", "started_at", "finished_at") if k in x}
                   | {"victims": len(x["victims"])})
    return out


def status(rt: Runtime, drill_id: str) -> dict:
    """Where a drill stands: waves issued, each victim's state, and the replacements launched for them."""
    drill = load(rt, drill_id)
    states = {}
    for v in drill["victims"]:
        node = rt.store.find_node(v["node"])
        states[v["node"]] = str(node.state) if node else "unknown"
    return {"id": drill["id"], "pool": drill["pool"], "status": drill["status"], "waves": len(drill["waves"]),
            "issued": drill["issued"], "victims": states, "abort_reason": drill["abort_reason"],
            "started_at": drill["started_at"], "now": rt.now(), "waiting_for": drill.get("waiting_for"),
            "replacements": [dict(r.to_dict(None), replaces=victim) for victim, rs in replacements(rt, drill).items()
                             for r in rs]}


def replacements(rt: Runtime, drill: dict) -> dict[str, list[ReplacementLaunch]]:
    """Victim -> the nodes the planner launched for its work since the drill started (the launches whose
    reason names it, from their ``node.launch`` audit records), each with its state and first activation."""
    out: dict[str, list[ReplacementLaunch]] = {}
    names = {v["node"] for v in drill["victims"]}
    for a in rt.store.audit_query(since=drill["started_at"] - 1, action="node.launch"):
        if a["result"] != "intended":
            continue
        inputs = a.get("inputs") or {}
        for victim in replaced_nodes(str(inputs.get("reason") or "")):
            if victim not in names:
                continue
            node = rt.store.find_node(a["target"])
            pool = node.pool if node is not None else str(inputs.get("pool") or "")
            try:
                boot = float(rt.region.pool(pool).boot_seconds)
            except NotFoundError:  # a pool since removed from the configuration
                boot = 0.0
            active = [t["at"] for t in rt.store.transitions(a["target"]) if t["to_state"] == "active"]
            out.setdefault(victim, []).append(ReplacementLaunch(
                node=a["target"], pool=pool, launched_at=a["at"], active_at=min(active) if active else None,
                state=str(node.state) if node is not None else "unknown", boot_seconds=boot))
    return out


def report(rt: Runtime, drill_id: str) -> dict:
    """Score a drill (:func:`spotctl.core.drill.score`) from what was recorded: notices, transitions,
    accepted drain rounds (audit records), activations, replacement launches."""
    drill = load(rt, drill_id)
    return {"id": drill["id"], "region": drill["region"], "pool": drill["pool"], "status": drill["status"],
            "abort_reason": drill["abort_reason"], "started_at": drill["started_at"],
            "finished_at": drill["finished_at"], "notice_seconds": drill["notice_seconds"],
            "advisory_lead_seconds": drill.get("advisory_lead_seconds", 0), "waves": len(drill["waves"]),
            **score_drill(facts(rt, drill))}


def facts(rt: Runtime, drill: dict) -> DrillFacts:
    """What was recorded of a drill's victims, as the facts its score is computed from."""
    notices = {n["id"]: seen_notice(n) for n in rt.store.notices_since(drill["started_at"] - 1)}
    hard_by_instance: dict[str | None, SeenNotice] = {}
    for n in notices.values():
        if n.kind == "hard":
            hard_by_instance.setdefault(n.instance_id, n)
    drains: dict[str, DrainRound] = {}  # node -> its first drain round every bound scheduler accepted
    for a in rt.store.audit_query(since=drill["started_at"] - 1, action="node.drain"):
        if a["result"] == "ok" and a["target"] not in drains:
            inputs = a.get("inputs") or {}
            drains[a["target"]] = DrainRound(at=a["at"], running=(inputs["running"] or 0) if "running" in inputs
                                             else None)
    replaced = replacements(rt, drill)
    victims = []
    for v in drill["victims"]:
        if "reclaim_error" in v or "reclaimed_at" not in v:
            victims.append(VictimFacts(node=v["node"], instance_id=v.get("instance_id"),
                                       reclaim_error=v.get("reclaim_error")))
            continue
        victims.append(VictimFacts(
            node=v["node"], instance_id=v.get("instance_id"), reclaimed_at=v["reclaimed_at"],
            hard_notice=hard_by_instance.get(v.get("instance_id")), first_notice=notices.get(v.get("notice_id") or ""),
            drain=drains.get(v["node"]),
            transitions=tuple(SeenTransition(t["to_state"], t["at"], t["reason"] or "")
                              for t in rt.store.transitions(v["node"])),
            activations=tuple(rt.store.activations_since(v["reclaimed_at"])),
            replacements=tuple(replaced.get(v["node"], ()))))
    return DrillFacts(notice_seconds=drill["notice_seconds"],
                      advisory_lead_seconds=drill.get("advisory_lead_seconds", 0), victims=tuple(victims))
