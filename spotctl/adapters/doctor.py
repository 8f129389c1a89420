"""The probes of ``spotctl doctor``, one cheap real call each, through the adapters' own clients.

Each function takes an adapter built from the region's config and returns the
:class:`~spotctl.core.doctor.Probe` list of what that backend offers; a probe's call is bounded by the
adapter's timeout and never retried, and raises the adapter's errors (already translated at its boundary).
What the results mean, and the hints, are decided in :mod:`spotctl.core.doctor`. No probe changes anything
(no token is cached, no JWKS written, nothing created); Kubernetes RBAC is asked with
SelfSubjectAccessReview (``authorization.k8s.io/v1``), which creates no object.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from spotctl.core.doctor import K8S_ACCESS, Kind, Observed, Probe
from spotctl.core.errors import AuthError, ConfigError, SpotctlError, TemporaryError, UnavailableError
from spotctl.core.models import PoolKind

# --- OpenStack -------------------------------------------------------------------------------------------


def openstack_probes(cloud: Any) -> list[Probe]:
    """Keystone (a token for the project), then each API the region's pools need: Nova (VM pools and bare
    metal through Nova), Placement (the hosts of those pools), Blazar (unless ``blazar = false``), Ironic
    (pools deployed through Ironic directly, and bare-metal pools)."""
    from .openstack.api import json_of
    from .openstack.placement import PLACEMENT_MICROVERSION

    api = cloud.api
    region = cloud.region
    ctx = {"cloud": cloud.cloud_name, "region": region.name}
    try:
        auth_url = str(api.conn.config.config.get("auth", {}).get("auth_url") or f"clouds.yaml {cloud.cloud_name}")
    except SpotctlError as e:
        return [failing("openstack.auth", f"clouds.yaml entry {cloud.cloud_name}", e, ctx)]

    def auth() -> Observed:
        api.call("keystone login", lambda: api.conn.session.get_token())
        pid = api.call("keystone project", lambda: api.conn.current_project_id)
        if not pid:
            raise ConfigError(f"cloud {cloud.cloud_name!r}: the token is scoped to no project",
                              hint="set the project of the cloud in clouds.yaml (project_name or project_id)")
        return Observed(f"keystone issued a token scoped to project {pid}", {"project_id": pid})

    def get(proxy_name: str, label: str, path: str, count_key: str | None, **kw: Any):
        def run() -> Observed:
            # the proxy discovers the service's versions when first used: a service that is down fails here
            proxy = api.call(f"{label} version discovery", lambda: getattr(api.conn, proxy_name))
            url = api.call(f"{label} endpoint", lambda: proxy.get_endpoint())
            r = api.call(f"{label} GET {path}", lambda: proxy.get(path, raise_exc=False, **kw))
            body = api.call(f"{label} GET {path}", lambda: json_of(r, path))
            items = body.get(count_key) if count_key and isinstance(body, dict) else None
            n = f", {len(items)} {count_key} in the answer" if isinstance(items, (list, dict)) else ""
            return Observed(f"GET {url.rstrip('/')}{path}: HTTP {r.status_code}{n}")
        return run

    def blazar() -> Observed:
        sess = api.conn.session
        path = "/os-hosts"
        url = api.call("blazar endpoint", lambda: sess.get_endpoint(service_type="reservation", interface="public"))
        hosts = cloud.blazar.get(path).get("hosts", [])
        return Observed(f"GET {str(url).rstrip('/')}{path}: {len(hosts)} hosts registered for reservations")

    pools = region.pools
    via = {name: cloud.options.pool(name).via for name in pools}
    nova_pools = [n for n in pools if via[n] == "nova"]
    ironic_pools = [n for n in pools if via[n] == "ironic" or pools[n].kind is PoolKind.BAREMETAL]
    probes = [Probe("openstack.auth", auth_url, auth, context=ctx)]
    if nova_pools or not pools:
        probes.append(Probe("openstack.nova", "compute API (Nova)", get("compute", "nova", "/flavors?limit=1",
                                                                       "flavors"), needs="openstack.auth",
                            context=ctx))
        probes.append(Probe("openstack.placement", "placement API",
                            get("placement", "placement", "/resource_classes", "resource_classes",
                                microversion=PLACEMENT_MICROVERSION), needs="openstack.auth", context=ctx))
    if cloud.options.blazar:
        probes.append(Probe("openstack.blazar", "reservation API (Blazar)", blazar, needs="openstack.auth",
                            context=ctx))
    if ironic_pools:
        probes.append(Probe("openstack.ironic", "baremetal API (Ironic)",
                            get("baremetal", "ironic", "/nodes?limit=1", "nodes"), needs="openstack.auth",
                            context=ctx))
    return probes


# --- Slurm -----------------------------------------------------------------------------------------------


def slurm_probes(s: Any, region: str = "") -> list[Probe]:
    """slurmrestd's API versions (``GET /openapi/v3``); then the token, by authenticated reads of the
    partitions (what a pass reads first) and of ``ping`` (slurmctld as slurmrestd sees it)."""
    ctx = {"user": s.user, "source": s._token.source, "region": region}

    def version() -> Observed:
        chosen = s.discover()
        return Observed(f"slurmrestd serves {', '.join(s.served_versions) or chosen}; spotctl uses {chosen}",
                        {"api_version": chosen, "served": list(s.served_versions)})

    def authed(path: str) -> dict:
        try:
            return s._request("GET", path, what=f"GET {path}")
        except TemporaryError as e:
            # Slurm 22.05 answers a token slurmctld refuses with HTTP 500, as it answers a controller down;
            # scontrol (munge) tells them apart, as the adapter does at start
            if s.scontrol and s.scontrol.controller_up():
                raise AuthError(f"slurm: slurmctld is up but refuses the token of user {s.user!r} from "
                                f"{s._token.source}; slurmrestd said: {e.message.split(': ', 2)[-1]}") from None
            raise

    def auth() -> Observed:
        v = s.discover()
        parts = authed(f"/slurm/{v}/partitions").get("partitions") or []
        pings = authed(f"/slurm/{v}/ping").get("pings") or []
        up = [f"{p.get('hostname', '?')} {p.get('pinged') or p.get('ping') or p.get('responding')}"
              for p in pings if isinstance(p, dict)]
        return Observed(f"the token of user {s.user} ({s._token.source}) is accepted: GET /slurm/{v}/partitions "
                        f"listed {len(parts)} partitions; ping: {', '.join(up) or 'no controller listed'}")

    return [Probe("slurm.version", s.url, version, context=ctx),
            Probe("slurm.auth", f"{s.url} as {s.user}", auth, needs="slurm.version", context=ctx)]


# --- Kubernetes ------------------------------------------------------------------------------------------

SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def kubernetes_probes(k: Any, region: str = "") -> list[Probe]:
    """The credentials (an access review the API server answers only to an authenticated client, with its
    version from ``/version``), then one SelfSubjectAccessReview per verb spotctl needs (:data:`K8S_ACCESS`)."""
    api = k.api
    ns = k.settings.namespace or ""
    ctx = {"source": api.conn.source or "the kubeconfig", "region": region}

    def review(verb: str, resource: str, subresource: str) -> dict:
        attrs: dict[str, str] = {"verb": verb, "resource": resource, "group": ""}
        if subresource:
            attrs["subresource"] = subresource
        if resource == "pods" and ns:
            attrs["namespace"] = ns
        body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                "spec": {"resourceAttributes": attrs}}
        _, out = api.request("POST", SSAR_PATH, body=body)
        status = out.get("status") if isinstance(out, dict) else None
        if not isinstance(status, dict) or not isinstance(status.get("allowed"), bool):
            raise UnavailableError(f"kubernetes: POST {SSAR_PATH}: the answer has no status.allowed")
        return status

    def auth() -> Observed:
        status = review("list", "pods", "")
        version = ""
        try:
            _, v = api.request("GET", "/version")
            version = f" (Kubernetes {v.get('gitVersion')})" if isinstance(v, dict) and v.get("gitVersion") else ""
        except SpotctlError:
            pass  # the version is a detail: the access review answered, which is what proves the credentials
        return Observed(f"authenticated: the API server answered an access review{version}",
                        {"allowed": status.get("allowed")})

    def access(verb: str, resource: str, subresource: str):
        def run() -> Observed:
            st = review(verb, resource, subresource)
            return Observed(f"SelfSubjectAccessReview {verb} {_res(resource, subresource)}"
                            + (f" in namespace {ns}" if ns and resource == "pods" else ""),
                            {"allowed": st["allowed"], "reason": st.get("reason") or st.get("evaluationError"),
                             "verb": verb, "resource": _res(resource, subresource)})
        return run

    probes = [Probe("kubernetes.auth", api.base, auth, context=ctx)]
    for verb, resource, sub, why in K8S_ACCESS:
        probes.append(Probe("kubernetes.rbac", f"{verb} {_res(resource, sub)}: {why}", access(verb, resource, sub),
                            kind=Kind.ACCESS, needs="kubernetes.auth", context=ctx))
    return probes


def _res(resource: str, subresource: str) -> str:
    return f"{resource}/{subresource}" if subresource else resource


# --- Kafka, audit, contract feed -------------------------------------------------------------------------


def kafka_probes(relay: Any, region: str) -> list[Probe]:
    """The brokers' metadata for the configured topic (kafka-python's admin client; bounded)."""
    from .kafka import _bounded, _translate

    where = ",".join(relay.bootstrap_servers)

    def run() -> Observed:
        from kafka import KafkaAdminClient

        ms = int(relay.max_wait_seconds * 1000)

        def describe() -> Any:
            admin = KafkaAdminClient(bootstrap_servers=relay.bootstrap_servers, client_id=relay.client_id,
                                     request_timeout_ms=max(1000, min(ms, 30000)), bootstrap_timeout_ms=ms,
                                     reconnect_backoff_max_ms=1000, retry_backoff_ms=100, **relay._security())
            try:
                return admin.describe_topics([relay.topic]), len(admin._client.cluster.brokers())
            finally:
                admin.close()

        try:
            topics, brokers = _bounded(describe, relay.max_wait_seconds, "read the topic's metadata")
        except SpotctlError:
            raise
        except Exception as e:
            raise _translate(e, relay) from None
        t = next((x for x in topics or [] if (x.get("name") or x.get("topic")) == relay.topic), None)
        if t is None or t.get("error_code", 0) != 0:
            code = t.get("error_code") if t else None
            if code not in (None, 3):  # 3: UNKNOWN_TOPIC_OR_PARTITION; others (29: not authorised ...) are errors
                from kafka.errors import for_code

                raise _translate(for_code(code)(), relay)
            return Observed(f"{brokers} broker(s) answered; metadata of {relay.topic}: unknown topic",
                            {"topic": relay.topic, "partitions": None})
        parts = t.get("partitions") or []
        return Observed(f"{brokers} broker(s) answered; topic {relay.topic}: {len(parts)} partition(s)",
                        {"topic": relay.topic, "partitions": len(parts)})

    return [Probe("kafka.metadata", where, run, kind=Kind.TOPIC, context={"region": region})]


def audit_probes(client: Any, region: str) -> list[Probe]:
    """An authenticated read of the audit service's records (one record at most)."""
    def run() -> Observed:
        body = client._request("GET", "/v1/records", params={"region": region, "after": 0, "limit": 1})
        n = len(body.get("records") or []) if isinstance(body, dict) else 0
        more = " (and more)" if isinstance(body, dict) and body.get("next_after") is not None else ""
        return Observed(f"GET {client.url}/v1/records?limit=1 with our token: HTTP 200, {n} record(s){more} "
                        f"of region {region}")

    return [Probe("audit.service", client.url, run, context={"region": region})]


def contract_probes(feed: Any, region: str, what: str = "contract.rate_card") -> list[Probe]:
    """The rate card read (what every pass reads first of the feed)."""
    def run() -> Observed:
        card = feed.rate_card()
        return Observed(f"rate card {card.version}: {len(card.prices)} pool price(s) in {card.currency}")

    return [Probe(what, getattr(feed, "url", "static rate card (config)"), run, context={"region": region})]


# --- OIDC (Keycloak) --------------------------------------------------------------------------------------


def oidc_probes(ident: Any, region: str, secret: Any | None) -> list[Probe]:
    """Discovery (``.well-known/openid-configuration``, its issuer the realm's), the JWKS it names (signing
    keys present), and, when a service secret is configured (``secret``: where it is read from), a
    client-credentials token of the service account (not kept)."""
    s = ident.settings
    issuer = s.issuer
    found: dict[str, Any] = {}
    ctx = {"region": region, "client": s.service_client_id,
           "source": (secret.file or f"${secret.env}") if secret is not None else ""}

    def discovery() -> Observed:
        doc = ident._get(f"{issuer}/.well-known/openid-configuration")
        if not isinstance(doc, dict) or doc.get("issuer") != issuer:
            raise UnavailableError(f"identity: {issuer}/.well-known/openid-configuration names issuer "
                                   f"{doc.get('issuer') if isinstance(doc, dict) else None!r}, not {issuer}")
        found.update(doc)
        return Observed(f"issuer {issuer}; token endpoint {doc.get('token_endpoint')}")

    def jwks() -> Observed:
        uri = found.get("jwks_uri") or f"{issuer}/protocol/openid-connect/certs"
        doc = ident._get(uri)
        keys = [k for k in (doc.get("keys") or []) if isinstance(k, dict)] if isinstance(doc, dict) else []
        sig = [k for k in keys if k.get("use") in (None, "sig")]
        if not sig:
            raise UnavailableError(f"identity: {uri} publishes no signing key ({len(keys)} keys)")
        return Observed(f"GET {uri}: {len(sig)} signing key(s) ({', '.join(sorted({str(k.get('alg')) for k in sig}))})")

    def service_token() -> Observed:
        assert secret is not None  # only probed when a secret is configured
        doc = ident.client_credentials(s.service_client_id, secret.read())
        if not doc.get("access_token"):
            raise AuthError(f"identity: {issuer} answered the client credentials grant without an access token")
        return Observed(f"Keycloak issued a service token to client {s.service_client_id} "
                        f"(expires in {doc.get('expires_in', '?')} s; not kept)")

    probes = [Probe("oidc.discovery", issuer, discovery, context=ctx),
              Probe("oidc.jwks", f"{issuer} (JWKS)", jwks, needs="oidc.discovery", context=ctx)]
    if secret is not None:
        probes.append(Probe("oidc.service_token", f"{issuer} as {s.service_client_id}", service_token,
                            needs="oidc.discovery", context=ctx))
    return probes


# --- systemd ---------------------------------------------------------------------------------------------

SYSTEMD_PROPERTIES = ("LoadState", "UnitFileState", "ActiveState", "SubState", "Result")


def systemd_facts(units: list[str], timeout: float = 5.0, root: str = "/run/systemd/system") -> dict[str, Any]:
    """``systemctl show`` of the units: their LoadState, UnitFileState, ActiveState, SubState and Result;
    ``systemd: False`` (with why) where systemd does not run (a container, the demo)."""
    if not Path(root).is_dir():
        return {"systemd": False, "why": f"no {root}: systemd is not the init system here"}
    systemctl = shutil.which("systemctl")
    if systemctl is None:
        return {"systemd": False, "why": "no systemctl on PATH"}
    try:
        p = subprocess.run([systemctl, "show", f"--property={','.join(SYSTEMD_PROPERTIES)}", "--", *units],
                           capture_output=True, text=True, timeout=timeout, check=False,
                           env={**os.environ, "SYSTEMD_PAGER": "", "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        raise TemporaryError(f"systemctl show did not answer within {timeout:g} s") from None
    except OSError as e:
        raise UnavailableError(f"cannot run systemctl: {e.strerror}") from None
    if p.returncode != 0:
        raise UnavailableError(f"systemctl show failed: {(p.stderr or p.stdout).strip()[:200]}",
                               hint="is this host's systemd (PID 1) reachable over D-Bus?")
    blocks = [b for b in p.stdout.strip().split("\n\n")]
    out: dict[str, dict[str, str]] = {}
    for name, block in zip(units, blocks):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        out[name] = {k: props.get(k, "") for k in SYSTEMD_PROPERTIES}
    return {"systemd": True, "units": out}


# --- helpers ---------------------------------------------------------------------------------------------


def failing(check: str, target: str, error: SpotctlError, context: dict[str, str] | None = None) -> Probe:
    """A probe that reports an error found while building it (a bad config table: ConfigError)."""
    def run() -> Observed:
        raise error

    return Probe(check, target, run, context=context or {})
