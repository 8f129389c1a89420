"""Running the contract API: ``spotctl sim serve`` (and its defaults from the region's ``[contract]`` table).

:func:`serve_region` builds the region's simulated world, launches a few spot
instances in it (:func:`populate`), binds the server of :mod:`.handler` and
serves until Ctrl-C or SIGTERM, then answers what it served. A non-loopback host
is refused unless given explicitly. (The client side, ``spotctl sim status``, is
:func:`spotctl.adapters.contract_http.world_status`.)
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from types import FrameType
from typing import NoReturn
from urllib.parse import urlsplit

from spotctl.core.config import RegionConfig
from spotctl.core.ports import Clock, SystemClock
from spotctl.core.secrets import SecretFile

from .handler import DEFAULT_PORT, make_server
from .state import MAX_WAIT
from .world import World

# (region, start time, seed) -> (the world, then whatever else the factory builds with it)
WorldFactory = Callable[[RegionConfig, float, int], tuple[World, *tuple[object, ...]]]

class _Terminated(Exception):
    """SIGTERM: stop serving and exit 0."""


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def region_endpoint(region: RegionConfig) -> tuple[str | None, int | None, str | SecretFile | None]:
    """Host, port and token of the region's ``[contract]`` table (what ``sim serve`` defaults to); a
    ``token_file`` is returned as a :class:`SecretFile`, which the server re-reads when it is rotated."""
    sec = region.section("contract") or {}
    host: str | None = None
    port: int | None = None
    if sec.get("url"):
        u = urlsplit(sec["url"])
        host = u.hostname
        try:
            port = u.port
        except ValueError:
            port = None
    token: str | SecretFile | None = sec.get("token") or None
    if not token and sec.get("token_file"):
        token = SecretFile(sec["token_file"], setting=f"regions.{region.name}.contract.token_file")
        token.value()  # a missing or empty file is a ConfigError before the server starts
    return host, port, token


def populate(world: World, count: int) -> list[str]:
    """Launch ``count`` spot instances in the world, round-robin over its pools (skipping full pools)."""
    from spotctl.core.errors import CapacityError

    names = sorted(world.pools)
    made: list[str] = []
    full: set[str] = set()
    i = 0
    while len(made) < count and len(full) < len(names):
        name = names[i % len(names)]
        i += 1
        if name in full:
            continue
        try:
            inst = world.cloud.create_instance(world.pools[name], f"sim-spot-{len(made) + 1:03d}",
                                               f"sim-serve-{len(made) + 1:03d}")
        except CapacityError:
            full.add(name)
            continue
        made.append(inst.id)
    return made


def serve_region(region: RegionConfig, world_factory: WorldFactory, *, host: str | None = None,
                 port: int | None = None, seed: int | None = None, token: str | None = None, instances: int = 6,
                 max_wait: float = MAX_WAIT, announce: Callable[[str], None] = print,
                 warn: Callable[[str], None] = print, clock: Clock | None = None) -> dict[str, object]:
    """Serve the contract API of ``region``'s simulator until Ctrl-C (KeyboardInterrupt) or SIGTERM.

    Host, port and token default to the region's ``[contract]`` table (so ``spotctl plan``
    on the same config reaches this server), else ``127.0.0.1:8787`` without auth. A
    non-loopback host is refused unless given explicitly (``host``), and then warned about.
    """
    import signal

    from spotctl.core.errors import RefusedError, UnavailableError

    cfg_host, cfg_port, cfg_token = region_endpoint(region)
    if host is None:
        host = cfg_host or "127.0.0.1"
        if not is_loopback(host):
            raise RefusedError(f"refusing to serve the simulator on non-loopback host {host} "
                               f"(from the region's [contract] url)",
                               hint=f"pass --host {host} to expose it anyway")
    elif not is_loopback(host):
        warn(f"serving the simulated contract API on non-loopback host {host}: anyone who can reach it "
             "can read the feed" + ("" if (token or cfg_token) else " and reclaim instances (no --token)"))
    port = cfg_port if port is None else port
    port = DEFAULT_PORT if port is None else port
    secret = token if token is not None else cfg_token
    clock = clock or SystemClock()
    start = clock.now()
    # Start the world a minute back and advance it, so that events due at its start (reservations
    # taking hosts) have run before the instances are placed.
    world, *_ = world_factory(region, start - 60.0, region.seed if seed is None else seed)
    world.advance(start)
    made = populate(world, instances)
    try:
        server = make_server(world, host, port, token=secret or None, max_wait=max_wait, clock=clock)
    except OSError as e:
        raise UnavailableError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None

    def on_term(signum: int, frame: FrameType | None) -> NoReturn:
        raise _Terminated()

    old = signal.signal(signal.SIGTERM, on_term) if threading.current_thread() is threading.main_thread() else None
    # how it stopped, as it happened: SIGTERM (a service manager), Ctrl-C / SIGINT (an operator), or the
    # server shutting itself down
    stopped = "shut down"
    try:
        # announced inside the try: a Ctrl-C as soon as the URL is out is a clean stop too
        announce(f"serving region {region.name!r} (seed {world.seed}, {len(made)} instances) at {server.url}"
                 + (" (bearer token required)" if secret else "") + "; Ctrl-C to stop")
        server.serve()
    except _Terminated:
        stopped = "terminated"
    except KeyboardInterrupt:
        stopped = "interrupted"
    finally:
        server.server_close()
        if old is not None:
            signal.signal(signal.SIGTERM, old)
    return {"url": server.url, "region": region.name, "seed": world.seed, "stopped": stopped,
            "served_seconds": round(clock.now() - start, 3), "notices_logged": len(server.api.log),
            "reclaims": len(server.api.reclaims)}
