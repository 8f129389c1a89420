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
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from .config_schema import (ADAPTER_SECTIONS, DEFAULTS, ENV_KEYS, RETENTION_DEFAULTS, SCHEMA, SECRET_PATTERN, Key,
                            hint_for, leaf_problem)
from .errors import ConfigError, NotFoundError
from .models import KubernetesBinding, PoolClass, PoolKind, PoolSpec, Shape, SlurmBinding

SYSTEM_CONFIG = "/etc/spotctl/config.toml"

#: What a region and a pool take for a key they leave out (the typed views below, and ``config show``).
REGION_DEFAULTS: dict[str, Any] = {"backend": "sim", "seed": 0}
POOL_DEFAULTS: dict[str, Any] = {"class": "headroom", "gpus": 0, "max_nodes": 50, "boot_seconds": 120,
                                 "cleaning_seconds": 0}


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
    # Consolidation (spotctl.core.plan_consolidate): move a node's work to a cheaper pool, or retire a node whose
    # work fits on our other nodes, only when the saving is at least this share of the node's price on this rate
    # card and the one before (two ticks). 0: off (the default: consolidation preempts running work, so a region
    # opts in once it has chosen its threshold and hold times).
    consolidation_min_saving_pct: float = 0.0
    consolidation_min_node_age_seconds: int = 3600  # a node younger than this is never consolidated
    consolidation_min_run_seconds: int = 1800  # nor one whose youngest workload has run less (or an unknown time)
    # also retire a busy node whose work fits in free room on our other nodes (off: measured on the simulator it
    # launched more than it saved, see the operator guide)
    consolidation_retire: bool = False


#: Policy keys a recorded plan input lists only when they differ from their default (added after inputs were
#: first recorded: an input recorded before them replays, and keeps its digest, as it was).
POLICY_RECORDED_IF_SET: dict[str, Any] = {
    "consolidation_min_saving_pct": 0.0, "consolidation_min_node_age_seconds": 3600,
    "consolidation_min_run_seconds": 1800, "consolidation_retire": False,
}


def policy_record(policy: Policy) -> dict[str, Any]:
    """The policy as a plan input records it: every key, but those of :data:`POLICY_RECORDED_IF_SET` at their
    default."""
    return {k: v for k, v in policy.__dict__.items()
            if k not in POLICY_RECORDED_IF_SET or v != POLICY_RECORDED_IF_SET[k]}


@dataclass(frozen=True)
class Retention:
    """``[regions.R.retention]``: how long the state database keeps rows that are done with (days; see
    :mod:`spotctl.ops.prune` for what each table keeps whatever its age), the plan history's caps, and the
    time each pass may spend pruning (0: never in a pass; ``spotctl state prune`` still does)."""

    nodes_days: float
    transitions_days: float
    actions_days: float
    notices_days: float
    outbox_days: float
    audit_days: float
    passes_days: float
    plans_max: int
    plans_max_mib: float
    pass_budget_seconds: float

    @classmethod
    def of(cls, table: Mapping[str, Any] | None = None) -> Retention:
        merged: dict[str, Any] = {**RETENTION_DEFAULTS, **(table or {})}
        return cls(**merged)


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
    sections: dict[str, Any] = field(default_factory=dict)  # adapter tables: openstack, slurm, kubernetes, kafka, audit, ...
    retention: Retention = field(default_factory=Retention.of)

    def section(self, name: str) -> dict[str, Any] | None:
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

    data: dict[str, Any]
    sources: dict[str, str]
    files: list[str]
    texts: dict[str, str] = field(default_factory=dict)  # each file's text, to find the line of a key

    @property
    def default_region(self) -> str:
        return str(self.data["default_region"])

    @property
    def output(self) -> str:
        return str(self.data.get("output", "auto"))

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

    def line_of(self, key: str) -> int | None:
        """The line of the file that set ``key`` (or of the table or inline table holding it); None when
        no file set it, or the line cannot be found."""
        text = self.texts.get(self.sources.get(key, ""))
        if text is None:
            return None
        parts = tuple(key.split("."))
        for end in range(len(parts), 0, -1):
            line = _locate(text, parts[: end - 1], parts[end - 1], strict=True)
            if line:
                return line
        return None

    def flat(self, redact: bool = True) -> list[tuple[str, object, str]]:
        rows = []
        for path, value in _flatten(self.data):
            if redact and SECRET_PATTERN.search(path.rsplit(".", 1)[-1]) and value:
                value = "***"
            rows.append((path, value, self.sources.get(path, "default")))
        return rows


# --- loading ----------------------------------------------------------------


def user_config_path(env: Mapping[str, str] | None = None, host: bool = True) -> Path | None:
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
    env: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
    system_path: str | os.PathLike[str] | None = None,
    user_path: str | os.PathLike[str] | None = None,
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

    data: dict[str, Any] = {}
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
            raise ConfigError(f"{origin}: {key!r} {problem}", hint=hint_for(spec) if isinstance(spec, Key) else None,
                              details={"key": key, "source": origin})
        _merge(data, sources, {key: value}, origin)
    _check_values(data, sources, texts)
    return Config(data=data, sources=sources, files=files, texts=texts)


def _read_file(path: Path) -> tuple[dict[str, Any], str]:
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


def _normalize(data: dict[str, Any]) -> None:
    for key in ("output", "log_level"):
        if isinstance(data.get(key), str):
            data[key] = data[key].lower()


def _validate(data: dict[str, Any], schema: dict[str, Any], where: tuple[str, ...], path: Path, text: str) -> None:
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
            raise ConfigError(f"{at}: {dotted!r} {problem}", hint=hint_for(spec), details=details)



_HEADER = re.compile(r"^\s*\[\[?\s*([^\]]+?)\s*\]\]?\s*(#.*)?$")


def _split_key(s: str) -> tuple[str, ...]:
    return tuple(p.strip().strip('"').strip("'") for p in s.split("."))


def _locate(text: str, table: tuple[str, ...], key: str, strict: bool = False) -> int | None:
    """Best-effort line number of ``key`` inside ``table`` in TOML text; ``strict``: only a line that sets
    it there (or in a parent table, as a dotted key), else None — never the first line naming the word."""
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
    if fallback is None and not strict:
        for n, line in enumerate(text.splitlines(), 1):
            if re.search(r"\b" + re.escape(key) + r"\b", line):
                return n
    return fallback


def _merge(dst: dict[str, Any], sources: dict[str, Any], src: dict[str, Any], origin: str, prefix: str = "") -> None:
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


def _flatten(d: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key in sorted(d):
        value = d[key]
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value and not _is_leaf_table(path):
            yield from _flatten(value, path + ".")
        else:
            yield path, value


def _fail(sources: dict[str, Any], key: str, message: str, hint: str | None = None, texts: dict[str, Any] | None = None) -> NoReturn:
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


def _check_values(data: dict[str, Any], sources: dict[str, Any], texts: dict[str, Any] | None = None) -> None:
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


def _region_from_dict(name: str, d: dict[str, Any], sources: dict[str, Any]) -> RegionConfig:
    pools = {}
    for pname, p in sorted(d.get("pools", {}).items()):
        k8s = p.get("kubernetes", {})
        slurm = p.get("slurm", {})
        pools[pname] = PoolSpec(
            name=pname,
            kind=PoolKind(p["kind"]),
            pool_class=PoolClass(p.get("class", POOL_DEFAULTS["class"])),
            az=p["az"],
            shape=Shape(p["vcpu"], p["ram_mb"], p.get("gpus", POOL_DEFAULTS["gpus"])),
            flavor=p.get("flavor"),
            resource_class=p.get("resource_class"),
            aggregate=p.get("aggregate"),
            image=p.get("image"),
            networks=p.get("networks"),
            max_nodes=p.get("max_nodes", POOL_DEFAULTS["max_nodes"]),
            kubernetes=KubernetesBinding(
                labels=tuple(sorted((str(a), str(b)) for a, b in k8s.get("labels", {}).items())),
                taints=tuple(str(t) for t in k8s.get("taints", [])),
            ),
            slurm=SlurmBinding(partition=slurm.get("partition"), features=tuple(slurm.get("features", []))),
            boot_seconds=p.get("boot_seconds", POOL_DEFAULTS["boot_seconds"]),
            cleaning_seconds=p.get("cleaning_seconds", POOL_DEFAULTS["cleaning_seconds"]),
            list_price=p.get("price"),
            on_demand_price=p.get("on_demand_price"),
        )
    return RegionConfig(
        name=name,
        backend=d.get("backend", REGION_DEFAULTS["backend"]),
        pools=pools,
        budget=BudgetConfig(**d.get("budget", {})),
        policy=Policy(**d.get("policy", {})),
        cloud=d.get("cloud"),
        seed=d.get("seed", REGION_DEFAULTS["seed"]),
        actor=d.get("actor"),
        sections={k: copy.deepcopy(d[k]) for k in ADAPTER_SECTIONS if k in d},
        retention=Retention.of(d.get("retention")),
    )
