"""Every effective setting of a merged configuration, with the layer it came from: what ``spotctl config
show`` prints.

It walks the schema, not the files, so a key that no layer sets still shows, with the default the code
applies to it: the typed views' (``Policy``, ``BudgetConfig``, ``POOL_DEFAULTS``, ``REGION_DEFAULTS``) and
the adapters' (``SECTION_DEFAULTS``). A key without a default shows ``None`` (unset: off, or decided at
run time). An adapter table a region does not configure is listed in :attr:`View.absent` with what its
absence means (the simulator stands in, or the outbox keeps the rows queued).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from .config import POOL_DEFAULTS, REGION_DEFAULTS, BudgetConfig, Config, Policy
from .identity import DEFAULT_ROLES
from .config_schema import ADAPTER_SECTIONS, SCHEMA, SECRET_PATTERN, SECTION_DEFAULTS, Key
from .errors import NotFoundError

REDACTED = "***"


@dataclass(frozen=True)
class Setting:
    """One leaf: its dotted key, effective value, and the layer that set it."""

    key: str
    value: object
    source: str  # "default", a config file's path, "env VAR" or "flag"
    line: int | None = None  # the line of the file that set it, when found

    @property
    def where(self) -> str:
        """The source as a person reads it: ``FILE:LINE``, ``env SPOTCTL_REGION``, ``flag``, ``default``."""
        return f"{self.source}:{self.line}" if self.line else self.source


@dataclass(frozen=True)
class View:
    settings: list[Setting]
    absent: dict[str, str] = field(default_factory=dict)  # "regions.demo.kafka" -> what its absence means


def _table_defaults() -> dict[tuple[str, ...], Mapping[str, object]]:
    """The defaults of each table inside a region, by its path there ("*" for a named entry)."""
    out: dict[tuple[str, ...], Mapping[str, object]] = {
        (): REGION_DEFAULTS, ("budget",): asdict(BudgetConfig()), ("policy",): asdict(Policy()),
        ("pools", "*"): POOL_DEFAULTS,
    }
    for name, values in SECTION_DEFAULTS.items():
        parts = tuple(name.split("."))
        out[parts + ("*",) if len(parts) > 1 else parts] = values
    return out


def _derived(path: tuple[str, ...], region: str, table: Mapping[str, Any]) -> object:
    """Defaults made from other values: the Kafka producer's names."""
    if path[:1] != ("kafka",):
        return None
    client_id = table.get("client_id") or f"spotctl-{region}"
    return {"topic": f"spot.lifecycle.{region}", "client_id": client_id,
            "transactional_id": f"{client_id}-relay"}.get(path[-1])


def absence(section: str, backend: str) -> str | None:
    """What it means that a region has no ``[regions.R.<section>]`` (None: its defaults apply)."""
    sim = backend == "sim"
    return {
        "openstack": "not used (backend = sim)" if sim else None,
        "kubernetes": "not set: the simulated Kubernetes" if sim else "not set: no Kubernetes demand",
        "slurm": "not set: the simulated Slurm" if sim else "not set: no Slurm demand",
        "contract": ("not set: the simulated provider" if sim
                     else "not set: no feed; pool prices, every pool under the no-notice policy"),
        "kafka": "not set: lifecycle events stay queued in the state database",
        "audit": "not set: audit records stay queued in the state database",
        "identity": "not set: no login; the actor is the OS user (or the region's `actor`)",
    }[section]


def config_view(cfg: Config, prefix: str | None = None, *, env: Mapping[str, str] | None = None,
                redact: bool = True) -> View:
    """Every leaf of the schema for the top level and each region, in schema order; ``prefix``: only the
    keys under it (``regions.demo.policy``). NotFoundError when nothing matches."""
    env = os.environ if env is None else env
    walk = _Walk(cfg, env, redact)
    for key, spec in SCHEMA.items():
        if isinstance(spec, Key) and key == "state_dir" and key not in cfg.data:
            source = "env XDG_STATE_HOME" if env.get("XDG_STATE_HOME") else "default"
            walk.out.append(Setting(key, str(cfg.state_dir()), source))
        elif isinstance(spec, Key):
            walk.add(key, cfg.data.get(key))
    for rname in cfg.region_names():
        walk.region(rname, cfg.data["regions"][rname])
    out, absent = walk.out, walk.absent
    if prefix:
        want = prefix.rstrip(".")

        def under(key: str) -> bool:
            return key == want or key.startswith(want + ".")

        out = [s for s in out if under(s.key)]
        absent = {k: v for k, v in absent.items() if under(k) or want.startswith(k + ".")}
        if not out:
            raise NotFoundError(f"no configuration key is or starts with {prefix!r}",
                                hint="e.g. default_region, regions.demo.policy, regions.demo.pools.gp-az1")
    return View(out, absent)


class _Walk:
    """Collects the settings of one configuration, region by region, down the schema."""

    def __init__(self, cfg: Config, env: Mapping[str, str], redact: bool):
        self.cfg, self.env, self.redact = cfg, env, redact
        self.defaults = _table_defaults()
        self.out: list[Setting] = []
        self.absent: dict[str, str] = {}
        self.backend = ""

    def add(self, key: str, value: object) -> None:
        source = self.cfg.sources.get(key, "default")
        if self.redact and value and SECRET_PATTERN.search(key.rsplit(".", 1)[-1]):
            value = REDACTED
        self.out.append(Setting(key, value, source, self.cfg.line_of(key)))

    def region(self, name: str, data: Mapping[str, Any]) -> None:
        backend = self.backend = str(data.get("backend", REGION_DEFAULTS["backend"]))
        for section in ADAPTER_SECTIONS:
            meaning = absence(section, backend) if section not in data else None
            if meaning:
                self.absent[f"regions.{name}.{section}"] = meaning
        regions = SCHEMA["regions"]
        assert isinstance(regions, dict)
        self.table(name, regions["*"], data, (), ())

    def table(self, region: str, schema: Mapping[str, Any], data: Mapping[str, Any], path: tuple[str, ...],
              schema_path: tuple[str, ...]) -> None:
        for key, spec in schema.items():
            if key == "*" and isinstance(spec, Key):  # named values: [identity.roles], with its defaults
                roles = path == ("identity", "roles") and f"regions.{region}.identity" not in self.absent
                merged = {**(DEFAULT_ROLES if roles else {}), **data}
                for entry in sorted(merged):
                    if entry in data:
                        self.add(".".join(("regions", region, *path, entry)), data[entry])
                    else:
                        self.out.append(Setting(".".join(("regions", region, *path, entry)), list(merged[entry]),
                                                "default"))
            elif key == "*":
                for entry in sorted(data):
                    self.table(region, spec, data[entry] or {}, path + (entry,), schema_path + ("*",))
            elif isinstance(spec, Key):
                self.leaf(region, data, path + (key,), schema_path + (key,))
            else:
                self.table(region, spec, data.get(key) or {}, path + (key,), schema_path + (key,))

    def leaf(self, region: str, table: Mapping[str, Any], path: tuple[str, ...], schema_path: tuple[str, ...]) -> None:
        dotted = ".".join(("regions", region, *path))
        key = path[-1]
        if key in table:
            self.add(dotted, table[key])
        elif f"regions.{region}.{path[0]}" in self.absent:
            self.add(dotted, None)  # the table is not there: nothing of it applies
        elif path == ("cloud",) and self.backend == "openstack" and self.env.get("OS_CLOUD"):
            self.out.append(Setting(dotted, self.env["OS_CLOUD"], "env OS_CLOUD"))
        else:
            value = self.defaults.get(schema_path[:-1], {}).get(key)
            self.add(dotted, _derived(schema_path, region, table) if value is None else value)
