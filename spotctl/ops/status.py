"""``spotctl status``: pools (headroom, price), nodes, budget, last pass, the relay's delivery modes."""

from __future__ import annotations

from spotctl.core.capacity import headroom
from spotctl.core.errors import AuthError, SpotctlError

from .relay import last_modes
from .runtime import Runtime


def status(rt: Runtime, *, all_nodes: bool = False) -> dict:
    now = rt.now()
    degraded: dict[str, str] = {}
    hosts = []
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
    by_pool: dict[str, dict[str, int]] = {}
    for n in nodes:
        if n.live:
            states = by_pool.setdefault(n.pool, {})
            states[str(n.state)] = states.get(str(n.state), 0) + 1
    pools = []
    for name, pool in rt.region.pools.items():
        hr = headroom(pool, hosts, now)
        pools.append({
            "name": name, "kind": str(pool.kind), "class": str(pool.pool_class), "az": pool.az,
            "shape": pool.shape.to_dict(), "headroom": hr.free, "capacity": hr.capacity, "hosts": hr.hosts,
            "price": rc.prices.get(name) if rc else None, "currency": rc.currency if rc else None,
            "nodes": sum(by_pool.get(name, {}).values()), "nodes_by_state": by_pool.get(name, {}),
            "max_nodes": pool.max_nodes,
        })
    relay_modes = last_modes(rt.store)
    for dest, m in relay_modes.items():
        if m.get("degraded"):
            degraded[f"relay.{dest}.mode"] = m["degraded"]
    b = rt.bucket()
    last = rt.store.last_pass()
    counts = rt.store.counts()
    return {
        "region": rt.region.name,
        "backend": rt.backend,
        "now": now,
        "rate_card_version": rc.version if rc else None,
        "pools": pools,
        "nodes": [n.to_dict() for n in nodes],
        "budget": {"rate": b.rate, "burst": b.burst, "tokens_left": round(b.tokens, 3),
                   "tokens_used_total": rt.store.tokens_used_total()},
        "last_pass": None if last is None else {
            "started_at": last["started_at"], "finished_at": last["finished_at"], "status": last["status"],
            "actor": last["actor"], "tokens_used": last["summary"].get("tokens_used"),
        },
        "outbox": {"pending": counts["outbox_pending"], "total": counts["outbox"]},
        "relay": relay_modes,  # destination -> the delivery mode last seen: {mode, degraded, seen_at}
        "audit_records": counts["audit"],
        "degraded": degraded,
    }
