"""Configuration: one loader, one precedence.

defaults < ``/etc/spotctl/config.toml`` < user file (``$SPOTCTL_CONFIG`` or
``$XDG_CONFIG_HOME/spotctl/config.toml``) < ``SPOTCTL_*`` environment < flags.

Every leaf value remembers where it came from, so ``spotctl config show`` can
print it. Unknown keys and wrong types are errors naming the file, line and key.
"""

from __future__ import annotations

import copy
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from .demo import DEMO_REGION, DEMO_REGION_NAME
from .errors import ConfigError, NotFoundError
from .models import KubernetesBinding, PoolClass, PoolKind, PoolSpec, Shape, SlurmBinding

SYSTEM_CONFIG = "/etc/spotctl/config.toml"

# --- schema -----------------------------------------------------------------
# A schema maps key -> Key (a leaf: its type and the values it may take), or key -> nested schema
# (dict), or "*" -> schema for tables of named entries (regions, pools). Every value is checked where
# it enters: a file's values at FILE:LINE as the file is read, environment and flags as they are merged.

DAY = 86_400
YEAR = 366 * DAY


@dataclass(frozen=True)
class Key:
    """A leaf of the schema: the type, and the range or choices a value must fall in."""

    type: type | tuple[type, ...]
    lo: float | None = None  # inclusive minimum
    hi: float | None = None  # inclusive maximum
    gt: float | None = None  # exclusive minimum
    choices: tuple[str, ...] | None = None
    items: type | None = None  # a list's items, or a table's values (labels)
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
}
_URL = _str(check="url")
_TOKEN = _str(check="token")
_REGION_SCHEMA = {
    "backend": _str("sim", "openstack"), "cloud": _S, "seed": _int(0, (1 << 63) - 1), "actor": _S,
    "budget": {"rate": _num(hi=1e6, gt=0), "burst": _int(1, 1_000_000)},
    "policy": _POLICY_SCHEMA,
    "pools": {"*": _POOL_SCHEMA},
    "openstack": {
        "image": _S, "networks": _S, "key_name": _S, "user_data": _S, "wait_active_seconds": _secs(DAY),
        "delete_verify_seconds": _secs(DAY), "timeout_seconds": _timeout(), "blazar": _B,
        "pools": {"*": {"via": _str("nova", "ironic"), "traits": _STRS, "image": _S, "networks": _S}},
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
              "batch_size": _int(1, 1000), "ca_file": _S},
    "contract": {"url": _URL, "token": _TOKEN, "token_file": _S, "timeout_seconds": _timeout()},
    # Integration sections: each real adapter reads its own table (see ADAPTER_SECTIONS).
    # A section present replaces that part of the simulator for this region.
}
ADAPTER_SECTIONS = ("openstack", "slurm", "kubernetes", "contract", "kafka", "audit")
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
    # A pass observes every source (cloud, feed, schedulers) concurrently within this many seconds; a source
    # that misses it is degraded for that pass (exit 7), not waited for. Below the timer period (30 s).
    observe_deadline_seconds: float = 20.0


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
    texts: dict[str, str] = {}
    for path in (system, user):
        if path is not None and path.exists():
            if not path.is_file():
                raise ConfigError(f"config file {path} is not a regular file (a directory?)",
                                  hint="name a TOML file, e.g. ~/.config/spotctl/config.toml",
                                  details={"file": str(path)})
            layer, texts[str(path)] = _read_file(path)
            # A file that defines its own regions does not hide the demo region,
            # but a file that sets default_region decides which one is used.
            _merge(data, sources, layer, str(path))
            files.append(str(path))
    layers = [(f"env {var}", key, env[var]) for var, key in ENV_KEYS.items() if env.get(var)]
    layers += [("flag", key, value) for key, value in (flags or {}).items() if value is not None]
    for origin, key, value in layers:
        if key in ("output", "log_level") and isinstance(value, str):
            value = value.lower()  # -o JSON and SPOTCTL_OUTPUT=JSON alike
        spec = SCHEMA.get(key)
        problem = leaf_problem(spec, value) if isinstance(spec, Key) else None
        if problem:
            raise ConfigError(f"{origin}: {key!r} {problem}", hint=_hint(spec) if isinstance(spec, Key) else None,
                              details={"key": key, "source": origin})
        _merge(data, sources, {key: value}, origin)
    _check_values(data, sources, texts)
    return Config(data=data, sources=sources, files=files)


def _read_file(path: Path) -> tuple[dict, str]:
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
    _normalize(data)
    _validate(data, SCHEMA, (), path, text)
    return data, text


def _normalize(data: dict) -> None:
    for key in ("output", "log_level"):
        if isinstance(data.get(key), str):
            data[key] = data[key].lower()


def _validate(data: dict, schema: dict, where: tuple[str, ...], path: Path, text: str) -> None:
    for key, value in data.items():
        spec = schema.get(key, schema.get("*"))
        keypath = where + (key,)
        dotted = ".".join(keypath)
        line = _locate(text, where, key)
        at = f"{path}:{line}" if line else str(path)
        details = {"file": str(path), "line": line, "key": dotted}
        if spec is None:
            allowed = ", ".join(sorted(k for k in schema if k != "*"))
            raise ConfigError(f"{at}: unknown key {dotted!r}", hint=f"allowed here: {allowed}", details=details)
        if isinstance(spec, dict):
            if not isinstance(value, dict):
                raise ConfigError(f"{at}: {dotted!r} must be a table", details=details)
            _validate(value, spec, keypath, path, text)
            continue
        problem = leaf_problem(spec, value)
        if problem:
            raise ConfigError(f"{at}: {dotted!r} {problem}", hint=_hint(spec), details=details)


def _show(value: object, limit: int = 60) -> str:
    """A value as echoed in an error: its repr, cut to ``limit`` characters."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 1] + "…"


def _hint(spec: Key) -> str | None:
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


def _fail(sources: dict, key: str, message: str, hint: str | None = None, texts: dict | None = None):
    origin = sources.get(key, "default")
    at, line = origin, None
    if texts and origin in texts:
        parts = tuple(key.split("."))
        line = _locate(texts[origin], parts[:-1], parts[-1])
        at = f"{origin}:{line}" if line else origin
    raise ConfigError(f"{at}: {key!r} {message}", hint=hint,
                      details={"key": key, "source": origin, "line": line})


_POOL_REQUIRED = {"kind": "'vm' or 'baremetal'", "az": "the availability zone",
                  "vcpu": "the node shape", "ram_mb": "the node shape"}


def _check_values(data: dict, sources: dict, texts: dict | None = None) -> None:
    """What a single value cannot show: required keys, and names that must refer to things that exist."""
    for rname, region in data.get("regions", {}).items():
        base = f"regions.{rname}"
        pools = region.get("pools", {})
        for pname, pool in pools.items():
            pbase = f"{base}.pools.{pname}"
            for k, what in _POOL_REQUIRED.items():
                if k not in pool:
                    origin = next((sources[q] for q in sources if q.startswith(pbase + ".")), "default")
                    sources.setdefault(pbase, origin)
                    _fail(sources, pbase, f"needs {k!r} ({what})", texts=texts)
        for section in ("openstack",):
            for pname in region.get(section, {}).get("pools", {}):
                if pname not in pools:
                    key = f"{base}.{section}.pools.{pname}"
                    origin = next((sources[q] for q in sources if q.startswith(key + ".")), "default")
                    sources.setdefault(key, origin)
                    known = ", ".join(sorted(pools)) or "none"
                    _fail(sources, key, f"names a pool that region {rname!r} does not define",
                          hint=f"pools of {rname}: {known}", texts=texts)


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
