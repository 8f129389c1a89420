"""What ``spotctl config show`` says a key left out is worth is what the code uses: the defaults in
``spotctl.core.config_view`` (from ``SECTION_DEFAULTS``, the typed views and the derived names) against the
adapters built from the same region."""

from __future__ import annotations

from dataclasses import fields

from spotctl.core.config import load_config
from spotctl.core.config_view import config_view

REGION = """\
[regions.x]
backend = "openstack"
[regions.x.pools.p]
kind = "vm"
az = "a"
vcpu = 1
ram_mb = 1024
[regions.x.openstack.pools.p]
traits = ["CUSTOM_SPOT"]
[regions.x.kubernetes]
server = "https://k8s:6443"
[regions.x.slurm]
url = "http://slurm:6820"
user = "u"
token = "t"
[regions.x.kafka]
bootstrap_servers = "kafka:9092"
[regions.x.audit]
url = "http://audit:1"
token = "t"
[regions.x.contract]
url = "http://contract:1"
"""


def _setup(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(REGION)
    cfg = load_config(env={"SPOTCTL_CONFIG": str(path)})
    shown = {s.key: s.value for s in config_view(cfg, "regions.x", env={}).settings}
    return cfg.region("x"), (lambda key: shown[f"regions.x.{key}"])


def test_pool_region_policy_and_budget_defaults_are_the_typed_views(tmp_path):
    region, shown = _setup(tmp_path)
    pool = region.pools["p"]
    assert (shown("pools.p.class"), shown("pools.p.max_nodes"), shown("pools.p.gpus")) == (
        pool.pool_class.value, pool.max_nodes, pool.shape.gpus)
    assert (shown("pools.p.boot_seconds"), shown("pools.p.cleaning_seconds")) == (pool.boot_seconds,
                                                                                   pool.cleaning_seconds)
    assert shown("seed") == region.seed and shown("backend") == region.backend
    for f in fields(region.policy):
        assert shown(f"policy.{f.name}") == getattr(region.policy, f.name), f.name
    assert (shown("budget.rate"), shown("budget.burst")) == (region.budget.rate, region.budget.burst)


def test_openstack_and_kubernetes_defaults_are_the_adapters(tmp_path):
    from spotctl.adapters.kubernetes import SERVICEACCOUNT_DIR, Settings
    from spotctl.adapters.openstack import Options, PoolOptions

    _, shown = _setup(tmp_path)
    for f in fields(Options):
        if f.name not in ("pools", "image", "key_name", "user_data"):
            assert shown(f"openstack.{f.name}") == f.default, f.name
    assert shown("openstack.pools.p.via") == PoolOptions().via
    for f in fields(Settings):
        if f.name != "default_pod_seconds":  # from the region's policy, not a [kubernetes] key
            assert shown(f"kubernetes.{f.name}") == f.default, f.name
    assert shown("kubernetes.serviceaccount_dir") == SERVICEACCOUNT_DIR
    assert shown("kubernetes.in_cluster") is False and shown("kubernetes.insecure_skip_tls_verify") is False


def test_slurm_kafka_audit_and_contract_defaults_are_the_adapters(tmp_path):
    from spotctl.adapters.audit_http import AuditClient
    from spotctl.adapters.contract_http import ContractFeed
    from spotctl.adapters.kafka import KafkaRelay
    from spotctl.adapters.slurm import SlurmScheduler

    region, shown = _setup(tmp_path)
    slurm = SlurmScheduler.from_config(region)
    assert (shown("slurm.timeout_seconds"), shown("slurm.verify_tls"), shown("slurm.scontrol")) == (
        slurm.timeout, slurm.verify, slurm.scontrol_configured)
    assert (shown("slurm.node_prefix"), shown("slurm.default_time_limit_seconds"), shown("slurm.drain_via")) == (
        slurm.node_prefix, slurm.default_time_limit, slurm.drain_via)
    assert slurm.slurm_name("spot-x-1") == shown("slurm.node_name").format(node="spot-x-1")
    kafka = KafkaRelay.from_config(region)
    for key in ("topic", "client_id", "transactional_id", "max_wait_seconds", "batch_size", "transactions"):
        assert shown(f"kafka.{key}") == getattr(kafka, key), key
    audit = AuditClient.from_config(region)
    assert (shown("audit.timeout_seconds"), shown("audit.batch_size")) == (audit.timeout_seconds, audit.batch_size)
    assert shown("contract.timeout_seconds") == ContractFeed.from_config(region).timeout
    assert shown("slurm.token") == shown("audit.token") == "***"


def test_cloud_comes_from_os_cloud_on_a_real_cloud_only(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text(REGION)
    cfg = load_config(env={"SPOTCTL_CONFIG": str(path)})
    rows = {s.key: s for s in config_view(cfg, env={"OS_CLOUD": "mine"}).settings}
    assert (rows["regions.x.cloud"].value, rows["regions.x.cloud"].where) == ("mine", "env OS_CLOUD")
    assert (rows["regions.demo.cloud"].value, rows["regions.demo.cloud"].where) == (None, "default")
