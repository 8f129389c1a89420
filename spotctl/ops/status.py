"""``spotctl status``: pools (headroom, price, our nodes by state, contract policy), why nodes are advised or
leaving, the contract feed's health, the token budget, the last pass and the relay's delivery modes.

It reads two sources now (the cloud's hosts and the contract feed's rate card, as it always has) and the
state database for the rest: what the last pass recorded of the contract (each pool's terms, the sources
it could not read) and the notices on record. It reads no notices itself. :func:`partial_sources` names
what makes the answer partial (exit 7, the rule ``plan`` and ``reconcile`` follow): a source not read now,
or the contract feed down at the last pass.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from spotctl.core.capacity import headroom
from spotctl.core.contract import recorded_failing
from spotctl.core.errors import AuthError, SpotctlError
from spotctl.core.models import HostCapacity, NodeState

from .relay import last_modes, outbox_queues
from .runtime import Runtime

#: The contract feed's sources a pass reads (ops.observe): down at the last pass, ``status`` is partial.
FEED_SOURCES = ("rate_card", "notices")
#: Node states that need a why: the node takes no new work, or is on its way out.
EXPLAINED = (NodeState.ADVISED, NodeState.DRAINING, NodeState.DELETING)


def identity_view(rt: Runtime) -> dict[str, Any]:
    """Who acts in this region: ``none`` (no ``[identity]``: the OS user), ``required`` or ``optional``,
    and the actor of this command."""
    table = rt.region.section("identity")
    mode = "none" if not table else "required" if table.get("required", True) else "optional"
    return {"mode": mode, "actor": rt.actor, "logged_in": rt.identity is not None}


def status(rt: Runtime, *, all_nodes: bool = False) -> dict:
    now = rt.now()
    policy = rt.region.policy
    degraded: dict[str, str] = {}
    hosts: list[HostCapacity] = []
    try:
        hosts = rt.cloud.hosts(rt.region.pools)
    except AuthError:
        raise
    except SpotctlError as e:
        degraded["cloud"] = e.message
    rc = None
    try:
        rc = rt.contract.rate_card()
    except SpotctlError as e:
        degraded["rate_card"] = e.message
    nodes = rt.store.nodes(live_only=not all_nodes)
    live = [n for n in nodes if n.live]
    by_pool: dict[str, dict[str, int]] = {}
    for n in live:
        states = by_pool.setdefault(n.pool, {})
        states[str(n.state)] = states.get(str(n.state), 0) + 1
    contract = {name: rt.store.get_value(f"contract:{name}") for name in rt.region.pools}
    pools: list[dict[str, Any]] = []
    for name, pool in rt.region.pools.items():
        hr = headroom(pool, hosts, now)
        pools.append({
            "name": name, "kind": str(pool.kind), "class": str(pool.pool_class), "az": pool.az,
            "shape": pool.shape.to_dict(),
            # new nodes of the pool's shape that fit now, host by host; capacity: spot nodes it holds in all
            "headroom": hr.free, "capacity": hr.capacity, "hosts": hr.hosts,
            "price": rc.prices.get(name) if rc else None, "currency": rc.currency if rc else None,
            # our live nodes in the pool, against its limit
            "nodes": sum(by_pool.get(name, {}).values()), "nodes_by_state": by_pool.get(name, {}),
            "max_nodes": pool.max_nodes,
            # as the last pass recorded it (None: no pass yet): "met"; "degraded:" and the terms that put the
            # pool under the no-notice policy; "unknown:" and the terms with no evidence yet (normal policy)
            "contract": contract[name], "contract_failing": recorded_failing(contract[name]),
            "contract_unknown": unknown_terms(contract[name]), "no_notice": no_notice(contract[name]),
        })
    reserved = {h.name: h.reserved_from for h in hosts if h.reserved_from is not None and h.reserved_from > now}
    notices = node_notices(rt, {n.id for n in live})
    node_rows = []
    for n in nodes:
        row = n.to_dict()
        row["notice"] = notices.get(n.id)  # its strongest notice on record (a hard one first, then the latest)
        row["host_reserved_from"] = reserved.get(n.host) if n.host else None
        node_rows.append(row)
    relay_modes = last_modes(rt.store)
    for dest, m in relay_modes.items():
        if m.get("degraded"):
            degraded[f"relay.{dest}.mode"] = m["degraded"]
    b = rt.bucket()
    last = rt.store.last_pass()
    counts = rt.store.counts()
    queues = outbox_queues(rt.store, now)
    last_degraded = dict(last["summary"].get("degraded") or {}) if last else {}
    data = {
        "region": rt.region.name,
        "backend": rt.backend,
        "now": now,
        "rate_card_version": rc.version if rc else None,
        "currency": rc.currency if rc else policy.currency,
        "pools": pools,
        "nodes": node_rows,
        # live nodes by state (every pool), and the advised or leaving ones grouped by why
        "node_states": dict(sorted(Counter(str(n.state) for n in live).items())),
        "advised_or_leaving": advised_groups(rt, [r for r in node_rows if r["state"] in EXPLAINED]),
        "contract_feed": {
            "rate_card": {"read_now": rc is not None, "version": rc.version if rc else None,
                          "valid_until": rc.valid_until if rc else None, "error": degraded.get("rate_card")},
            # what the last pass could not read of the feed (status reads no notices itself)
            "last_pass": None if last is None else {
                "at": last["finished_at"],
                "not_read": {s: last_degraded[s] for s in FEED_SOURCES if s in last_degraded}},
            "no_notice_pools": sorted(p["name"] for p in pools if p["no_notice"]),
        },
        "budget": {"rate": b.rate, "burst": b.burst, "tokens_left": round(b.tokens, 3),
                   "tokens_used_total": rt.store.tokens_used_total()},
        "last_pass": None if last is None else {
            "seq": last["seq"], "started_at": last["started_at"], "finished_at": last["finished_at"],
            "status": last["status"], "actor": last["actor"], "tokens_used": last["summary"].get("tokens_used"),
            "actions": last["summary"].get("actions"), "degraded": last_degraded,
        },
        # per kind: queued for its relay or not queued (no relay configured), pending rows, the oldest's age
        "outbox": {"pending": sum(q["pending"] for q in queues.values()), "total": counts["outbox"],
                   "kinds": queues},
        "relay": relay_modes,  # destination -> the delivery mode last seen: {mode, degraded, seen_at}
        "audit_records": counts["audit"],
        "identity": identity_view(rt),
        "degraded": degraded,
    }
    data["partial"] = partial_sources(data)
    return data


def no_notice(recorded: str | None) -> bool:
    """Whether a pool runs under the no-notice policy, by its recorded contract state (a term not met)."""
    return bool(recorded and recorded.startswith("degraded:"))


def unknown_terms(recorded: str | None) -> list[str]:
    """The terms a recorded contract state has no evidence for yet (``unknown:…``; they change no policy)."""
    if not recorded or not recorded.startswith("unknown:"):
        return []
    return [t for t in recorded.split(":", 1)[1].split(",") if t]


def partial_sources(data: dict[str, Any]) -> dict[str, str]:
    """What makes ``status`` partial (exit 7): a source it reads now that could not be read (the cloud, the
    rate card), and the contract feed down at the last pass (``last_pass.<source>``)."""
    out = {s: why for s, why in data["degraded"].items() if s in ("cloud", "rate_card")}
    lp = data["contract_feed"]["last_pass"]
    for s, why in (lp["not_read"] if lp else {}).items():
        out[f"last_pass.{s}"] = why
    return out


def node_notices(rt: Runtime, ids: set[str]) -> dict[str, dict[str, Any]]:
    """Each node's strongest notice on record: a hard notice first, then the latest seen."""
    best: dict[str, dict[str, Any]] = {}
    for row in rt.store.notices():
        node = row.get("node_id")
        if node not in ids:
            continue
        cur = best.get(node)
        rank = (row["kind"] == "hard", row["first_seen_at"])
        if cur is None or rank >= (cur["kind"] == "hard", cur["first_seen_at"]):
            best[node] = row
    return {n: {"id": r["id"], "kind": r["kind"], "issued_at": r["issued_at"], "deadline": r["deadline"],
                "reason": r["reason"], "first_seen_at": r["first_seen_at"]} for n, r in best.items()}


def advised_groups(rt: Runtime, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Advised, draining and deleting nodes grouped by pool, state, host and why: the notice they have (its
    kind, reason and deadline), else the reservation that takes their host, else the reason recorded when
    the node last changed state. ``drain_from``: when a node advised for a deadline is drained."""
    policy = rt.region.policy
    groups: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        nt = r["notice"]
        why: tuple = (("notice", nt["kind"], nt["reason"], nt["deadline"]) if nt else
                      ("reservation", r["host_reserved_from"]) if r["host_reserved_from"] else ("reason", r["reason"]))
        key = (r["pool"], r["state"], r["host"] or "", why)
        g = groups.get(key)
        if g is None:
            deadline = nt["deadline"] if nt and nt["kind"] != "hard" else None
            g = groups[key] = {
                "pool": r["pool"], "state": r["state"], "host": r["host"], "count": 0, "nodes": [],
                "notice": nt, "host_reserved_from": None if nt else r["host_reserved_from"],
                "reason": r["reason"],
                "drain_from": None if deadline is None or r["state"] != "advised" else
                deadline - policy.drain_seconds - policy.advisory_drain_margin_seconds,
            }
        g["count"] += 1
        g["nodes"].append(r["id"])
    return sorted(groups.values(), key=lambda g: (g["pool"], g["state"], g["host"] or "", -g["count"]))
