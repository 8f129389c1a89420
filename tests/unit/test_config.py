"""Config: precedence, sources, and clear errors naming file, line and key."""

import pytest

from spotctl.core.config import load_config
from spotctl.core.errors import ConfigError, ExitCode, NotFoundError

GOOD = """
default_region = "lab"

[regions.lab]
backend = "sim"
seed = 3

[regions.lab.budget]
rate = 2.0
burst = 40

[regions.lab.pools.small]
kind = "vm"
az = "az1"
vcpu = 4
ram_mb = 8192
slurm = { partition = "spot" }
"""


def test_defaults_give_the_demo_region():
    cfg = load_config(env={})
    r = cfg.region()
    assert r.name == "demo" and r.backend == "sim"
    assert len(r.pools) >= 6
    assert {p.az for p in r.pools.values()} >= {"az1", "az2"}


def test_precedence_system_user_env_flags(tmp_path):
    system = tmp_path / "system.toml"
    system.write_text('default_region = "demo"\noutput = "yaml"\n')
    user = tmp_path / "user.toml"
    user.write_text(GOOD)
    cfg = load_config(env={"SPOTCTL_CONFIG": str(user), "SPOTCTL_SYSTEM_CONFIG": str(system)})
    src = {k: s for k, _, s in cfg.flat()}
    assert cfg.default_region == "lab" and src["default_region"] == str(user)
    assert cfg.output == "yaml" and src["output"] == str(system)
    assert cfg.region().budget.burst == 40
    cfg = load_config(env={"SPOTCTL_CONFIG": str(user), "SPOTCTL_REGION": "demo"})
    assert cfg.default_region == "demo"
    assert {k: s for k, _, s in cfg.flat()}["default_region"] == "env SPOTCTL_REGION"
    cfg = load_config(env={"SPOTCTL_CONFIG": str(user), "SPOTCTL_REGION": "demo"}, flags={"default_region": "lab"})
    assert cfg.default_region == "lab"
    assert {k: s for k, _, s in cfg.flat()}["default_region"] == "flag"


def test_unknown_key_names_file_line_and_key(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text(GOOD.replace("burst = 40", "burst = 40\nburts = 3"))
    with pytest.raises(ConfigError) as e:
        load_config(env={"SPOTCTL_CONFIG": str(f)})
    assert e.value.exit_code == ExitCode.CONFIG
    assert f"{f}:11" in e.value.message and "regions.lab.budget.burts" in e.value.message
    assert "burst" in e.value.hint


def test_malformed_toml_and_wrong_types(tmp_path):
    f = tmp_path / "c.toml"
    f.write_text("[regions.lab\nbackend = 1\n")
    with pytest.raises(ConfigError) as e:
        load_config(env={"SPOTCTL_CONFIG": str(f)})
    assert str(f) in e.value.message and "line 1" in e.value.message
    f.write_text(GOOD.replace("vcpu = 4", 'vcpu = "four"'))
    with pytest.raises(ConfigError) as e:
        load_config(env={"SPOTCTL_CONFIG": str(f)})
    assert "regions.lab.pools.small.vcpu" in e.value.message and ":15" in e.value.message
    f.write_text(GOOD.replace('kind = "vm"', 'kind = "container"'))
    with pytest.raises(ConfigError) as e:
        load_config(env={"SPOTCTL_CONFIG": str(f)})
    assert "kind" in e.value.message


def test_missing_config_file_and_unknown_region(tmp_path):
    with pytest.raises(ConfigError):
        load_config(env={"SPOTCTL_CONFIG": str(tmp_path / "nope.toml")})
    with pytest.raises(NotFoundError):
        load_config(env={}).region("atlantis")
    with pytest.raises(NotFoundError):
        load_config(env={}).region().pool("no-such-pool")


def test_an_explicit_environment_never_reads_this_hosts_files(tmp_path, monkeypatch):
    """load_config(env={...}) takes its layers from that environment only: the host's /etc and ~/.config
    stay out of tests and embedding code; the entry points ask for them (host=True)."""
    home = tmp_path / "home"
    (home / ".config" / "spotctl").mkdir(parents=True)
    (home / ".config" / "spotctl" / "config.toml").write_text('default_region = "from-home"\n'
                                                            '[regions.from-home]\nbackend = "sim"\n')
    system = tmp_path / "etc.toml"
    system.write_text('output = "yaml"\n')
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setattr("spotctl.core.config.SYSTEM_CONFIG", str(system))
    hermetic = load_config(env={})
    assert hermetic.files == [] and hermetic.default_region == "demo" and hermetic.output == "auto"
    on_host = load_config(env={}, host=True)
    assert on_host.files == [str(system), str(home / ".config" / "spotctl" / "config.toml")]
    assert on_host.default_region == "from-home" and on_host.output == "yaml"
    # an environment that names its HOME is that environment's, not this process's
    assert load_config(env={"HOME": str(home)}).default_region == "from-home"


@pytest.mark.parametrize("table,key", [("openstack.pools.metal", "deploy_seconds"),
                                       ("openstack", "schedule_wait_seconds")])
def test_a_key_that_does_nothing_is_refused_not_silently_ignored(tmp_path, table, key):
    """deploy_seconds was parsed and never used; schedule_wait_seconds bounded a wait that no pass makes any
    more (create returns at once). Both are gone, and a config that sets one says so."""
    f = tmp_path / "c.toml"
    f.write_text(f'[regions.r]\nbackend = "sim"\n[regions.r.{table}]\n{key} = 20\n')
    with pytest.raises(ConfigError, match=key):
        load_config(env={"SPOTCTL_CONFIG": str(f)})


def test_host_placement_is_checked_where_it_enters(tmp_path):
    """``host_placement`` (issue 18): off, hint or target, in the region's and a pool's openstack table."""
    f = tmp_path / "c.toml"
    f.write_text(GOOD + '\n[regions.lab.openstack]\nhost_placement = "target"\n'
                 '[regions.lab.openstack.pools.small]\nhost_placement = "hint"\n')
    region = load_config(env={"SPOTCTL_CONFIG": str(f)}).region("lab")
    from spotctl.adapters.openstack.options import _options

    opts = _options(region)
    assert (opts.host_placement, opts.placement_of("small")) == ("target", "hint")
    for bad in ('[regions.lab.openstack]\nhost_placement = "force"\n',
                '[regions.lab.openstack.pools.small]\nhost_placement = true\n'):
        f.write_text(GOOD + "\n" + bad)
        with pytest.raises(ConfigError) as e:
            load_config(env={"SPOTCTL_CONFIG": str(f)})
        assert "host_placement" in e.value.message
