"""One secret-file reader (``spotctl.core.secrets.SecretFile``): re-read when rotated, refused when not one token.

The rotation cases are the ways files really change: rewritten in place (mtime, size), renamed into
place (another inode: ``install``, config management, ``mv``), and a swapped symlink (Kubernetes
projected service-account tokens: ``..data`` points at a new directory). Then every reader of a
``token_file`` / ``sasl_password_file`` / ``--token-file`` is shown to send (or accept) the new value
without being rebuilt, against a real loopback server that records what it was sent.
"""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import requests

from spotctl.core.config import RegionConfig
from spotctl.core.errors import ConfigError
from spotctl.core.secrets import SecretFile


def test_the_trailing_newline_goes_and_an_unchanged_file_is_read_once(tmp_path):
    f = tmp_path / "token"
    f.write_text("s3cret\n")
    secret = SecretFile(f, setting="regions.r.audit.token_file")
    assert [secret.value() for _ in range(5)] == ["s3cret"] * 5
    assert secret.reads == 1
    assert "s3cret" not in repr(secret)


def test_rewritten_in_place_is_reread(tmp_path):
    f = tmp_path / "token"
    f.write_text("one\n")
    secret = SecretFile(f)
    assert secret.value() == "one"
    f.write_text("two-longer\n")  # same inode, new size and mtime
    assert secret.value() == "two-longer"
    f.write_text("three-same\n")  # same size as before: the mtime tells
    os.utime(f, ns=(1, 1))
    assert secret.value() == "three-same"


def test_renamed_into_place_is_reread(tmp_path):
    f = tmp_path / "token"
    f.write_text("old")
    secret = SecretFile(f)
    assert secret.value() == "old"
    new = tmp_path / "token.new"
    new.write_text("new")
    st = f.stat()
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))  # even with the same mtime and size: another inode
    os.replace(new, f)
    assert secret.value() == "new"


def test_a_swapped_symlink_is_reread(tmp_path):
    """Kubernetes projected tokens: token -> ..data/token, and ..data is swapped to a new directory."""
    for d, value in (("v1", "first"), ("v2", "second")):
        (tmp_path / d).mkdir()
        (tmp_path / d / "token").write_text(value)
    (tmp_path / "..data").symlink_to("v1")
    (tmp_path / "token").symlink_to("..data/token")
    secret = SecretFile(tmp_path / "token")
    assert secret.value() == "first"
    (tmp_path / "..data.tmp").symlink_to("v2")
    os.replace(tmp_path / "..data.tmp", tmp_path / "..data")
    assert secret.value() == "second"


@pytest.mark.parametrize(("content", "why"), [
    ("", "is empty"),
    ("\n  \n", "is empty"),
    ("one\ntwo\n", "more than one line"),
    ("Bearer abc", "whitespace inside"),
    ("token = abc", "whitespace inside"),
])
def test_not_one_token_is_a_config_error_naming_the_setting_and_the_file(tmp_path, content, why):
    f = tmp_path / "token"
    f.write_text(content)
    with pytest.raises(ConfigError, match=why) as e:
        SecretFile(f, setting="regions.lab.slurm.token_file").value()
    assert "regions.lab.slurm.token_file" in e.value.message and str(f) in e.value.message


def test_a_missing_file_is_a_config_error_and_a_file_that_comes_back_is_read(tmp_path):
    f = tmp_path / "token"
    secret = SecretFile(f, setting="--token-file")
    with pytest.raises(ConfigError, match="--token-file .*cannot read it"):
        secret.value()
    f.write_text("back")
    assert secret.value() == "back"
    f.write_text("")  # rotated to an empty file: refused, never the stale value
    with pytest.raises(ConfigError, match="is empty"):
        secret.value()


def test_a_password_may_hold_spaces_but_not_two_lines(tmp_path):
    f = tmp_path / "pw"
    f.write_text("correct horse battery\n")
    assert SecretFile(f, spaces_ok=True).value() == "correct horse battery"
    f.write_text("a\nb")
    with pytest.raises(ConfigError, match="more than one line"):
        SecretFile(f, spaces_ok=True).value()


# --- every reader takes the rotated value, without being rebuilt -----------------------------------


class _Recorder(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list[dict] = []

    def log_message(self, format, *args):  # noqa: A002
        pass

    def do_GET(self):  # noqa: N802
        type(self).seen.append(dict(self.headers))
        body = json.dumps({"ok": True, "paths": {"/slurm/v0.0.40/jobs": {}}, "partitions": [], "items": [],
                           "metadata": {"resourceVersion": "1"}}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture()
def recorder():
    _Recorder.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", _Recorder.seen
    server.shutdown()
    server.server_close()


def _region(sections: dict) -> RegionConfig:
    return RegionConfig(name="r", backend="sim", pools={}, sections=sections)


def _rotate(f, value: str) -> None:
    new = f.with_suffix(".new")
    new.write_text(value + "\n")
    os.replace(new, f)


def test_the_contract_feed_and_the_audit_client_send_the_rotated_token(recorder, tmp_path):
    from spotctl.adapters.audit_http import AuditClient
    from spotctl.adapters.contract_http import ContractFeed

    url, seen = recorder
    f = tmp_path / "token"
    f.write_text("one\n")
    region = _region({"contract": {"url": url, "token_file": str(f)},
                                              "audit": {"url": url, "token_file": str(f)}})
    feed, client = ContractFeed.from_config(region), AuditClient.from_config(region)
    feed.status()
    client.record("x")
    _rotate(f, "two")
    feed.status()
    client.record("x")
    assert [h["Authorization"] for h in seen] == ["Bearer one", "Bearer one", "Bearer two", "Bearer two"]


def test_slurm_and_kubernetes_send_the_rotated_token(recorder, tmp_path):
    import base64

    from spotctl.adapters.kubernetes import KubernetesScheduler
    from spotctl.adapters.slurm import SlurmScheduler

    def jwt(n: int) -> str:
        enc = lambda d: base64.urlsafe_b64encode(json.dumps(d).encode()).decode().rstrip("=")  # noqa: E731
        return f"{enc({'alg': 'HS256'})}.{enc({'sun': 'alice', 'n': n})}.c2ln"

    url, seen = recorder
    sf, kf = tmp_path / "slurm.jwt", tmp_path / "k8s.token"
    sf.write_text(jwt(1) + "\n")
    kf.write_text("k-one\n")
    region = _region({
        "slurm": {"url": url, "user": "alice", "token_file": str(sf), "scontrol": "/nonexistent/scontrol"},
        "kubernetes": {"server": url, "token_file": str(kf)}})
    slurm, k8s = SlurmScheduler.from_config(region), KubernetesScheduler.from_config(region)
    slurm._request("GET", "/openapi/v3")
    k8s.api.request("GET", "/api/v1/nodes")
    _rotate(sf, jwt(2))
    _rotate(kf, "k-two")
    slurm._request("GET", "/openapi/v3")
    k8s.api.request("GET", "/api/v1/nodes")
    assert [h.get("X-SLURM-USER-TOKEN") or h["Authorization"] for h in seen] == [
        jwt(1), "Bearer k-one", jwt(2), "Bearer k-two"]


def test_kafka_reads_the_password_file_at_each_connection(tmp_path):
    from spotctl.adapters.kafka import KafkaRelay

    f = tmp_path / "kafka.pw"
    f.write_text("pass word one\n")
    relay = KafkaRelay.from_config(_region({"kafka": {
        "bootstrap_servers": "127.0.0.1:9", "sasl_plain_username": "u", "sasl_password_file": str(f)}}))
    assert relay._security()["sasl_plain_password"] == "pass word one"
    _rotate(f, "pass word two")
    assert relay._security()["sasl_plain_password"] == "pass word two"
    assert "pass word" not in repr(relay.security)


def test_the_reference_servers_accept_the_rotated_token_at_once(tmp_path):
    """``spotctl audit serve --token-file`` and ``spotctl sim serve`` (the region's contract token_file)."""
    from spotctl.services.audit_receiver import make_server
    from spotctl.services.contract_api import region_endpoint

    f = tmp_path / "token"
    f.write_text("one\n")
    server = make_server(tmp_path / "receiver.db", SecretFile(f, setting="--token-file"), port=0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        def status(token: str) -> int:
            return requests.get(server.url + "/v1/records", headers={"Authorization": f"Bearer {token}"},
                                timeout=5).status_code

        assert (status("one"), status("two")) == (200, 401)
        _rotate(f, "two")
        assert (status("one"), status("two")) == (401, 200)
    finally:
        server.shutdown()
        server.server_close()
        server.ledger.close()
    region = _region({"contract": {"url": "http://127.0.0.1:8787", "token_file": str(f)}})
    _, _, token = region_endpoint(region)
    assert isinstance(token, SecretFile) and token.value() == "two"
    _rotate(f, "three")
    assert token.value() == "three"
