"""`spotctl bundle serve`, `publish`, `fetch`, `status` over real mutual TLS on loopback (issue 16), with
SVIDs of a test PKI (tests/pki.py): who may fetch and publish is decided by SPIFFE ID; what the server
accepts and the agent keeps is decided by the bundle's checks. The server runs as a user runs it: the
`spotctl` executable, stopped with SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from spotctl.core.errors import ExitCode
from tests.pki import CA

BIN = Path(sys.executable).parent / "spotctl"
TD = "spiffe://example.org"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def pki(tmp_path):
    d = tmp_path / "pki"
    d.mkdir()
    ca, evil = CA("example.org"), CA("evil.org")
    (d / "bundle.pem").write_bytes(ca.pem())
    (d / "evil-bundle.pem").write_bytes(evil.pem())
    ids = {"server": [f"{TD}/spotctl/bundle-server"], "agent": [f"{TD}/agent/node-1"],
           "pipeline": [f"{TD}/ci/contract-pipeline"], "twice": [f"{TD}/agent/a", f"{TD}/ci/contract-pipeline"]}
    svids = {n: ca.svid(d, n, i) for n, i in ids.items()}
    svids["expired"] = ca.svid(d, "expired", [f"{TD}/agent/node-2"], expired=True)
    svids["evil"] = evil.svid(d, "evil", ["spiffe://evil.org/agent/node-1"])
    return {"dir": d, "ca": ca, "bundle": str(d / "bundle.pem"), **svids}


def spotctl(*args, env=None, check=False) -> subprocess.CompletedProcess:
    p = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=60, env={**os.environ, **(env or {})})
    if check:
        assert p.returncode == 0, p.stderr
    return p


def svid_args(pki, who: str) -> list[str]:
    cert, key = pki[who]
    return ["--cert", cert, "--key", key, "--trust-bundle", pki["bundle"]]


@pytest.fixture
def signing(tmp_path):
    keys = {}
    for k in ("k1", "k2"):
        spotctl("bundle", "keygen", "--out", str(tmp_path / f"{k}.pem"), check=True)
        keys[k] = str(tmp_path / f"{k}.pem")
    return keys


@pytest.fixture
def server(pki, signing, tmp_path):
    port = free_port()
    proc = subprocess.Popen([str(BIN), "bundle", "serve", *svid_args(pki, "server"),
                             "--trust", signing["k1"] + ".pub", "--trust", signing["k2"] + ".pub",
                             "--allow-get", f"{TD}/agent/*", "--allow-put", f"{TD}/ci/contract-pipeline",
                             "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "served"),
                             "--metrics-listen", f"127.0.0.1:{free_port()}"],
                            stderr=subprocess.PIPE, text=True)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "serving region demo's bundle at https://127.0.0.1" in line, line + (proc.stderr.read() if proc.poll() else "")
    metrics = proc.stderr.readline()
    assert "spotctl: metrics at http://127.0.0.1:" in metrics, metrics
    proc.metrics_url = metrics.split(" at ", 1)[1].strip()  # type: ignore[attr-defined]
    yield f"https://127.0.0.1:{port}", proc
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=20)


def make_bundle(tmp_path, signing, revision: int, *keys: str) -> str:
    out = str(tmp_path / f"b{revision}-{'-'.join(keys)}")
    spotctl("bundle", "build", "--revision", str(revision), "--out", out, check=True)
    for k in keys:
        spotctl("bundle", "sign", out, "--key", signing[k], check=True)
    return out


def test_the_pipeline_publishes_and_agents_fetch_with_etags(server, pki, signing, tmp_path):
    url, _ = server
    b1 = make_bundle(tmp_path, signing, 1, "k1")
    p = spotctl("bundle", "publish", b1, "--to", url, *svid_args(pki, "pipeline"), "-o", "json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["data"]["accepted_revision"] == 1
    kept = tmp_path / "agent.bundle"
    fetch = ["bundle", "fetch", "--from", url, "--out", str(kept), "--trust", signing["k1"] + ".pub",
             *svid_args(pki, "agent"), "--server-id", f"{TD}/spotctl/bundle-server", "-o", "json"]
    got = json.loads(spotctl(*fetch, check=True).stdout)["data"]
    assert got["changed"] and got["revision"] == 1 and kept.read_bytes() == Path(b1).read_bytes()
    again = json.loads(spotctl(*fetch, check=True).stdout)["data"]
    assert again == {**again, "changed": False, "revision": 1}, "304 on an unchanged ETag"
    st = json.loads(spotctl("bundle", "status", "--url", url, *svid_args(pki, "agent"), "-o", "json",
                            check=True).stdout)["data"]
    assert st["revision"] == 1 and st["published_by"] == f"{TD}/ci/contract-pipeline" and st["signatures"]
    # a new revision signed by a key this agent does not trust: refused, the last good bundle kept
    b2 = make_bundle(tmp_path, signing, 2, "k2")
    assert spotctl("bundle", "publish", b2, "--to", url, *svid_args(pki, "pipeline")).returncode == 0
    p = spotctl(*fetch)
    assert p.returncode == ExitCode.BUNDLE_UNTRUSTED, p.stderr
    assert kept.read_bytes() == Path(b1).read_bytes(), "the last good bundle stays"
    # the server is not who the agent expects
    p = spotctl(*fetch[:-4], "--server-id", f"{TD}/somebody-else", "-o", "json")
    assert p.returncode == ExitCode.AUTH and "the bundle server is" in p.stderr
    # its /metrics: the requests above by path and status, the bytes sent, the revision served
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(server[1].metrics_url, timeout=10) as r:
        fams = {f.name: f for f in text_string_to_metric_families(r.read().decode())}
    codes = {(s.labels["method"], s.labels["path"], s.labels["code"]): s.value
             for s in fams["spotctl_bundle_requests"].samples if s.name.endswith("_total")}
    path = "/v1/regions/{region}/bundle"
    assert codes[("PUT", path, "200")] == 2, codes  # two revisions published
    assert codes[("GET", path, "304")] == 1 and codes[("GET", path, "200")] >= 2  # one fetch unchanged
    assert codes[("GET", path + "/status", "200")] == 1
    sent = [s.value for s in fams["spotctl_bundle_sent_bytes"].samples if s.name.endswith("_total")]
    assert sent == [Path(b1).stat().st_size + (codes[("GET", path, "200")] - 1) * Path(b2).stat().st_size]
    assert [s.value for s in fams["spotctl_bundle_revision"].samples] == [2.0]
    durations = [s for s in fams["spotctl_bundle_request_duration_seconds"].samples if s.name.endswith("_count")]
    assert sum(s.value for s in durations) == sum(codes.values())


def test_the_server_refuses_what_does_not_verify_or_is_not_newer(server, pki, signing, tmp_path):
    url, _ = server
    pub = ["--to", url, *svid_args(pki, "pipeline")]
    assert spotctl("bundle", "publish", make_bundle(tmp_path, signing, 5, "k1"), *pub).returncode == 0
    cases = {ExitCode.BUNDLE_UNTRUSTED: make_bundle(tmp_path, signing, 6),  # unsigned
             ExitCode.BUNDLE_ROLLBACK: make_bundle(tmp_path, signing, 4, "k1"),
             }
    same = make_bundle(tmp_path, signing, 5, "k2")
    for code, path in cases.items():
        p = spotctl("bundle", "publish", path, *pub)
        assert p.returncode == code, (code, p.stderr)
    assert spotctl("bundle", "publish", same, *pub).returncode == ExitCode.BUNDLE_ROLLBACK, "not newer: refused"
    st = json.loads(spotctl("bundle", "status", "--url", url, *svid_args(pki, "agent"), "-o", "json",
                            check=True).stdout)["data"]
    assert st["revision"] == 5


def test_identities_decide_who_may_fetch_and_publish(server, pki, signing, tmp_path):
    url, _ = server
    b = make_bundle(tmp_path, signing, 1, "k1")
    p = spotctl("bundle", "publish", b, "--to", url, *svid_args(pki, "agent"))
    assert p.returncode == ExitCode.AUTH and "403" in p.stderr, "an agent may not publish"
    p = spotctl("bundle", "publish", b, "--to", url, *svid_args(pki, "twice"))
    assert p.returncode == ExitCode.AUTH, "an SVID with two SPIFFE IDs names nobody"
    for who in ("expired", "evil"):  # refused at the handshake
        p = spotctl("bundle", "status", "--url", url, *svid_args(pki, who))
        assert p.returncode == ExitCode.UNAVAILABLE and "handshake" in p.stderr, (who, p.stderr)
    # no client certificate at all: the handshake fails
    ctx = ssl.create_default_context(cafile=pki["bundle"])
    ctx.check_hostname = False
    with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
        with socket.create_connection(("127.0.0.1", int(url.rsplit(":", 1)[1])), timeout=5) as raw:
            with ctx.wrap_socket(raw) as tls:
                tls.sendall(b"GET /v1/regions/demo/bundle HTTP/1.1\r\nHost: x\r\n\r\n")
                assert tls.recv(100) == b"", "no answer without a client certificate"
                raise ConnectionResetError
    recs = json.loads(spotctl("audit", "list", "--action", "bundle.*", "-o", "json", check=True).stdout)["data"]["records"]
    assert any(r["actor"] == f"{TD}/agent/node-1" and r["action"] == "bundle.publish" and r["result"] == "refused"
               for r in recs)


def test_rotated_svid_and_trust_bundle_files_are_used_without_a_restart(server, pki, tmp_path):
    url, _ = server
    port = int(url.rsplit(":", 1)[1])

    def served_cert() -> bytes:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname, ctx.verify_mode = False, ssl.CERT_NONE
        ctx.load_cert_chain(*pki["agent"])
        with socket.create_connection(("127.0.0.1", port), timeout=5) as raw, ctx.wrap_socket(raw) as tls:
            return tls.getpeercert(binary_form=True)

    before = served_cert()
    new_ca = CA("example.org")
    cert, key = new_ca.svid(tmp_path, "server2", [f"{TD}/spotctl/bundle-server"])
    Path(pki["server"][0]).write_bytes(Path(cert).read_bytes())
    Path(pki["server"][1]).write_bytes(Path(key).read_bytes())
    Path(pki["bundle"]).write_bytes(new_ca.pem())  # the trust bundle rotated to the new CA
    agent2 = new_ca.svid(tmp_path, "agent2", [f"{TD}/agent/node-9"])
    time.sleep(1.2)  # the server checks its files at most once a second
    assert served_cert() != before, "the rotated certificate is served"
    args = ["--cert", agent2[0], "--key", agent2[1], "--trust-bundle", pki["bundle"]]
    p = spotctl("bundle", "status", "--url", url, *args, "-o", "json")
    assert p.returncode == 0, p.stderr  # an SVID of the new CA, under the rotated trust bundle


def test_the_server_answers_as_its_openapi_document_says(server, pki, signing, tmp_path):
    """Every operation of docs/bundles/openapi.yaml, each documented status the server can be led to, checked
    against the running server: the status is documented for the operation, a JSON body validates against
    its schema, the documented headers are there."""
    import httpx
    import jsonschema
    import yaml

    from spotctl.bundles.spiffe import SvidFiles

    url, _ = server
    doc = yaml.safe_load((Path(__file__).resolve().parents[2] / "docs" / "bundles" / "openapi.yaml").read_text())

    def client(who: str) -> httpx.Client:
        cert, key = pki[who]
        return httpx.Client(verify=SvidFiles(cert, key, pki["bundle"]).context(server=False), timeout=10)

    def check(r: httpx.Response, path: str, method: str) -> None:
        op = doc["paths"][path][method]
        assert str(r.status_code) in op["responses"], (path, method, r.status_code, r.text[:200])
        resp = op["responses"][str(r.status_code)]
        if "$ref" in resp:
            resp = doc["components"]["responses"][resp["$ref"].rsplit("/", 1)[1]]
        for h in resp.get("headers", {}):
            assert h in r.headers, (path, method, r.status_code, h)
        content = resp.get("content", {})
        if "application/json" in content:
            assert r.headers["content-type"].startswith("application/json")
            jsonschema.validate(r.json(), content["application/json"]["schema"])
        elif content:
            assert r.headers["content-type"].split(";")[0] in content

    b, s = "/v1/regions/{region}/bundle", "/v1/regions/{region}/bundle/status"
    good, older = make_bundle(tmp_path, signing, 3, "k1"), make_bundle(tmp_path, signing, 2, "k1")
    with client("agent") as agent, client("pipeline") as pipeline:
        seen = set()

        def go(c, method, path, **kw):
            r = c.request(method.upper(), url + path.replace("{region}", kw.pop("region", "demo")), **kw)
            check(r, path, method)
            seen.add((path, method, r.status_code))
            return r

        go(agent, "get", b)  # 404: nothing published yet
        go(pipeline, "get", s)  # served: false
        go(pipeline, "put", b, content=Path(good).read_bytes())
        etag = go(agent, "get", b).headers["ETag"]
        go(agent, "get", b, headers={"If-None-Match": etag})
        go(agent, "get", s)
        go(pipeline, "put", b, content=Path(older).read_bytes())  # 409
        go(pipeline, "put", b, content=b"not a bundle")  # 422
        go(agent, "put", b, content=Path(good).read_bytes())  # 403
        go(agent, "get", b, region="other")  # 404
    assert {(p, m, c) for p, m, c in seen} >= {(b, "get", 200), (b, "get", 304), (b, "get", 404), (b, "put", 200),
                                               (b, "put", 403), (b, "put", 409), (b, "put", 422), (s, "get", 200)}


def test_svids_from_the_spiffe_workload_api(server, pki, signing, tmp_path):
    """An agent whose SVID comes from the Workload API socket (as a SPIRE agent serves it), not from files."""
    from tests.spiffe_workload import WorkloadApi, serve

    url, _ = server
    sock = tmp_path / "agent.sock"
    api = WorkloadApi(f"{TD}/agent/node-7", *pki["agent"], pki["bundle"])
    grpc_server = serve(sock, api)
    try:
        b = make_bundle(tmp_path, signing, 1, "k1")
        assert spotctl("bundle", "publish", b, "--to", url, *svid_args(pki, "pipeline")).returncode == 0
        kept = tmp_path / "agent.bundle"
        p = spotctl("bundle", "fetch", "--from", url, "--out", str(kept), "--trust", signing["k1"] + ".pub",
                    "--workload-api", f"unix://{sock}", "-o", "json")
        assert p.returncode == 0, p.stderr
        assert api.calls == 1 and kept.read_bytes() == Path(b).read_bytes()
        assert not list(Path("/tmp").glob(f"spotctl-svid-*/{Path(pki['agent'][0]).name}")), "the private copy is gone"
        p = spotctl("bundle", "status", "--url", url, "--workload-api", f"unix://{tmp_path}/nobody.sock")
        assert p.returncode in (ExitCode.CONFIG, ExitCode.UNAVAILABLE) and "Workload API" in p.stderr
    finally:
        grpc_server.stop(0)


def test_the_server_gets_its_svid_from_the_workload_api(pki, signing, tmp_path):
    from tests.spiffe_workload import WorkloadApi, serve

    sock = tmp_path / "server.sock"
    grpc_server = serve(sock, WorkloadApi(f"{TD}/spotctl/bundle-server", *pki["server"], pki["bundle"]))
    port = free_port()
    proc = subprocess.Popen([str(BIN), "bundle", "serve", "--workload-api", f"unix://{sock}",
                             "--trust", signing["k1"] + ".pub", "--allow-get", f"{TD}/agent/*",
                             "--listen", f"127.0.0.1:{port}", "--data-dir", str(tmp_path / "served")],
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "serving region demo's bundle" in line, line
        p = spotctl("bundle", "status", "--url", f"https://127.0.0.1:{port}", *svid_args(pki, "agent"), "-o", "json")
        assert p.returncode == 0 and json.loads(p.stdout)["data"]["served"] is False, p.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        grpc_server.stop(0)
