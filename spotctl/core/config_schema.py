"""The configuration schema: every key a config file, ``SPOTCTL_*`` variable or flag may set, the type
and range of its value, its default, and the one check a single value gets where it enters
(``leaf_problem``). ``config.py`` reads and merges the layers against it."""

from __future__ import annotations

import builtins
import math
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from .demo import DEMO_REGION, DEMO_REGION_NAME

# --- schema -----------------------------------------------------------------
# A schema maps key -> Key (a leaf: its type and the values it may take), or key -> nested schema
# (dict), or "*" -> schema for tables of named entries (regions, pools). Every value is checked where
# it enters: a file's values at FILE:LINE as the file is read, environment and flags as they are merged.

DAY = 86_400
YEAR = 366 * DAY


@dataclass(frozen=True)
class Key:
    """A leaf of the schema: the type, and the range or choices a value must fall in."""

    type: builtins.type | tuple[builtins.type, ...]
    lo: float | None = None  # inclusive minimum
    hi: float | None = None  # inclusive maximum
    gt: float | None = None  # exclusive minimum
    choices: tuple[str, ...] | None = None
    items: builtins.type | None = None  # a list's items, or a table's values (labels)
    check: str | None = None  # a syntax check by name: "url", "hostports", "token", "currency", "name"

    def want(self) -> str:
        t = self.type
        base = {str: "a string", bool: "true or false", int: "an integer", list: "a list", dict: "a table"}.get(
            t, "a number") if isinstance(t, type) else "a number"
        if self.items is not None:
            base += f" of {self.items.__name__ if self.items is not str else 'strings'}"
        return base


def _int(lo: float | None = 0, hi: float | None = None) -> Key:
    return Key(int, lo=lo, hi=hi)


def _num(lo: float | None = None, hi: float | None = None, gt: float | None = None) -> Key:
    return Key((int, float), lo=lo, hi=hi, gt=gt)


def _secs(hi: float = YEAR) -> Key:
    return Key(int, lo=0, hi=hi)


def _timeout() -> Key:
    return Key((int, float), gt=0, hi=3600)


def _str(*choices: str, check: str | None = None) -> Key:
    return Key(str, choices=choices or None, check=check)


_S = _str()
_B = Key(bool)
_STRS = Key(list, items=str)
_POOL_SCHEMA = {
    "kind": _str("vm", "baremetal"), "class": _str("headroom", "reserved-idle"), "az": _str(check="name"),
    "flavor": _S, "resource_class": _S, "aggregate": _S, "image": _S, "networks": _S,
    "max_nodes": _int(0, 100_000), "vcpu": _int(1, 100_000), "ram_mb": _int(1, 1 << 32), "gpus": _int(0, 1024),
    "boot_seconds": _secs(DAY), "cleaning_seconds": _secs(DAY),
    "price": _num(lo=0, hi=1e9),  # list price per node-hour, used when the region has no rate-card feed
    "on_demand_price": _num(lo=0, hi=1e9),  # what the same node costs on demand, per node-hour (spotctl report)
    "kubernetes": {"labels": Key(dict, items=str), "taints": _STRS},
    "slurm": {"partition": _S, "features": _STRS},
}
_POLICY_SCHEMA = {
    "spend_cap_per_hour": _num(lo=0, hi=1e12), "disruption_budget_pct": _num(0, 100),
    "idle_ttl_seconds": _secs(), "drain_seconds": _secs(DAY), "failure_ttl_seconds": _secs(),
    "default_pod_seconds": _int(1, YEAR), "no_notice_max_seconds": _secs(), "currency": _str(check="currency"),
    "max_launches_per_pass": _int(0, 100_000),
    "advisory_prespin_seconds": _secs(), "advisory_drain_seconds": _secs(), "advisory_timeout_seconds": _secs(),
    "advisory_prespin_lead_seconds": _secs(), "advisory_drain_margin_seconds": _secs(),
    "calendar_advisory_seconds": _secs(),
    "drill_max_pool_pct": _num(hi=100, gt=0), "drill_min_served_pct": _num(0, 100),
    "contract_restore_notices": _int(1, 1000), "contract_restore_hold_seconds": _secs(),
    "observe_deadline_seconds": _num(lo=0.5, hi=3600),
    "consolidation_min_saving_pct": _num(0, 100), "consolidation_min_node_age_seconds": _secs(),
    "consolidation_min_run_seconds": _secs(), "consolidation_retire": _B,
}
_URL = _str(check="url")
_TOKEN = _str(check="token")
#: How long the state database keeps what is done with (``[regions.R.retention]``, :mod:`spotctl.ops.prune`):
#: days after a row is finished with, the plan history's caps, and the time a pass may spend pruning.
RETENTION_TABLES = ("nodes", "transitions", "actions", "notices", "outbox", "audit", "passes")
RETENTION_DEFAULTS: dict[str, object] = {
    "nodes_days": 30, "transitions_days": 30, "actions_days": 30, "notices_days": 30, "outbox_days": 7,
    "audit_days": 90, "passes_days": 30, "plans_max": 500, "plans_max_mib": 64, "pass_budget_seconds": 0.2}
_REGION_SCHEMA = {
    "backend": _str("sim", "openstack"), "cloud": _S, "seed": _int(0, (1 << 63) - 1), "actor": _S,
    "budget": {"rate": _num(hi=1e6, gt=0), "burst": _int(1, 1_000_000)},
    "policy": _POLICY_SCHEMA,
    "pools": {"*": _POOL_SCHEMA},
    "openstack": {
        "image": _S, "networks": _S, "key_name": _S, "user_data": _S, "wait_active_seconds": _secs(DAY),
        "delete_verify_seconds": _secs(DAY), "timeout_seconds": _timeout(), "blazar": _B,
        "host_placement": _str("off", "hint", "target"),
        "pools": {"*": {"via": _str("nova", "ironic"), "traits": _STRS, "image": _S, "networks": _S,
                        "host_placement": _str("off", "hint", "target")}},
    },
    "kubernetes": {
        "kubeconfig": _S, "context": _S, "in_cluster": _B, "serviceaccount_dir": _S, "server": _URL,
        "token_file": _S, "ca_file": _S, "insecure_skip_tls_verify": _B, "namespace": _S,
        "timeout_seconds": _timeout(), "watch_idle_seconds": _timeout(), "watch_max_seconds": _timeout(),
        "cordon_taint": _S, "expected_seconds_annotation": _S, "deadline_margin_seconds": _num(0, YEAR),
        "page_size": _int(1, 100_000), "node_label_selector": _S,
    },
    "slurm": {
        "url": _URL, "user": _S, "token": _TOKEN, "token_file": _S, "token_env": _S, "api_version": _S,
        "scontrol": _S, "slurm_conf": _S, "timeout_seconds": _timeout(), "verify_tls": _B, "ca_file": _S,
        "node_name": _S, "node_prefix": _S, "default_time_limit_seconds": _int(1, YEAR),
        "drain_via": _str("auto", "rest", "scontrol"),
    },
    "kafka": {
        "bootstrap_servers": _str(check="hostports"), "topic": _str(check="name"), "client_id": _S,
        "max_wait_seconds": _timeout(), "batch_size": _int(1, 1_000_000), "transactions": _B,
        "transactional_id": _S, "security_protocol": _str("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"),
        "sasl_mechanism": _str("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER"),
        "sasl_plain_username": _S, "sasl_plain_password": _TOKEN, "sasl_password_file": _S, "ssl_cafile": _S,
        "ssl_certfile": _S, "ssl_keyfile": _S, "ssl_check_hostname": _B,
    },
    "audit": {"url": _URL, "token": _TOKEN, "token_file": _S, "timeout_seconds": _timeout(),
              "batch_size": _int(1, 1000), "ca_file": _S, "identity_token": _B},
    "contract": {"url": _URL, "token": _TOKEN, "token_file": _S, "timeout_seconds": _timeout(),
                 "identity_token": _B},
    # Keycloak (issue 15): who may act on the region; roles -> the verbs they allow (spotctl.core.identity)
    "identity": {"server_url": _URL, "realm": _str(check="name"), "client_id": _str(check="name"),
                 "audience": _S, "required": _B, "ca_file": _S, "leeway_seconds": _int(0, 300),
                 "service_client_id": _str(check="name"), "service_secret_file": _S, "timeout_seconds": _timeout(),
                 "roles": {"*": _STRS}},
    "retention": {**{f"{t}_days": _num(0, 3660) for t in RETENTION_TABLES},
                  "plans_max": _int(1, 500), "plans_max_mib": _num(0, 1_048_576), "pass_budget_seconds": _num(0, 60)},
    # Integration sections: each real adapter reads its own table (see ADAPTER_SECTIONS).
    # A section present replaces that part of the simulator for this region.
}
ADAPTER_SECTIONS = ("openstack", "slurm", "kubernetes", "contract", "kafka", "audit", "identity")

#: What each adapter uses for a key its table leaves out, for ``spotctl config show`` (the adapters apply
#: them; tests/unit/test_config_view.py checks these against the adapters' own defaults, and
#: tests/test_docs.py against the operator guide). A key not named here has no default: unset means off,
#: or decided at run time (``kubeconfig``: ``$KUBECONFIG``; kafka's ``topic``: from the region's name).
SECTION_DEFAULTS: dict[str, dict[str, object]] = {
    "openstack": {"networks": "none", "wait_active_seconds": 600, "delete_verify_seconds": 300,
                  "timeout_seconds": 30.0, "blazar": True, "host_placement": "off"},
    "openstack.pools": {"via": "nova"},
    "kubernetes": {"in_cluster": False, "serviceaccount_dir": "/var/run/secrets/kubernetes.io/serviceaccount",
                   "insecure_skip_tls_verify": False, "timeout_seconds": 10.0, "watch_idle_seconds": 0.3,
                   "watch_max_seconds": 10.0, "cordon_taint": "spotctl.io/reclaim",
                   "expected_seconds_annotation": "spotctl.io/expected-seconds", "deadline_margin_seconds": 10.0,
                   "page_size": 500},
    "slurm": {"scontrol": "scontrol", "timeout_seconds": 10.0, "verify_tls": True, "node_name": "{node}",
              "node_prefix": "spot-", "default_time_limit_seconds": 3600, "drain_via": "auto"},
    "kafka": {"max_wait_seconds": 10.0, "batch_size": 500, "transactions": True, "security_protocol": "PLAINTEXT",
              "ssl_check_hostname": True},
    "audit": {"timeout_seconds": 5.0, "batch_size": 200, "identity_token": False},
    "contract": {"timeout_seconds": 10.0, "identity_token": False},
    "identity": {"client_id": "spotctl", "required": True, "leeway_seconds": 30,
                 "service_client_id": "spot-reconciler", "timeout_seconds": 10.0},
    "retention": RETENTION_DEFAULTS,  # not an adapter's: the typed view is config.Retention (spotctl.ops.prune)
}
OUTPUTS = ("auto", "table", "json", "yaml")
LOG_LEVELS = ("debug", "info", "warning", "error")
SCHEMA = {
    "default_region": _str(check="name"), "state_dir": _S, "output": _str(*OUTPUTS), "log_level": _str(*LOG_LEVELS),
    "regions": {"*": _REGION_SCHEMA},
}

DEFAULTS = {
    "default_region": DEMO_REGION_NAME,
    "output": "auto",
    "log_level": "warning",
    "regions": {DEMO_REGION_NAME: DEMO_REGION},
}


ENV_KEYS = {
    "SPOTCTL_REGION": "default_region",
    "SPOTCTL_STATE_DIR": "state_dir",
    "SPOTCTL_OUTPUT": "output",
    "SPOTCTL_LOG_LEVEL": "log_level",
}

SECRET_PATTERN = re.compile(r"(password|secret|token|key)$", re.I)


def _show(value: object, limit: int = 60) -> str:
    """A value as echoed in an error: its repr, cut to ``limit`` characters."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 1] + "…"


def hint_for(spec: Key) -> str | None:
    if spec.choices:
        return "one of: " + ", ".join(spec.choices)
    return {"url": "e.g. https://host:8443/path", "hostports": 'e.g. "kafka1:9092,kafka2:9092"',
            "currency": 'an ISO 4217 code, e.g. "EUR"'}.get(spec.check or "")


def _range(spec: Key) -> str:
    def n(v: float) -> str:
        return str(int(v)) if float(v).is_integer() else f"{v:g}"

    parts = []
    if spec.gt is not None:
        parts.append(f"> {n(spec.gt)}")
    if spec.lo is not None:
        parts.append(f">= {n(spec.lo)}")
    if spec.hi is not None:
        parts.append(f"<= {n(spec.hi)}")
    return " and ".join(parts)


def leaf_problem(spec: Key, value: object) -> str | None:
    """Why ``value`` does not fit ``spec`` (a phrase to follow the key), or None when it fits."""
    types = spec.type if isinstance(spec.type, tuple) else (spec.type,)
    ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
    if not ok:
        return f"must be {spec.want()}, got {type(value).__name__} {_show(value)}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if ((spec.lo is not None and value < spec.lo) or (spec.hi is not None and value > spec.hi)
                or (spec.gt is not None and value <= spec.gt)):
            return f"must be {_range(spec)}, got {_show(value)}"
    if isinstance(value, list) and spec.items is not None:
        for i, item in enumerate(value):
            if not isinstance(item, spec.items) or isinstance(item, bool) and spec.items is not bool:
                return f"must be {spec.want()}: item {i + 1} is {type(item).__name__} {_show(item)}"
    if isinstance(value, dict) and spec.items is not None:
        for k, item in value.items():
            if not isinstance(item, spec.items) or isinstance(item, bool) and spec.items is not bool:
                return f"must be {spec.want()}: {k!r} is {type(item).__name__} {_show(item)}"
    if isinstance(value, str):
        if spec.choices and value not in spec.choices:
            return f"must be one of {', '.join(spec.choices)}, got {_show(value)}"
        check = _CHECKS.get(spec.check or "")
        if check:
            return check(value)
    return None


def _check_url(v: str) -> str | None:
    try:
        u = urlsplit(v)
        u.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        return f"is not a valid URL ({e}): {_show(v)}"
    if u.scheme not in ("http", "https") or not u.hostname or any(c.isspace() for c in v):
        return f"must be an http:// or https:// URL with a host, got {_show(v)}"
    return None


_HOSTPORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")


def _check_hostports(v: str) -> str | None:
    items = [s.strip() for s in v.split(",")]
    for item in items:
        m = _HOSTPORT.match(item)
        if not m or not 1 <= int(m.group(2)) <= 65535:
            return f"must be a comma-separated list of host:port, got {_show(item or v)}"
    return None


def _check_token(v: str) -> str | None:
    if not v or any(c.isspace() or not c.isprintable() for c in v):
        return "must be one line of printable characters without spaces (a newline or space was found)"
    return None


def _check_currency(v: str) -> str | None:
    return None if re.fullmatch(r"[A-Z]{3}", v) else f"must be a three-letter ISO 4217 code, got {_show(v)}"


def _check_name(v: str) -> str | None:
    if not v or len(v) > 253 or any(c.isspace() or not c.isprintable() for c in v):
        return f"must be a non-empty name without spaces (at most 253 characters), got {_show(v)}"
    return None


_CHECKS = {"url": _check_url, "hostports": _check_hostports, "token": _check_token,
           "currency": _check_currency, "name": _check_name}
