"""Ironic, directly (pools with ``via = "ironic"``): bare-metal nodes as hosts, claims (allocations)
as instances, deploy and undeploy.

A launch claims a node of the pool's resource class (an allocation carrying our tags in ``extra``)
and returns at once; a later pass deploys it (``CloudPort.advance``, step "deploy"). Instance ids
are ``ironic:<node uuid>`` once the claim has its node, ``ironic-alloc:<allocation uuid>`` before.
"""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from spotctl.core.errors import CapacityError, NotFoundError, TemporaryError
from spotctl.core.models import HostCapacity, Instance, PoolSpec, Shape, frozen

from .api import ALLOC_PREFIX, IRONIC_PREFIX, TAG_ACTION, TAG_POOL, TAG_REGION, Api, _ts

if TYPE_CHECKING:
    from openstack.baremetal.v1.allocation import Allocation
    from openstack.baremetal.v1.node import Node

log = logging.getLogger(__name__)


@frozen
class _IronicInstance(Instance):
    """An Ironic instance with its claim's id, which stays when the id moves to the node's."""

    claim: str = ""


def _hostname(name: str) -> str:
    """A node name as a host name (lower case, [a-z0-9-], 63 characters at most)."""
    return re.sub(r"[^a-z0-9-]", "-", name.lower())[:63]


def _free(n: Node) -> bool:
    """What Ironic's allocation API would pick: available, powered (any state), not in maintenance, unclaimed."""
    return (n.provision_state == "available" and not n.is_maintenance and not n.instance_id
            and not n.allocation_id and n.power_state is not None)


class Ironic:
    """Ironic calls through the shared connection."""

    def __init__(self, api: Api):
        self.api = api

    def pools(self) -> list[str]:
        """The region's pools deployed through Ironic directly."""
        return [n for n in self.api.region.pools if self.api.options.pool(n).via == "ironic"]

    # -- reads -----------------------------------------------------------------------

    def allocations(self) -> list[Allocation]:
        """Our allocations (claims) in the region."""
        allocs = self.api.call("ironic list allocations",
                               lambda: list(self.api.conn.baremetal.allocations(details=True)))
        return [a for a in allocs if (a.extra or {}).get(TAG_REGION) == self.api.region.name]

    def nodes(self, resource_class: str | None = None) -> list[Node]:
        """Every node (of one resource class)."""
        q: dict[str, Any] = {"details": True}
        if resource_class:
            q["resource_class"] = resource_class
        return self.api.call("ironic list nodes", lambda: list(self.api.conn.baremetal.nodes(**q)))

    def hosts(self, pool: PoolSpec) -> list[HostCapacity]:
        """The pool's nodes as hosts: a free or our node has room for one node of the pool's shape."""
        mine = {a.node_id: a for a in self.allocations() if a.node_id}
        out = []
        for n in self.nodes(pool.resource_class):
            a = mine.get(n.id)
            is_ours = a is not None and (a.extra or {}).get(TAG_POOL) == pool.name
            used_other = Shape() if (_free(n) or is_ours) else pool.shape
            out.append(HostCapacity(n.name or n.id, pool.name, pool.shape, used_other, 1 if is_ours else 0))
        return out

    def instances(self) -> list[_IronicInstance]:
        """Our claims as instances."""
        allocs = self.allocations()
        if not allocs:
            return []
        nodes = {n.id: n for n in self.nodes()}
        return [self.instance(a, nodes.get(a.node_id) if a.node_id else None) for a in allocs]

    def instance(self, a: Allocation, n: Node | None) -> _IronicInstance:
        """One of our allocations as an instance: a claim still allocating (``ironic-alloc:``), a claim
        that has its node and waits for the deploy (step "deploy"), a deploying or active node."""
        ex = a.extra or {}
        fault, no_room, step = "", False, ""
        if a.state == "error":
            status, fault, no_room = "ERROR", a.last_error or "no node available", True
        elif not a.node_id:
            status = "BUILD"  # Ironic has not picked a node yet
        elif n is None:
            status, fault = "ERROR", f"node {a.node_id} of allocation {a.id} no longer exists"
        elif n.provision_state == "active":
            status = "ACTIVE"
        elif n.provision_state in ("deploy failed", "error"):
            status, fault = "ERROR", n.last_error or n.provision_state
        elif n.provision_state == "available" and not n.target_provision_state:
            status, step = "BUILD", "deploy"  # claimed, not yet deployed: advance() deploys it
        else:
            status = "BUILD"
        iid = IRONIC_PREFIX + a.node_id if a.node_id else ALLOC_PREFIX + a.id
        return _IronicInstance(id=iid, name=a.name or a.id, pool=ex.get(TAG_POOL, ""), status=status,
                               action_id=ex.get(TAG_ACTION, ""), host=n.name if n is not None else None,
                               created_at=_ts(a.created_at) or self.api.clock.now(), fault=fault, no_room=no_room,
                               step=step, claim=ALLOC_PREFIX + a.id)

    def node_state(self, node_id: str) -> dict[str, Any]:
        """A node's provision/power state and target (deadline arithmetic, operators)."""
        n = self.api.call("ironic get node", lambda: self.api.conn.baremetal.get_node(node_id))
        return {"node": n.id, "name": n.name, "provision_state": n.provision_state,
                "target_provision_state": n.target_provision_state, "power_state": n.power_state,
                "maintenance": n.is_maintenance, "last_error": n.last_error}

    def allocation(self, alloc_id: str) -> Allocation | None:
        """One GET of an allocation; None when Ironic no longer has it."""
        try:
            return self.api.call("ironic get allocation", lambda: self.api.conn.baremetal.get_allocation(alloc_id))
        except NotFoundError:
            return None

    # -- claim, deploy -----------------------------------------------------------------

    def create(self, pool: PoolSpec, name: str, action_id: str) -> Instance:
        """Claim a node of the pool's resource class (an Ironic allocation) and return at once: Ironic
        picks the node in the background, and a later pass deploys it (:meth:`deploy`, step "deploy").
        CapacityError at once when no node of the class is free (counting claims still allocating)."""
        bm = self.api.conn.baremetal
        # claims first, nodes second, so a claim is never counted zero times; one that got its node in
        # between is counted through its node only (not twice: that refused a node that was free)
        waiting = [a for a in self.api.call("ironic list allocations",
                                            lambda: list(bm.allocations(state="allocating")))
                   if a.resource_class == pool.resource_class]
        nodes = self.nodes(pool.resource_class)
        placed = {n.allocation_id for n in nodes if n.allocation_id}
        waiting = [a for a in waiting if a.id not in placed]
        free = [n for n in nodes if _free(n)]
        if len(free) <= len(waiting):
            raise CapacityError(f"pool {pool.name}: no available {pool.resource_class} node "
                                f"({len(free)} free, {len(waiting)} claim(s) allocating)", details={"pool": pool.name})
        extra = {TAG_REGION: self.api.region.name, TAG_POOL: pool.name, TAG_ACTION: action_id}
        po = self.api.options.pool(pool.name)
        alloc = self.api.call(f"ironic allocate a {pool.resource_class} node", lambda: bm.create_allocation(
            resource_class=pool.resource_class, name=_hostname(name), extra=extra, traits=list(po.traits)))
        log.info("claimed an Ironic %s node for pool %s, action %s (allocation %s)", pool.resource_class,
                 pool.name, action_id, alloc.id)
        return self.instance(alloc, None) if not alloc.node_id else Instance(
            id=IRONIC_PREFIX + alloc.node_id, name=name, pool=pool.name, status="BUILD", action_id=action_id,
            created_at=self.api.clock.now(), step="deploy")

    def deploy(self, instance: Instance, pool: PoolSpec, image: str) -> Instance:
        """Deploy a claimed node (step "deploy"): the image, the config drive, provision "active"; one
        round of calls, no wait."""
        bm = self.api.conn.baremetal
        node_id = instance.id[len(IRONIC_PREFIX):]
        info = {"image_source": image, "display_name": instance.name}
        self.api.call("ironic set instance_info", lambda: bm.patch_node(node_id, [
            {"op": "add", "path": "/instance_info", "value": info}]))
        user_data = self.api.options.user_data_for(name=instance.name, pool=pool.name, region=self.api.region.name,
                                                   action_id=instance.action_id)
        ud: dict[str, object] | None = {"user_data": user_data} if user_data is not None else None
        self.api.call("ironic deploy node", lambda: bm.set_node_provision_state(node_id, "active", config_drive=ud))
        log.info("deploying Ironic node %s (%s) for pool %s, action %s", node_id, instance.name, pool.name,
                 instance.action_id)
        return replace(instance, step="")

    # -- give back ---------------------------------------------------------------------

    def unclaim(self, alloc_id: str) -> None:
        """Give up a claim: undeploy its node if it has one by now, else delete the allocation."""
        bm = self.api.conn.baremetal
        a = self.allocation(alloc_id)
        if a is None:
            return
        if a.node_id:
            return self.delete(a.node_id)
        self.api.call("ironic delete allocation", lambda: bm.delete_allocation(a, ignore_missing=True))

    def delete(self, node_id: str) -> None:
        """Undeploy our node (or drop a claim it kept); nothing when the node is gone."""
        bm = self.api.conn.baremetal
        n = self.api.call("ironic get node", lambda: bm.find_node(node_id, ignore_missing=True))
        if n is None:
            return  # the node is gone: nothing to delete
        if n.provision_state in ("active", "deploy failed", "error", "wait call-back"):
            self.api.call("ironic undeploy node", lambda: bm.set_node_provision_state(node_id, "deleted"))
            log.info("undeploying Ironic node %s", node_id)
        elif n.provision_state in ("deploying",):
            raise TemporaryError(f"Ironic node {node_id} is still deploying; undeploy next pass")
        elif n.provision_state == "available" and n.allocation_id:
            # never deployed, or undeployed with the claim kept: drop the claim if it is ours
            alloc = self.allocation(n.allocation_id)
            if alloc is not None and (alloc.extra or {}).get(TAG_REGION) == self.api.region.name:
                self.api.call("ironic delete allocation", lambda: bm.delete_allocation(alloc, ignore_missing=True))

    def claim_released(self, alloc_id: str) -> bool:
        """The claim is gone, or its node is back (:meth:`released`)."""
        a = self.allocation(alloc_id)
        if a is None:
            return True
        return bool(a.node_id) and self.released(a.node_id)

    def released(self, node_id: str) -> bool:
        """The node is back: available, no instance, no claim (a read; delete drops a kept claim)."""
        n = self.api.call("ironic get node", lambda: self.api.conn.baremetal.find_node(node_id, ignore_missing=True))
        if n is None:
            return True
        return n.provision_state == "available" and not n.instance_id and not n.allocation_id
