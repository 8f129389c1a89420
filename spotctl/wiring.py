"""The small factory the two entry points use to build a region's runtime.

Only ``spotctl.cli`` and ``reconciler`` import this module; it is the one
place that chooses between the simulator and real adapters, and it imports
them lazily so that ``--help`` never pays for an SDK.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from spotctl.core.config import Config, RegionConfig
from spotctl.core.errors import ConfigError
from spotctl.core.ports import Clock, ContractPort, SystemClock

_SAFE = re.compile(r"^[A-Za-z0-9_.-]+$")
log = logging.getLogger(__name__)


def quiet_libraries(level: int) -> None:
    """Libraries that log their own errors for what spotctl reports itself (kafka-python logs every failed
    connect attempt at ERROR while the relay says once that the broker is unreachable): their lines show
    from -v on (warnings) and -vv (everything), not at the default level."""
    import logging

    lib_level = logging.CRITICAL if level >= logging.WARNING else logging.WARNING if level == logging.INFO else level
    for name in ("kafka", "urllib3", "keystoneauth", "openstack", "stevedore"):
        logging.getLogger(name).setLevel(lib_level)


def state_path(config: Config, region: str) -> Path:
    if not _SAFE.match(region):
        raise ConfigError(f"region name {region!r} may only hold letters, digits, '.', '_' and '-'")
    return config.state_dir() / f"{region}.db"


def build_runtime(config: Config, region_name: str | None = None, *, clock: Clock | None = None,
                  actor: str | None = None, progress=None, identity=None):
    from spotctl.ops.relay import queued_kinds
    from spotctl.ops.runtime import Runtime, os_actor
    from spotctl.state.store import Store

    region = config.region(region_name)
    clock = clock or SystemClock()
    path = state_path(config, region.name)
    # creates the state directory the simulator also uses; queues only the outbox kinds the region relays
    store = Store.open(path, region.name, outbox_kinds=queued_kinds(region))
    try:
        if store.created:  # outside any transaction: a slow audit service delays nothing but this check
            warn_if_audit_has_history(region, path)
        cloud, contract, schedulers, concurrent, world = _ports(region, path, clock)
    except BaseException:
        store.close()
        raise
    rt = Runtime(region=region, store=store, cloud=cloud, contract=contract, schedulers=schedulers, clock=clock,
                 actor=actor or region.actor or os_actor(), concurrent_observe=concurrent, backend=region.backend,
                 simulation=world, identity=identity)
    if identity is not None:  # its events name who caused them (CloudEvents extension attributes)
        store.event_actor = identity.actor
    if progress:
        rt.progress = progress
    try:
        rt.outlets = outlets(region)  # the outbox relay's destinations (spotctl.ops.relay)
        if identity is not None:
            _use_identity_token((region, identity), contract, *rt.outlets.values())
    except BaseException:
        store.close()
        raise
    return rt


def _use_identity_token(of: tuple, *clients) -> None:
    """The clients whose table says ``identity_token = true`` (``[audit]``, ``[contract]``) authenticate with
    the identity's bearer token, renewed as it expires."""
    from spotctl.core.identity import Bearer, IdentitySettings
    from spotctl.ops.identity import renewer

    region, identity = of
    names = {"AuditClient": "audit", "ContractFeed": "contract"}
    wanted = [c for c in clients if (region.section(names.get(type(c).__name__, "")) or {}).get("identity_token")]
    if not wanted:
        return
    settings = IdentitySettings.of(region.section("identity"))
    assert settings is not None
    bearer = Bearer(identity, renewer(identity_port(region), settings, region.name))
    for c in wanted:
        c.use_bearer(bearer)


def audit_refusal(config: Config, region: RegionConfig, refusal) -> None:
    """A refused command (``core.identity.Forbidden``) as an audit record of the region, before the refusal
    is reported: nothing else is written."""
    import time

    from spotctl.ops.identity import record_refusal
    from spotctl.ops.relay import queued_kinds
    from spotctl.state.store import Store

    store = Store.open(state_path(config, region.name), region.name, outbox_kinds=queued_kinds(region))
    try:
        record_refusal(store, refusal, time.time())
    finally:
        store.close()


def identity_port(region: RegionConfig):
    """The region's Keycloak realm (``[regions.R.identity]``), or None when it has none."""
    from spotctl.core.identity import IdentitySettings

    settings = IdentitySettings.of(region.section("identity"))
    if settings is None:
        return None
    from spotctl.adapters.keycloak import KeycloakIdentity, cache_dir

    return KeycloakIdentity.from_settings(settings, cache_dir())


def outlets(region: RegionConfig) -> dict:
    """The relay destinations the region configures: ``[kafka]`` (lifecycle events), ``[audit]`` (audit log service).

    A region without one does not queue that kind (``spotctl.ops.relay.queued_kinds``); building one imports
    no SDK yet (they connect lazily).
    """
    return {name: _adapter(region, name) for name in ("kafka", "audit") if region.section(name) is not None}


def warn_if_audit_has_history(region: RegionConfig, path: Path, *, timeout_seconds: float = 2.0) -> dict | None:
    """A new state database was just created for ``region``: if its audit service already holds records
    for the region, the region's history is somewhere else (a deleted, moved or lost state database) —
    say so on stderr, once, with the count and the newest record. Says nothing when the region has no
    ``[audit]`` or the service cannot be asked (unreachable, refused, misconfigured): it never blocks."""
    if region.section("audit") is None:
        return None
    from spotctl.core.errors import SpotctlError
    from spotctl.ops.audit import service_history

    try:
        client = _adapter(region, "audit")
    except SpotctlError:
        return None  # a bad [audit] table is reported where the relay uses it
    client.timeout_seconds = min(client.timeout_seconds, timeout_seconds)
    try:
        found = service_history(client, region.name, budget_seconds=2 * timeout_seconds)
    except SpotctlError as e:
        log.debug("audit service not asked about earlier records: %s", e.message)
        return None
    except (ValueError, TypeError, AttributeError, KeyError) as e:  # a malformed answer: not worth a failure here
        log.debug("audit service answer about earlier records unreadable: %s", e)
        return None
    finally:
        client.close()
    if found is None:
        return None
    head = found["head"]
    newest = " ".join(str(head[k])[:64] for k in ("id", "action", "target") if head.get(k))
    log.warning("new state database %s for region %r, but the audit service %s already holds %s%d records for "
                "this region%s: the region's history is not in this file; if its state database was deleted, "
                "moved or lost, stop and restore it from a backup (`spotctl audit verify` then checks both)",
                path, region.name, client.url, "" if found["complete"] else "at least ", found["count"],
                f" (the newest: {newest})" if newest else "")
    return found


def _ports(region: RegionConfig, path: Path, clock: Clock):
    """Cloud, contract feed and schedulers for a region.

    The simulator backs whatever the region does not configure for real: a
    region with ``backend = "sim"`` and a ``[regions.R.slurm]`` table gets
    the simulated cloud with the real Slurm adapter, and so on, part by part.
    """
    world = None
    concurrent = True
    contract: ContractPort | None
    if region.backend == "sim":
        from spotctl.sim.world import SimWorld

        # read-only until the region lock is taken (Runtime.lock): every change to the world happens under it
        world = SimWorld.shared(path.with_suffix(".sim.db"), region, clock.now())
        cloud, contract = world.cloud, world.contract
        concurrent = False
    else:
        cloud = _adapter(region, "openstack", clock)
        contract = None
    if region.section("contract") is not None:
        contract = _adapter(region, "contract")
    if contract is None:
        from spotctl.adapters.static_contract import StaticContract

        contract = StaticContract.from_config(region)
    schedulers = []
    for kind in ("kubernetes", "slurm"):
        if region.section(kind) is not None:
            schedulers.append(_adapter(region, kind, clock))
            concurrent = True
        elif world is not None:
            schedulers.extend(s for s in world.schedulers if s.name == kind)
    return cloud, contract, schedulers, concurrent, world


# adapter section -> (module, class); each class has ``from_config(region: RegionConfig)``, and those that read
# the time ``from_config(region, clock=...)`` (openstack, slurm, kubernetes): the runtime's one Clock.
ADAPTERS = {
    "openstack": ("spotctl.adapters.openstack", "OpenStackCloud"),
    "slurm": ("spotctl.adapters.slurm", "SlurmScheduler"),
    "kubernetes": ("spotctl.adapters.kubernetes", "KubernetesScheduler"),
    "contract": ("spotctl.adapters.contract_http", "ContractFeed"),
    "kafka": ("spotctl.adapters.kafka", "KafkaRelay"),
    "audit": ("spotctl.adapters.audit_http", "AuditClient"),
}


def _adapter(region: RegionConfig, name: str, clock: Clock | None = None):
    import importlib

    module, cls = ADAPTERS[name]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:
            raise
        raise ConfigError(
            f"region {region.name!r} configures [{name}], which this build of spotctl does not provide",
            hint="remove the table to use the embedded simulator for that part") from None
    factory = getattr(mod, cls).from_config
    return factory(region) if clock is None else factory(region, clock=clock)


def sim_world_factory(region: RegionConfig, start: float, seed: int):
    from spotctl.sim.world import SimWorld

    world = SimWorld.new(region, start, seed)
    return world, world.cloud, world.contract, list(world.schedulers)


def doctor_probes(config: Config, region_name: str | None = None, clock: Clock | None = None):
    """``spotctl doctor``: the region and the probes of everything it configures (``spotctl.adapters.doctor``),
    the simulated parts through their ports too; built without the region lock and without logging in (each
    probe makes its own call). A table whose adapter cannot be built (a bad config) is a failing probe."""
    import os

    from spotctl.adapters import doctor as d
    from spotctl.core.doctor import SYSTEMD_UNITS, Kind, Observed, Probe, systemd_expectation
    from spotctl.core.errors import SpotctlError
    from spotctl.state.health import state_db_facts

    region = config.region(region_name)
    clock = clock or SystemClock()
    path = state_path(config, region.name)
    ctx = {"region": region.name, "path": str(path)}
    probes: list = [Probe("state.db", str(path), lambda: Observed("read", state_db_facts(path)), kind=Kind.STATE_DB,
                          context=ctx)]

    def build(check: str, target: str, make, *args):
        try:
            return make(*args)
        except SpotctlError as e:
            return [d.failing(check, target, e, ctx)]

    def table(name: str, check: str, make) -> None:
        if region.section(name) is None:
            return
        try:
            adapter = _adapter(region, name, clock if name in ("openstack", "slurm", "kubernetes") else None)
        except SpotctlError as e:
            probes.append(d.failing(check, f"[regions.{region.name}.{name}]", e, ctx))
            return
        probes.extend(build(check, name, make, adapter))

    if region.backend == "sim":
        probes.extend(_sim_probes(region, path, clock))
    else:
        from spotctl.adapters.openstack import OpenStackCloud
        from spotctl.adapters.openstack.options import _options

        cloud_name = region.cloud or os.environ.get("OS_CLOUD") or ""
        try:
            if not cloud_name:
                raise ConfigError(f"region {region.name!r} uses backend 'openstack' but names no cloud",
                                  hint=f"set regions.{region.name}.cloud to a clouds.yaml entry, or export OS_CLOUD")
            cloud = OpenStackCloud(region, cloud_name, _options(region), connect=False, clock=clock)
        except SpotctlError as e:
            probes.append(d.failing("openstack.auth", f"clouds.yaml entry {cloud_name or '?'}", e, ctx))
        else:
            probes.extend(build("openstack.auth", cloud_name, d.openstack_probes, cloud))
    table("slurm", "slurm.version", lambda a: d.slurm_probes(a, region.name))
    table("kubernetes", "kubernetes.auth", lambda a: d.kubernetes_probes(a, region.name))
    table("kafka", "kafka.metadata", lambda a: d.kafka_probes(a, region.name))
    table("audit", "audit.service", lambda a: d.audit_probes(a, region.name))
    if region.section("contract") is not None:
        table("contract", "contract.rate_card", lambda a: d.contract_probes(a, region.name))
    elif region.backend != "sim":
        from spotctl.adapters.static_contract import StaticContract

        probes.extend(d.contract_probes(StaticContract.from_config(region), region.name, "contract.static"))
    identity = region.section("identity")
    if identity:
        probes.extend(_identity_probes(region, ctx))
    units = [u.format(region=region.name) for u, _ in SYSTEMD_UNITS]
    roles = {u.format(region=region.name): systemd_expectation(role, region.section("contract") is not None)
             for u, role in SYSTEMD_UNITS}
    probes.append(Probe("systemd.units", f"{len(units)} units of region {region.name}",
                        lambda: Observed("read", {**d.systemd_facts(units), "roles": roles}), kind=Kind.SYSTEMD,
                        context=ctx))
    return region, probes


def _identity_probes(region: RegionConfig, ctx: dict) -> list:
    from spotctl.adapters import doctor as d
    from spotctl.adapters.keycloak import KeycloakIdentity, cache_dir
    from spotctl.core.doctor import Kind, Observed, Probe
    from spotctl.core.errors import SpotctlError
    from spotctl.core.identity import IdentitySettings
    from spotctl.ops.identity import service_secret
    from spotctl.state.health import private_dir_facts

    cache = cache_dir()
    out = [Probe("identity.token_cache", str(cache), lambda: Observed("read", private_dir_facts(cache)),
                 kind=Kind.PRIVATE_DIR, context=ctx)]
    try:
        settings = IdentitySettings.of(region.section("identity"))
        assert settings is not None
        ident = KeycloakIdentity.from_settings(settings, cache)
    except SpotctlError as e:
        return out + [d.failing("oidc.discovery", f"[regions.{region.name}.identity]", e, ctx)]
    try:
        secret = service_secret(settings)
    except SpotctlError:
        secret = None  # no client secret configured here: no service token to ask for
    return out + d.oidc_probes(ident, region.name, secret)


def _sim_probes(region: RegionConfig, path: Path, clock: Clock) -> list:
    """The demo region's simulated parts, read through their ports as a pass reads them (a read-only
    snapshot of the simulated world: nothing saved)."""
    from spotctl.core.doctor import Observed, Probe

    ctx = {"region": region.name}
    box: dict = {}

    def world():
        if "world" not in box:
            from spotctl.sim.world import SimWorld

            box["world"] = SimWorld.shared(path.with_suffix(".sim.db"), region, clock.now())
        return box["world"]

    def cloud() -> Observed:
        w = world()
        hosts = w.cloud.hosts(region.pools)
        q = w.cloud.quota()
        pools = {h.pool for h in hosts}
        return Observed(f"hosts(): {len(hosts)} hosts in {len(pools)} of {len(region.pools)} pools; quota(): "
                        f"{'unlimited' if q.instances is None else q.instances} instances left")

    def contract() -> Observed:
        card = world().contract.rate_card()
        notices = world().contract.notices()
        return Observed(f"rate_card(): {card.version}, {len(card.prices)} pool price(s) in {card.currency}; "
                        f"notices(): {len(notices)} in force")

    def scheduler(kind: str):
        def run() -> Observed:
            s = next((s for s in world().schedulers if s.name == kind), None)
            if s is None:
                raise ConfigError(f"the simulated world of region {region.name!r} has no {kind} scheduler")
            work, skipped = s.pending(region.pools)
            return Observed(f"pending(): {len(work)} work unit(s) waiting, {len(skipped)} skipped; "
                            f"usage(): {len(s.usage())} node(s)")
        return run

    probes = [Probe("sim.cloud", "simulated cloud (Nova, Ironic, Placement, Blazar)", cloud, context=ctx)]
    if region.section("contract") is None:
        probes.append(Probe("sim.contract", "simulated provider contract feed", contract, context=ctx))
    for kind in ("kubernetes", "slurm"):
        if region.section(kind) is None:
            probes.append(Probe(f"sim.{kind}", f"simulated {kind.capitalize()}", scheduler(kind), context=ctx))
    return probes
