"""``spotctl config show``: every setting in effect, defaults included, each with its source.

Golden files (``tests/cli/golden/config-show-*.txt``, ``SPOTCTL_UPDATE_GOLDEN=1`` rewrites them) pin the
table for the demo region's policy and for a real region's file.
"""

from __future__ import annotations

import re

import pytest

from spotctl.core.config import SCHEMA, Key

from .goldens import assert_golden

TABLE_ENV = {"COLUMNS": "120", "NO_COLOR": "1"}

#: A real region that sets every integration table, with an [openstack.pools.P] entry.
LAB = """\
default_region = "lab"

[regions.lab]
backend = "openstack"
cloud = "spot-lab"

[regions.lab.policy]
max_launches_per_pass = 10

[regions.lab.openstack]
image = "spot-image"
user_data = \"\"\"#cloud-config
# node {name} of {pool}
\"\"\"

[regions.lab.openstack.pools.metal]
via = "ironic"

[regions.lab.pools.general]
kind = "vm"
az = "az-general"
aggregate = "agg-general"
flavor = "spot.medium"
vcpu = 2
ram_mb = 2048
price = 0.05
slurm = { partition = "spot", features = ["general"] }

[regions.lab.pools.metal]
kind = "baremetal"
az = "nova"
resource_class = "baremetal-spot"
vcpu = 8
ram_mb = 16384
kubernetes.labels = { "spot.pool" = "metal" }

[regions.lab.slurm]
url = "http://slurm-ctl:6820"
user = "spotctl"
token = "s3cret-jwt"

[regions.lab.kubernetes]
server = "https://k8s:6443"
token_file = "/etc/spotctl/k8s.token"

[regions.lab.contract]
url = "https://contract.example"
token_file = "/etc/spotctl/contract.token"

[regions.lab.kafka]
bootstrap_servers = "kafka1:9092"
sasl_plain_password = "hunter2"

[regions.lab.audit]
url = "https://audit.example"
token = "audit-s3cret"

[regions.lab.identity]
server_url = "https://sso.example"
realm = "spot"
service_secret_file = "/etc/spotctl/reconciler.secret"

[regions.lab.identity.roles]
night-shift = ["drain", "status"]
"""


def leaves(schema: dict, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, spec in schema.items():
        out += [path + (key,)] if isinstance(spec, Key) else leaves(spec, path + (key,))
    return out


def matches(pattern: tuple[str, ...], key: str) -> bool:
    parts = key.split(".")
    return len(parts) == len(pattern) and all(p == "*" or p == k for p, k in zip(pattern, parts))


@pytest.fixture
def lab(tmp_path):
    path = tmp_path / "lab.toml"
    path.write_text(LAB)
    return path


def show(cli, *args, env=None):
    r = cli("-o", "json", "config", "show", *args, env=env)
    assert r.code == 0, r.stderr
    return r.json["data"]


def test_every_schema_leaf_shows_for_the_demo_region_with_a_source(cli):
    data = show(cli)
    rows = data["values"]
    assert all(set(row) == {"key", "value", "source", "line"} and row["source"] for row in rows)
    keys = [row["key"] for row in rows]
    assert len(keys) == len(set(keys))
    # the demo region names no [openstack.pools.P] entry, nor [identity.roles] role: those keys cannot show
    missing = [".".join(p) for p in leaves(SCHEMA) if ".".join(p).find("openstack.pools") < 0
               and ".".join(p).find("identity.roles") < 0
               and not any(matches(p, k) for k in keys)]
    assert not missing
    by_key = {row["key"]: row for row in rows}
    for key, value in {"regions.demo.policy.advisory_prespin_seconds": 300,
                       "regions.demo.policy.calendar_advisory_seconds": 3600,
                       "regions.demo.policy.drill_max_pool_pct": 25.0,
                       "regions.demo.policy.max_launches_per_pass": 50}.items():
        assert by_key[key] == {"key": key, "value": value, "source": "default", "line": None}
    assert set(data["not_configured"]) == {f"regions.demo.{s}" for s in
                                           ("openstack", "kubernetes", "slurm", "contract", "kafka", "audit", "identity")}
    assert by_key["regions.demo.kafka.batch_size"]["value"] is None  # no [kafka]: nothing of it applies


def test_every_schema_leaf_shows_for_a_real_region_file(cli, lab):
    data = show(cli, "--config", str(lab))
    rows = {row["key"]: row for row in data["values"]}
    region_keys = [k for k in rows if k.startswith("regions.lab.")]
    region_leaves = [p for p in leaves(SCHEMA) if p[:1] == ("regions",)]
    missing = [".".join(p) for p in region_leaves if not any(matches(("regions", "lab", *p[2:]), k) for k in region_keys)]
    assert not missing
    assert not [t for t in data["not_configured"] if t.startswith("regions.lab.")]
    # what the file sets: its path and the line; the rest: default
    text = lab.read_text().splitlines()
    for key in ("regions.lab.policy.max_launches_per_pass", "regions.lab.openstack.pools.metal.via",
                "regions.lab.pools.general.slurm.partition", "regions.lab.pools.metal.kubernetes.labels",
                "regions.lab.kafka.bootstrap_servers"):
        row = rows[key]
        assert row["source"] == str(lab) and row["line"], key
        word = "slurm" if ".slurm." in key else key.split(".")[-1].replace("labels", "kubernetes.labels")
        assert word in text[row["line"] - 1], (key, text[row["line"] - 1])
    assert rows["regions.lab.openstack.networks"] == {"key": "regions.lab.openstack.networks", "value": "none",
                                                      "source": "default", "line": None}
    assert rows["regions.lab.kafka.topic"]["value"] == "spot.lifecycle.lab"
    assert rows["regions.lab.kafka.transactional_id"]["value"] == "spotctl-lab-relay"
    assert rows["regions.lab.pools.general.max_nodes"]["value"] == 50
    # secrets redacted, wherever they are
    for key in ("regions.lab.slurm.token", "regions.lab.kafka.sasl_plain_password", "regions.lab.audit.token"):
        assert rows[key]["value"] == "***"
    assert "s3cret" not in str(data) and "hunter2" not in str(data)


def test_sources_tell_the_environment_from_a_flag(cli):
    by_env = {r["key"]: r for r in show(cli, env={"SPOTCTL_REGION": "demo"})["values"]}
    assert by_env["default_region"]["source"] == "env SPOTCTL_REGION"
    both = {r["key"]: r for r in show(cli, "--region", "demo", env={"SPOTCTL_REGION": "nope"})["values"]}
    assert both["default_region"] == {"key": "default_region", "value": "demo", "source": "flag", "line": None}
    assert by_env["output"]["source"] == "flag"  # -o json
    r = cli("-o", "json", "status", env={"SPOTCTL_REGION": "nope"})  # the region still comes from it
    assert r.code == 5 and "unknown region 'nope'" in r.json["errors"][0]["message"]


def test_a_key_narrows_the_listing(cli):
    rows = show(cli, "regions.demo.policy")["values"]
    assert rows and all(r["key"].startswith("regions.demo.policy.") for r in rows)
    assert [r["key"] for r in show(cli, "default_region")["values"]] == ["default_region"]
    r = cli("-o", "json", "config", "show", "regions.demo.polcy")
    assert r.code == 5 and "regions.demo.polcy" in r.json["errors"][0]["message"]


def _table(cli, *args) -> str:
    r = cli("-o", "table", "--state-dir", "/var/lib/spotctl", "config", "show", *args, env=TABLE_ENV)
    assert r.code == 0, r.stderr
    assert not re.search(r"\bNone\b|\bTrue\b|\bFalse\b|\[|\{'", r.stdout), "no Python repr in a table cell"
    return r.stdout


def test_table_of_the_demo_policy(cli):
    assert_golden("config-show-demo-policy", _table(cli, "regions.demo.policy"))


def test_table_of_a_real_region(cli, lab, monkeypatch):
    monkeypatch.chdir(lab.parent)  # the source column names lab.toml, wherever the test runs
    assert_golden("config-show-lab-kafka", _table(cli, "--config", "lab.toml", "regions.lab.kafka"))
    text = _table(cli, "--config", "lab.toml", "regions.lab")
    assert "***" in text and "s3cret" not in text and "hunter2" not in text and "not set" not in text
    assert "lab.toml:8 " in text  # max_launches_per_pass


def test_table_says_what_stands_in_for_a_table_left_out(cli):
    text = _table(cli, "regions.demo")
    assert "regions.demo.kafka.*" in text and "stay queued" in text
    assert "regions.demo.kafka.batch_size" not in text
