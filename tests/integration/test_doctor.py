"""``spotctl doctor`` against the real test services: the full lab region passes; then each service is
taken away in turn (Kafka, Slurm, the Kubernetes API, the OIDC provider, OpenStack's Placement API, the
audit service, the contract feed), and the check for that service fails with its hint while every other
check still passes; the service is brought back in the fixture, whatever the test's outcome, so that the
suite leaves the services as it found them.

The lab region is `scripts/testenv/all env`'s (OpenStack, Slurm, Kubernetes), with the tables the lab
config does not carry added here: [kafka] on the test broker (a topic of its own), [audit] on the
reference receiver (`spotctl audit serve`, run here), [contract] on the simulator's contract API
(`spotctl sim serve`, run here) and [identity] on the OIDC peer with the service account's secret.
Every doctor run is `spotctl` as a user runs it, in its own process.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.request
import uuid
from pathlib import Path

import pytest

from . import conftest as harness
from .conftest import ROOT, unavailable, wait_until
from .record_support import BIN, Receiver, free_port

TESTENV = ROOT / "scripts" / "testenv"


def script(name: str, *args: str, timeout: float = 300) -> None:
    """scripts/testenv/NAME ARGS, failing the test with its output when it fails."""
    p = subprocess.run([str(TESTENV / name), *args], capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"scripts/testenv/{name} {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"


class ContractServer:
    """`spotctl sim serve` (the demo region's contract API) on a fixed loopback port, so it can come back."""

    def __init__(self, home: Path, port: int):
        self.home, self.port = home, port
        self.url = f"http://127.0.0.1:{port}"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
        env.update(XDG_CONFIG_HOME=str(self.home / "config"), XDG_STATE_HOME=str(self.home / "state"),
                   SPOTCTL_SYSTEM_CONFIG=str(self.home / "none.toml"), NO_COLOR="1")
        log = (self.home / "sim-serve.log").open("a")
        self.proc = subprocess.Popen([str(BIN / "spotctl"), "sim", "serve", "--port", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=log, env=env)

        def answers() -> bool:
            assert self.proc is not None and self.proc.poll() is None, (self.home / "sim-serve.log").read_text()
            try:
                urllib.request.urlopen(self.url + "/v1/rate-card", timeout=1).read()
                return True
            except OSError:
                return False

        wait_until(answers, "the contract API to answer", 30)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Lab:
    def __init__(self, tmp: Path, env: dict[str, str]):
        self.tmp, self.env = tmp, env
        self.state = tmp / "state"
        self.cfg = tmp / "lab.toml"

    def doctor(self, **extra_env: str) -> tuple[int, dict[str, list[dict]], dict, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SPOTCTL_")}
        env.update({k: v for k, v in self.env.items() if k.startswith("OS_")}, **extra_env)
        env.update(XDG_CACHE_HOME=str(self.tmp / "cache"), SPOTCTL_SYSTEM_CONFIG=str(self.tmp / "none.toml"),
                   NO_COLOR="1")
        p = subprocess.run([str(BIN / "spotctl"), "--config", str(self.cfg), "--state-dir", str(self.state),
                            "-r", "lab", "-o", "json", "doctor"], capture_output=True, text=True, timeout=120, env=env)
        envelope = json.loads(p.stdout)
        by: dict[str, list[dict]] = {}
        for c in envelope["data"]["checks"]:
            by.setdefault(c["check"], []).append(c)
        return p.returncode, by, envelope, p.stderr


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    env = harness.testenv("all")
    if env.get("SPOTCTL_REGION") != "lab" or "OS_CLOUD" not in env:
        unavailable("openstack", "the lab region of `scripts/testenv/all env` needs the OpenStack test cloud")
    kafka = harness.testenv("kafka")["KAFKA_BOOTSTRAP"]
    oidc = harness.testenv("oidc")
    k8s_answers_access_reviews(harness.testenv("k8s"))
    harness.testenv("slurm")
    tmp = tmp_path_factory.mktemp("doctor")
    lab = Lab(tmp, env)
    receiver = Receiver(tmp)
    contract = ContractServer(tmp, free_port())
    contract.start()
    topic = f"spot.doctor.{uuid.uuid4().hex[:8]}"
    lab.topic = lambda: create_topic(kafka, topic)  # again after the broker restarts: it keeps no topics
    lab.topic()
    secret = tmp / "spot-reconciler.secret"
    secret.write_text("reconciler-secret\n")
    (tmp / "cache" / "spotctl" / "identity").mkdir(parents=True, mode=0o700)
    base = Path(env["SPOTCTL_CONFIG"]).read_text()
    lab.cfg.write_text(base + f"""
[regions.lab.kafka]
bootstrap_servers = "{kafka}"
topic = "{topic}"
max_wait_seconds = 3

[regions.lab.audit]
url = "{receiver.url}"
token_file = "{receiver.token_file}"
timeout_seconds = 3

[regions.lab.contract]
url = "{contract.url}"
timeout_seconds = 3

[regions.lab.identity]
server_url = "{oidc['SPOTCTL_OIDC_URL']}"
realm = "{oidc.get('SPOTCTL_OIDC_REALM', 'spot')}"
required = false
service_client_id = "spot-reconciler"
service_secret_file = "{secret}"
timeout_seconds = 3
""")
    from spotctl.state.store import Store

    Store.open(lab.state / "lab.db", "lab").close()  # a state database as the first pass leaves it
    lab.receiver, lab.contract = receiver, contract
    yield lab
    lab.receiver.stop()  # the one running now (the audit test starts it again)
    lab.contract.stop()


def create_topic(bootstrap: str, topic: str) -> None:
    from kafka import KafkaAdminClient
    from kafka.admin import NewTopic

    admin = KafkaAdminClient(bootstrap_servers=[bootstrap], request_timeout_ms=5000)
    try:
        admin.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin.close()


def k8s_answers_access_reviews(k8s: dict[str, str]) -> None:
    """The Kubernetes test server answers SelfSubjectAccessReview since doctor came; one started before
    (`up` reuses a running server) is restarted from this checkout's scripts/testenv/k8s."""
    import urllib.error

    token = Path(k8s["K8S_TOKEN_FILE"]).read_text().strip()
    body = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
            "spec": {"resourceAttributes": {"verb": "list", "resource": "pods"}}}
    req = urllib.request.Request(k8s["K8S_URL"] + "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
                                 data=json.dumps(body).encode(), method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    try:
        urllib.request.urlopen(req, timeout=5).read()
    except urllib.error.HTTPError as e:
        if e.code != 404:
            raise
        script("k8s", "down")
        script("k8s", "up")




def assert_only(by: dict[str, list[dict]], failing: set[str], hint: str) -> None:
    """The checks named in ``failing`` fail (or are skipped because one of them failed), at least one with a
    hint containing ``hint``; every other check passes (or, for systemd here, says it does not apply)."""
    failed = []
    for name, rows in by.items():
        for c in rows:
            if name in failing:
                assert c["result"] in ("fail", "skipped"), c
                if c["result"] == "fail":
                    failed.append(c)
            elif name == "systemd.units" and not os.path.isdir("/run/systemd/system"):
                assert c["result"] == "info", c
            else:
                assert c["result"] == "pass", c
    assert failed, f"none of {failing} failed"
    assert any(hint in (c["hint"] or "") for c in failed), [c["hint"] for c in failed]


def test_the_full_lab_region_passes(lab):
    code, by, env, err = lab.doctor()
    assert code == 0, err + json.dumps(env["data"]["checks"], indent=1)
    assert env["status"] == "ok" and env["data"]["backend"] == "openstack"
    expected = {"state.db", "openstack.auth", "openstack.nova", "openstack.placement", "openstack.blazar",
                "openstack.ironic", "slurm.version", "slurm.auth", "kubernetes.auth", "kubernetes.rbac",
                "kafka.metadata", "audit.service", "contract.rate_card", "identity.token_cache", "oidc.discovery",
                "oidc.jwks", "oidc.service_token", "systemd.units"}
    assert set(by) == expected
    assert len(by["kubernetes.rbac"]) == 7
    assert_pass = [c for rows in by.values() for c in rows if c["check"] != "systemd.units"]
    assert all(c["result"] == "pass" for c in assert_pass), [c for c in assert_pass if c["result"] != "pass"]
    # what each pass says it observed
    assert "token scoped to project" in by["openstack.auth"][0]["detail"]
    assert re.search(r"slurmrestd serves .*v0\.0\.\d+", by["slurm.version"][0]["detail"])
    assert "1 partition(s)" in by["kafka.metadata"][0]["detail"]
    assert "service token" in by["oidc.service_token"][0]["detail"]
    assert "rate card" in by["contract.rate_card"][0]["detail"]
    # the access reviews were real ones: every request and answer body valid for authorization.k8s.io/v1
    k8s = harness.testenv("k8s")
    req = urllib.request.Request(k8s["K8S_URL"] + "/_admin/stats", headers={
        "Authorization": f"Bearer {Path(k8s['K8S_TOKEN_FILE']).read_text().strip()}"})
    stats = json.loads(urllib.request.urlopen(req, timeout=5).read())
    assert stats["requests"].get("POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews", 0) >= 8
    bad = [e for e in stats["validation_errors"] + stats["rejected_requests"] if "selfsubject" in e["path"]]
    assert not bad, bad


def _service_down(lab, name: str):
    """Take one service away; returns how to bring it back."""
    if name == "openstack":
        script("openstack", "stop", "placement")
        return lambda: script("openstack", "start", "placement")
    if name == "audit":
        port = lab.receiver.port
        lab.receiver.stop()

        def back():
            r = Receiver.__new__(Receiver)
            r.port, r.url, r.token_file, r.db = port, f"http://127.0.0.1:{port}", lab.receiver.token_file, lab.receiver.db
            r.proc = subprocess.Popen([str(BIN / "spotctl"), "audit", "serve", "--port", str(port), "--db", str(r.db),
                                       "--token-file", str(r.token_file)], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, env=os.environ.copy())
            wait_until(lambda: _answers(r.url + "/v1/health"), "the audit receiver to come back", 30)
            lab.receiver = r
        return back
    if name == "contract":
        lab.contract.stop()
        return lab.contract.start
    script(name, "down")

    def up() -> None:
        script(name, "up")
        if name == "kafka":
            lab.topic()
    return up


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1).read()
        return True
    except OSError:
        return False


# service -> (the checks that fail or are skipped, a piece of the hint)
STOPPED = {
    "kafka": ({"kafka.metadata"}, "bootstrap_servers"),
    "slurm": ({"slurm.version", "slurm.auth"}, "is it running and listening"),
    "k8s": ({"kubernetes.auth", "kubernetes.rbac"}, "cannot be reached"),
    "oidc": ({"oidc.discovery", "oidc.jwks", "oidc.service_token"}, "server_url and realm"),
    "openstack": ({"openstack.placement"}, "placement API"),
    "audit": ({"audit.service"}, "queued in the outbox"),
    "contract": ({"contract.rate_card"}, "no-notice policy"),
}


@pytest.mark.parametrize("service", list(STOPPED))
def test_a_stopped_service_fails_its_check_with_its_hint_and_the_others_pass(lab, service):
    failing, hint = STOPPED[service]
    back = _service_down(lab, service)
    try:
        code, by, env, err = lab.doctor()
    finally:
        back()
    assert code == 8, err
    assert env["status"] == "failed"
    assert_only(by, failing, hint)
    assert all(c["exit_code"] == 8 for rows in by.values() for c in rows if c["result"] == "fail")
    assert "check(s) failed: " in err
    # the service is back: its check passes again (what the next test relies on too)
    code, by, env, err = lab.doctor()
    assert code == 0, err + json.dumps([c for rows in by.values() for c in rows if c["result"] != "pass"], indent=1)


def test_refused_credentials_win_over_an_unreachable_backend_and_rbac_denials_are_named(lab, tmp_path):
    """A wrong audit token (refused: 4), a Slurm JWT slurmctld did not sign (4), the contract feed down (8),
    `patch nodes` denied by RBAC (4): exit 4, each failure with its own hint."""
    import base64

    def b64(d: dict) -> str:
        return base64.urlsafe_b64encode(json.dumps(d).encode()).rstrip(b"=").decode()

    forged = tmp_path / "forged.jwt"
    forged.write_text(f"{b64({'alg': 'HS256', 'typ': 'JWT'})}.{b64({'exp': int(time.time()) + 3600, 'sun': 'root'})}"
                      f".{b64({'not': 'a signature'})}\n")
    k8s = harness.testenv("k8s")
    token = Path(k8s["K8S_TOKEN_FILE"]).read_text().strip()

    def rbac(deny: list) -> None:
        req = urllib.request.Request(k8s["K8S_URL"] + "/_admin/rbac", data=json.dumps({"deny": deny}).encode(),
                                     headers={"Authorization": f"Bearer {token}"}, method="POST")
        urllib.request.urlopen(req, timeout=5).read()

    (tmp_path / "wrong.token").write_text("not-the-token\n")
    cfg = lab.cfg.read_text()
    assert f'token_file = "{lab.receiver.token_file}"' in cfg
    slurm_token = re.search(r'^token_file = "(.*/slurm/token)"$', cfg, re.M)
    assert slurm_token, "the lab's [slurm] table names its token file"
    lab.cfg.write_text(cfg.replace(f'token_file = "{lab.receiver.token_file}"',
                                   f'token_file = "{tmp_path / "wrong.token"}"')
                       .replace(slurm_token.group(0), f'token_file = "{forged}"'))
    lab.contract.stop()
    rbac([{"verb": "patch", "resource": "nodes"}])
    try:
        code, by, env, err = lab.doctor()
    finally:
        rbac([])
        lab.cfg.write_text(cfg)
        lab.contract.start()
    assert code == 4, err
    audit, = by["audit.service"]
    assert audit["result"] == "fail" and audit["exit_code"] == 4 and "token_file" in audit["hint"]
    slurm, = by["slurm.auth"]
    assert slurm["result"] == "fail" and slurm["exit_code"] == 4 and "scontrol token username=root" in slurm["hint"]
    feed, = by["contract.rate_card"]
    assert feed["result"] == "fail" and feed["exit_code"] == 8
    denied = [c for c in by["kubernetes.rbac"] if c["result"] == "fail"]
    assert [c["target"].split(":")[0] for c in denied] == ["patch nodes"]
    assert denied[0]["exit_code"] == 4 and "kubectl auth can-i patch nodes" in denied[0]["hint"]
    assert all(c["result"] == "pass" for c in by["kubernetes.rbac"] if c not in denied)


def test_a_cloud_that_refuses_the_login_fails_auth_and_skips_its_endpoints(lab, tmp_path):
    clouds = Path(lab.env["OS_CLIENT_CONFIG_FILE"]).read_text()
    wrong = tmp_path / "clouds.yaml"
    wrong.write_text(re.sub(r"password: .*", "password: not-the-password", clouds))
    code, by, env, err = lab.doctor(OS_CLIENT_CONFIG_FILE=str(wrong))
    assert code == 4, err
    auth, = by["openstack.auth"]
    assert auth["result"] == "fail" and auth["exit_code"] == 4
    assert f"openstack --os-cloud {lab.env['OS_CLOUD']} token issue" in auth["hint"]
    for name in ("openstack.nova", "openstack.placement", "openstack.blazar", "openstack.ironic"):
        row, = by[name]
        assert row["result"] == "skipped" and "openstack.auth did not pass" in row["detail"]
    assert all(c["result"] in ("pass", "info") for n, rows in by.items() if not n.startswith("openstack")
               for c in rows)
