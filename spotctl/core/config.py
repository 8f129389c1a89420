"""Configuration: one loader, one precedence.

defaults < ``/etc/spotctl/config.toml`` < user file (``$SPOTCTL_CONFIG`` or
``$XDG_CONFIG_HOME/spotctl/config.toml``) < ``SPOTCTL_*`` environment < flags.

Every leaf value remembers where it came from, so ``spotctl config show`` can
print it. Unknown keys and wrong types are errors naming the file, line and key.
"""

from __future__ import annotations

import copy
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from .demo import DEMO_REGION, DEMO_REGION_NAME
from .errors import ConfigError, NotFoundError
from .models import KubernetesBinding, PoolClass, PoolKind, PoolSpec, Shape, SlurmBinding

SYSTEM_CONFIG = "/etc/spotctl/config.toml"

# --- schema -----------------------------------------------------------------
# A schema maps key -> type, or key -> nested schema (dict), or "*" -> schema
# for tables of named entries (regions, pools).

_NUM = (int, float)
_POOL_SCHEMA = {
    "kind": str, "class": str, "az": str, "flavor": str, "resource_class": str,
    "aggregate": str, "image": str, "networks": str, "max_nodes": int,
    "vcpu": int, "ram_mb": int, "gpus": int, "boot_seconds": int, "cleaning_seconds": int,
    "price": _NUM,  # list price per node-hour, used when the region has no rate-card feed
    "kubernetes": {"labels": dict, "taints": list},
    "slurm": {"partition": str, "features": list},
}
_REGION_SCHEMA = {
    "backend": str, "cloud": str, "seed": int, "actor": str,
    "budget": {"rate": _NUM, "burst": int},
    "policy": {
        "spend_cap_per_hour": _NUM, "disruption_budget_pct": _NUM, "idle_ttl_seconds": int,
        "drain_seconds": int, "failure_ttl_seconds": int, "default_pod_seconds": int,
        "no_notice_max_seconds": int, "currency": str, "max_launches_per_pass": int,
        "advisory_prespin_seconds": int, "advisory_drain_seconds": int, "advisory_timeout_seconds": int,
        "advisory_prespin_lead_seconds": int, "advisory_drain_margin_seconds": int, "calendar_advisory_seconds": int,
        "drill_max_pool_pct": _NUM, "drill_min_served_pct": _NUM,
        "contract_restore_notices": int, "contract_restore_hold_seconds": int,
    },
    "pools": {"*": _POOL_SCHEMA},
    "openstack": {"image": str, "networks": str, "key_name": str, "user_data": str, "wait_active_seconds": int, "delete_verify_seconds": int, "timeout_seconds": _NUM, "blazar": bool, "pools": {"*": {"via": str, "traits": list, "image": str, "networks": str}}},
    "kubernetes": {"kubeconfig": str, "context": str, "in_cluster": bool, "serviceaccount_dir": str, "server": str, "token_file": str, "ca_file": str, "insecure_skip_tls_verify": bool, "namespace": str, "timeout_seconds": _NUM, "watch_idle_seconds": _NUM, "watch_max_seconds": _NUM, "cordon_taint": str, "expected_seconds_annotation": str, "deadline_margin_seconds": _NUM, "page_size": int, "node_label_selector": str},
    "slurm": {"url": str, "user": str, "token": str, "token_file": str, "token_env": str, "api_version": str, "scontrol": str, "slurm_conf": str, "timeout_seconds": _NUM, "verify_tls": bool, "ca_file": str, "node_name": str, "node_prefix": str, "default_time_limit_seconds": int, "drain_via": str},
    "kafka": {"bootstrap_servers": str, "topic": str, "client_id": str, "max_wait_seconds": _NUM, "batch_size": int, "transactions": bool, "transactional_id": str, "security_protocol": str, "sasl_mechanism": str, "sasl_plain_username": str, "sasl_plain_password": str, "sasl_password_file": str, "ssl_cafile": str, "ssl_certfile": str, "ssl_keyfile": str, "ssl_check_hostname": bool},
    "audit": {"url": str, "token": str, "token_file": str, "timeout_seconds": _NUM, "batch_size": int, "ca_file": str},
    "contract": {"url": str, "token": str, "token_file": str, "timeout_seconds": _NUM},
    # Integration sections: each real adapter reads its own table (see ADAPTER_SECTIONS).
    # A section present replaces that part of the simulator for this region.
}
ADAPTER_SECTIONS = ("openstack", "slurm", "kubernetes", "contract", "kafka", "audit")
SCHEMA = {
    "default_region": str, "state_dir": str, "output": str, "log_level": str,
    "regions": {"*": _REGION_SCHEMA},
}

DEFAULTS = {
    "default_region": DEMO_REGION_NAME,
    "output": "auto",
    "log_level": "warning",
    "regions": {DEMO_REGION_NAME: DEMO_REGION},
}

LOG_LEVELS = ("debug", "info", "warning", "error")

ENV_KEYS = {
    "SPOTCTL_REGION": "default_region",
    "SPOTCTL_STATE_DIR": "state_dir",
    "SPOTCTL_OUTPUT": "output",
    "SPOTCTL_LOG_LEVEL": "log_level",
}

SECRET_PATTERN = re.compile(r"(password|secret|token|key)$", re.I)


# --- typed views ------------------------------------------------------------


@dataclass(frozen=True)
class BudgetConfig:
    rate: float = 1.0  # tokens per second
    burst: int = 20


@dataclass(frozen=True)
class Policy:
    spend_cap_per_hour: float | None = None
    disruption_budget_pct: float = 10.0
    idle_ttl_seconds: int = 600
    drain_seconds: int = 120
    failure_ttl_seconds: int = 900
    default_pod_seconds: int = 3600
    no_notice_max_seconds: int = 7200
    currency: str = "EUR"
    max_launches_per_pass: int = 50
    # The graduated response to an advisory: cordon at once, pre-spin a replacement, then drain.
    advisory_prespin_seconds: int = 300  # without a deadline: pre-spin this long after the advisory
    advisory_drain_seconds: int = 900  # without a deadline: drain this long after the advisory
    advisory_timeout_seconds: int = 3600  # without a deadline: give up (uncordon) after this long
    advisory_prespin_lead_seconds: int = 1800  # with a deadline: pre-spin this long before it
    advisory_drain_margin_seconds: int = 600  # with a deadline: drain drain_seconds + this before it
    calendar_advisory_seconds: int = 3600  # a reservation taking a host is an advisory this long ahead
    drill_max_pool_pct: float = 25.0  # a reclaim drill takes at most this share of a pool's nodes
    drill_min_served_pct: float = 50.0  # a drill stops early when demand served drops below this
    # The notice term is restored after a late notice once this many hard notices in a row came on
    # time, and none late for this long (see spotctl.core.contract.notice_term).
    contract_restore_notices: int = 3
    contract_restore_hold_seconds: int = 3600


@dataclass(frozen=True)
class RegionConfig:
    name: str
    backend: str
    pools: dict[str, PoolSpec]
    budget: BudgetConfig = field(default_factory=BudgetConfig)
    policy: Policy = field(default_factory=Policy)
    cloud: str | None = None
    seed: int = 0
    actor: str | None = None
    sections: dict = field(default_factory=dict)  # adapter tables: openstack, slurm, kubernetes, kafka, audit, ...

    def section(self, name: str) -> dict | None:
        """The raw, schema-checked table of an adapter, or None when the region does not configure it."""
        return self.sections.get(name)

    def pool(self, name: str) -> PoolSpec:
        try:
            return self.pools[name]
        except KeyError:
            known = ", ".join(sorted(self.pools)) or "none"
            raise NotFoundError(
                f"unknown pool {name!r} in region {self.name!r}", hint=f"known pools: {known}"
            ) from None


@dataclass
class Config:
    """The merged configuration, with the source of every leaf value."""

    data: dict
    sources: dict[str, str]
    files: list[str]

    @property
    def default_region(self) -> str:
        return self.data["default_region"]

    @property
    def output(self) -> str:
        return self.data.get("output", "auto")

    @property
    def log_level(self) -> str:
        """debug | info | warning | error (``log_level``, ``SPOTCTL_LOG_LEVEL``); -v/-q/--debug win."""
        return str(self.data.get("log_level", "warning")).lower()

    def state_dir(self) -> Path:
        if self.data.get("state_dir"):
            return Path(self.data["state_dir"]).expanduser()
        base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        return Path(base) / "spotctl"

    def region_names(self) -> list[str]:
        return sorted(self.data.get("regions", {}))

    def region(self, name: str | None = None) -> RegionConfig:
        name = name or self.default_region
        regions = self.data.get("regions", {})
        if name not in regions:
            known = ", ".join(sorted(regions)) or "none"
            raise NotFoundError(f"unknown region {name!r}", hint=f"configured regions: {known}")
        return _region_from_dict(name, regions[name], self.sources)

    def flat(self, redact: bool = True) -> list[tuple[str, object, str]]:
        rows = []
        for path, value in _flatten(self.data):
            if redact and SECRET_PATTERN.search(path.rsplit(".", 1)[-1]) and value:
                value = "***"
            rows.append((path, value, self.sources.get(path, "default")))
        return rows


# --- loading ----------------------------------------------------------------


def user_config_path(env: dict | None = None, host: bool = True) -> Path | None:
    """The user layer: ``SPOTCTL_CONFIG``, else ``$XDG_CONFIG_HOME/spotctl/config.toml``, else (on the
    host only) ``~/.config/spotctl/config.toml``; None when the environment names none."""
    env = os.environ if env is None else env
    if env.get("SPOTCTL_CONFIG"):
        return Path(env["SPOTCTL_CONFIG"]).expanduser()
    base = env.get("XDG_CONFIG_HOME") or (env.get("HOME") and os.path.join(env["HOME"], ".config"))
    if not base and host:
        base = os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "spotctl" / "config.toml" if base else None


def load_config(
    *,
    env: dict | None = None,
    flags: dict | None = None,
    system_path: str | os.PathLike | None = None,
    user_path: str | os.PathLike | None = None,
    host: bool | None = None,
) -> Config:
    """Load and merge every layer; raise :class:`ConfigError` on bad input.

    ``host``: read the host's default files (``/etc/spotctl/config.toml`` and ``~/.config``) when the
    environment does not name others. True by default for the process environment (``env=None``),
    False for an ``env`` given explicitly, so that ``load_config(env={})`` never reads this host's
    configuration (tests, embedding code); the entry points pass ``host=True``."""
    host = env is None if host is None else host
    env = dict(os.environ) if env is None else env
    sys_named = system_path or env.get("SPOTCTL_SYSTEM_CONFIG") or (SYSTEM_CONFIG if host else None)
    system = Path(sys_named) if sys_named else None
    user = Path(user_path) if user_path else user_config_path(env, host)
    if env.get("SPOTCTL_CONFIG") and (user is None or not user.exists()):
        raise ConfigError(f"config file {user} (from SPOTCTL_CONFIG) does not exist")

    data: dict = {}
    sources: dict[str, str] = {}
    _merge(data, sources, copy.deepcopy(DEFAULTS), "default")
    files = []
    for path in (system, user):
        if path is not None and path.is_file():
            layer = _read_file(path)
            # A file that defines its own regions does not hide the demo region,
            # but a file that sets default_region decides which one is used.
            _merge(data, sources, layer, str(path))
            files.append(str(path))
    for var, key in ENV_KEYS.items():
        if env.get(var):
            _merge(data, sources, {key: env[var]}, f"env {var}")
    for key, value in (flags or {}).items():
        if value is not None:
            _merge(data, sources, {key: value}, "flag")
    _check_values(data, sources)
    return Config(data=data, sources=sources, files=files)


def _read_file(path: Path) -> dict:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"cannot read config file {path}: {e.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path} is not UTF-8 text") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: malformed TOML: {e}", details={"file": str(path)}) from None
    _validate(data, SCHEMA, (), path, text)
    return data


def _validate(data: dict, schema: dict, where: tuple[str, ...], path: Path, text: str) -> None:
    for key, value in data.items():
        spec = schema.get(key, schema.get("*"))
        keypath = where + (key,)
        dotted = ".".join(keypath)
        line = _locate(text, where, key)
        at = f"{path}:{line}" if line else str(path)
        if spec is None:
            allowed = ", ".join(sorted(k for k in schema if k != "*"))
            raise ConfigError(
                f"{at}: unknown key {dotted!r}",
                hint=f"allowed here: {allowed}",
                details={"file": str(path), "line": line, "key": dotted},
            )
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise ConfigError(
                    f"{at}: {dotted!r} must be a table",
                    details={"file": str(path), "line": line, "key": dotted},
                )
            _validate(value, spec, keypath, path, text)
            continue
        ok = isinstance(value, spec) and not (isinstance(value, bool) and spec is not bool)
        if spec is int and isinstance(value, float):
            ok = False
        if not ok:
            want = spec.__name__ if isinstance(spec, type) else "number"
            raise ConfigError(
                f"{at}: {dotted!r} must be {want}, got {type(value).__name__} {value!r}",
                details={"file": str(path), "line": line, "key": dotted},
            )


_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def _split_key(s: str) -> tuple[str, ...]:
    return tuple(p.strip().strip('"').strip("'") for p in s.split("."))


def _locate(text: str, table: tuple[str, ...], key: str) -> int | None:
    """Best-effort line number of ``key`` inside ``table`` in TOML text."""
    current: tuple[str, ...] = ()
    fallback = None
    keypat = re.compile(r'^\s*(?:["\']?[\w.-]+["\']?\s*\.\s*)*["\']?' + re.escape(key) + r'["\']?\s*=')
    for n, line in enumerate(text.splitlines(), 1):
        m = _HEADER.match(line)
        if m:
            current = _split_key(m.group(1))
            if current == table + (key,):
                return n
            continue
        if keypat.match(line):
            if current == table:
                return n
            if fallback is None and table[: len(current)] == current:
                fallback = n
    if fallback is None:
        for n, line in enumerate(text.splitlines(), 1):
            if re.search(r"\b" + re.escape(key) + r"\b", line):
                return n
    return fallback


def _merge(dst: dict, sources: dict, src: dict, origin: str, prefix: str = "") -> None:
    for key, value in src.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not _is_leaf_table(path):
            node = dst.setdefault(key, {})
            if not isinstance(node, dict):
                node = dst[key] = {}
            _merge(node, sources, value, origin, path + ".")
        else:
            dst[key] = value
            sources[path] = origin


def _is_leaf_table(path: str) -> bool:
    return path.endswith(".labels")


def _flatten(d: dict, prefix: str = ""):
    for key in sorted(d):
        value = d[key]
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not _is_leaf_table(path):
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def _fail(sources: dict, key: str, message: str, hint: str | None = None):
    origin = sources.get(key, "default")
    raise ConfigError(f"{origin}: {key!r} {message}", hint=hint, details={"key": key, "source": origin})


def _check_values(data: dict, sources: dict) -> None:
    if data.get("output") not in ("auto", "table", "json", "yaml"):
        _fail(sources, "output", "must be one of auto, table, json, yaml")
    if str(data.get("log_level", "warning")).lower() not in LOG_LEVELS:
        _fail(sources, "log_level", f"must be one of {', '.join(LOG_LEVELS)}")
    for rname, region in data.get("regions", {}).items():
        base = f"regions.{rname}"
        if region.get("backend", "sim") not in ("sim", "openstack"):
            _fail(sources, f"{base}.backend", "must be 'sim' or 'openstack'")
        budget = region.get("budget", {})
        if budget.get("rate", 1) <= 0:
            _fail(sources, f"{base}.budget.rate", "must be > 0 tokens per second")
        if budget.get("burst", 1) < 1:
            _fail(sources, f"{base}.budget.burst", "must be >= 1")
        pol = region.get("policy", {})
        pct = pol.get("disruption_budget_pct", 10)
        if not 0 <= pct <= 100:
            _fail(sources, f"{base}.policy.disruption_budget_pct", "must be between 0 and 100")
        if pol.get("contract_restore_notices", 1) < 1:
            _fail(sources, f"{base}.policy.contract_restore_notices", "must be >= 1")
        for k in ("idle_ttl_seconds", "drain_seconds", "failure_ttl_seconds", "default_pod_seconds",
                  "no_notice_max_seconds", "contract_restore_hold_seconds"):
            if pol.get(k, 0) < 0:
                _fail(sources, f"{base}.policy.{k}", "must be >= 0")
        if pol.get("spend_cap_per_hour") is not None and pol["spend_cap_per_hour"] < 0:
            _fail(sources, f"{base}.policy.spend_cap_per_hour", "must be >= 0")
        for pname, pool in region.get("pools", {}).items():
            pbase = f"{base}.pools.{pname}"
            if pool.get("kind") not in ("vm", "baremetal"):
                _fail(sources, f"{pbase}.kind", "must be 'vm' or 'baremetal'")
            if pool.get("class", "headroom") not in ("headroom", "reserved-idle"):
                _fail(sources, f"{pbase}.class", "must be 'headroom' or 'reserved-idle'")
            for k in ("vcpu", "ram_mb"):
                if pool.get(k, 0) <= 0:
                    _fail(sources, f"{pbase}.{k}", "must be set and > 0 (the node shape)")
            if pool.get("gpus", 0) < 0:
                _fail(sources, f"{pbase}.gpus", "must be >= 0")
            if pool.get("max_nodes", 1) < 0:
                _fail(sources, f"{pbase}.max_nodes", "must be >= 0")
            if "az" not in pool:
                _fail(sources, f"{pbase}.az", "must be set")


def _region_from_dict(name: str, d: dict, sources: dict) -> RegionConfig:
    pools = {}
    for pname, p in sorted(d.get("pools", {}).items()):
        k8s = p.get("kubernetes", {})
        slurm = p.get("slurm", {})
        pools[pname] = PoolSpec(
            name=pname,
            kind=PoolKind(p["kind"]),
            pool_class=PoolClass(p.get("class", "headroom")),
            az=p["az"],
            shape=Shape(p["vcpu"], p["ram_mb"], p.get("gpus", 0)),
            flavor=p.get("flavor"),
            resource_class=p.get("resource_class"),
            aggregate=p.get("aggregate"),
            image=p.get("image"),
            networks=p.get("networks"),
            max_nodes=p.get("max_nodes", 50),
            kubernetes=KubernetesBinding(
                labels=tuple(sorted((str(a), str(b)) for a, b in k8s.get("labels", {}).items())),
                taints=tuple(str(t) for t in k8s.get("taints", [])),
            ),
            slurm=SlurmBinding(partition=slurm.get("partition"), features=tuple(slurm.get("features", []))),
            boot_seconds=p.get("boot_seconds", 120),
            cleaning_seconds=p.get("cleaning_seconds", 0),
            list_price=p.get("price"),
        )
    return RegionConfig(
        name=name,
        backend=d.get("backend", "sim"),
        pools=pools,
        budget=BudgetConfig(**d.get("budget", {})),
        policy=Policy(**d.get("policy", {})),
        cloud=d.get("cloud"),
        seed=d.get("seed", 0),
        actor=d.get("actor"),
        sections={k: copy.deepcopy(d[k]) for k in ADAPTER_SECTIONS if k in d},
    )
