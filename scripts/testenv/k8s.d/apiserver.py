"""A Kubernetes API test server for spotctl's integration tests (a test peer, not a product part).

No kube-apiserver can be installed on the test machines, so this stdlib HTTP server speaks the
subset of the API that spotctl's Kubernetes adapter uses, with the real server's conventions:

* core/v1 pods and nodes: list (``limit``/``continue``, ``fieldSelector``, ``labelSelector``) and
  **watch** (chunked WatchEvent lines, ``resourceVersion`` resume, ``ERROR`` event with a 410
  ``Expired`` Status for a too-old version, ``BOOKMARK`` events with ``allowWatchBookmarks``,
  ``timeoutSeconds``; an object entering/leaving the selector is ADDED/DELETED);
* create / get / delete pods and nodes; PATCH nodes, pods and pods/status (merge and strategic
  merge as JSON merge, JSON patch) with the ``metadata.resourceVersion`` precondition (409);
* policy/v1 PodDisruptionBudgets (create / list / get / delete) and the **Eviction** subresource:
  201, or 429 ``TooManyRequests`` with a ``DisruptionBudget`` cause when a PDB allows no disruption;
* ``metav1.Status`` error bodies (400/401/403/404/405/409/410/415/422/429); bearer-token auth.

Every request body and every response body (objects, list items, watch events, Status) is
validated against the official OpenAPI-derived JSON schemas shipped in the ``kubernetes-validate``
package (strict: unknown fields are errors). A bad request gets 422; a response that fails its
schema is a bug of this server: it is answered with 500 and counted in ``/_admin/stats``.

Test controls (same bearer token) under ``/_admin``: ``POST reset`` (delete every object),
``POST compact`` (forget the event history: older resource versions get 410), ``POST drop-watches``
``{"after_events": N, "count": C, "match": S}`` (cut the next C watch connections whose request
path contains S abruptly after N events), ``POST fail`` ``{"status": 503, "count": C, "match": S}``
(answer the next C API requests whose path contains S with that error), ``POST rbac``
``{"deny": [{"verb": V, "resource": R, "subresource": S}]}`` (what SelfSubjectAccessReviews deny from now
on; ``[]`` allows everything again, as ``reset`` does), ``GET stats`` (requests,
evictions, deletes, schema failures, watches). ``match`` lets concurrent test runs, each in its
own namespace, leave each other alone.

Deleting a pod is **graceful**, as on a real cluster: a pod bound to a node (``spec.nodeName``) gets
``metadata.deletionTimestamp`` (now + its grace period: ``gracePeriodSeconds`` of the DELETE or of
the Eviction's ``deleteOptions``, else ``spec.terminationGracePeriodSeconds``, default 30) and stays
listed as *Terminating* until then, when the server removes it (standing in for the kubelet); a
second DELETE may shorten the grace period, never lengthen it; grace 0, or an unbound pod, is
removed at once. A PodDisruptionBudget's allowance counts **Ready** pods (condition ``Ready=True``,
not terminating) like the disruption controller; evicting a pod that is already terminating,
pending or finished ignores the budget.

``POST /apis/authorization.k8s.io/v1/selfsubjectaccessreviews`` answers whether the token's user may do
what the review's ``resourceAttributes`` say (everything, unless ``/_admin/rbac`` denies it), the request
and the answer validated like every other body.

Pods created through the API keep the ``status`` they are given (the real server would drop it
and let the scheduler set it): tests describe unschedulable pods that way, or PATCH pods/status.

Usage: python apiserver.py --port 16443 --token TOKEN [--schema-version 1.34.0]
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import logging
import re
import socket
import threading
import time
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

log = logging.getLogger("k8s-testserver")

VERSION = {"major": "1", "minor": "34", "gitVersion": "v1.34.0-spotctl-test", "platform": "linux/amd64",
           "goVersion": "go1.24", "compiler": "gc", "buildDate": "2025-01-01T00:00:00Z",
           "gitCommit": "0000000", "gitTreeState": "clean"}

# resource -> (kind, apiVersion, namespaced)
RESOURCES = {
    "pods": ("Pod", "v1", True),
    "nodes": ("Node", "v1", False),
    "poddisruptionbudgets": ("PodDisruptionBudget", "policy/v1", True),
}


def now_iso() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def status_body(code: int, reason: str, message: str, details: dict | None = None) -> dict:
    s = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure" if code >= 300 else "Success",
         "message": message, "reason": reason, "code": code}
    if details:
        s["details"] = details
    return s


class HttpError(Exception):
    def __init__(self, code: int, reason: str, message: str, details: dict | None = None):
        super().__init__(message)
        self.body = status_body(code, reason, message, details)
        self.code = code


# --- schemas ------------------------------------------------------------------


class Schemas:
    """Strict validators from kubernetes-validate's schema files, built once per kind."""

    def __init__(self, version: str):
        import jsonschema
        from importlib import resources
        from referencing import Registry, Resource

        self._jsonschema = jsonschema
        base = resources.files("kubernetes_validate") / "kubernetes-json-schema" / f"v{version}-local-strict"
        if not base.is_dir():
            raise SystemExit(f"kubernetes-validate has no schemas for Kubernetes {version}")
        self._base = base
        self._defs = Resource.from_contents(json.loads((base / "_definitions.json").read_text()))
        self._Registry, self._Resource = Registry, Resource
        self._cache: dict[str, object] = {}
        self._lock = threading.Lock()

    def _validator(self, filename: str):
        with self._lock:
            v = self._cache.get(filename)
            if v is None:
                schema = json.loads((self._base / filename).read_text())
                reg = self._Resource.from_contents(schema) @ (self._defs @ self._Registry())
                v = self._cache[filename] = self._jsonschema.validators.Draft202012Validator(schema, registry=reg)
            return v

    def errors(self, obj: dict, kind: str | None = None, api_version: str | None = None) -> list[str]:
        """Schema errors of ``obj`` (kind/apiVersion default to the given ones, as list items omit them)."""
        if not isinstance(obj, dict):
            return ["not a JSON object"]
        o = dict(obj)
        o.setdefault("kind", kind)
        o.setdefault("apiVersion", api_version)
        group_version = o["apiVersion"] or "v1"
        group = re.sub(r"^([^./]*)(?:\.[^/]*)?/", r"\1-", group_version)
        if o["kind"] in ("Status", "WatchEvent", "DeleteOptions"):
            group = "meta-v1"
        name = f"{str(o['kind']).lower()}-{group}.json"
        if not (self._base / name).is_file():
            return [f"no schema for kind {o['kind']!r} apiVersion {group_version!r}"]
        if o["kind"] == "WatchEvent":
            o.pop("kind")
            o.pop("apiVersion")
        return [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
                for e in self._validator(name).iter_errors(o)]


# --- selectors and patches -------------------------------------------------------------------


def _get_path(obj, path):
    cur = obj
    for p in path.split("."):
        if not isinstance(cur, dict):
            return None
        cur = cur.get(p)
    return cur


FIELDS = {"pods": {"metadata.name", "metadata.namespace", "status.phase", "spec.nodeName", "spec.schedulerName"},
          "nodes": {"metadata.name", "spec.unschedulable"},
          "poddisruptionbudgets": {"metadata.name", "metadata.namespace"}}


def parse_field_selector(resource: str, sel: str | None):
    reqs = []
    for part in filter(None, (sel or "").split(",")):
        m = re.match(r"^([\w.]+)\s*(!=|==|=)\s*(.*)$", part.strip())
        if not m:
            raise HttpError(400, "BadRequest", f"invalid field selector: {part!r}")
        if m.group(1) not in FIELDS[resource]:
            raise HttpError(400, "BadRequest", f'field label not supported: {m.group(1)}')
        reqs.append((m.group(1), m.group(2) != "!=", m.group(3)))
    return reqs


def field_match(obj, reqs) -> bool:
    for path, eq, val in reqs:
        v = _get_path(obj, path)
        if path == "spec.unschedulable":
            v = "true" if v else "false"
        v = "" if v is None else str(v)
        if (v == val) != eq:
            return False
    return True


def parse_label_selector(sel: str | None):
    reqs = []
    for part in re.findall(r"[^,(]+(?:\([^)]*\))?", sel or ""):
        part = part.strip()
        if not part:
            continue
        m = re.match(r"^([\w./-]+)\s+(in|notin)\s+\(([^)]*)\)$", part)
        if m:
            reqs.append((m.group(1), m.group(2), {x.strip() for x in m.group(3).split(",")}))
            continue
        m = re.match(r"^([\w./-]+)\s*(!=|==|=)\s*([\w./-]*)$", part)
        if m:
            reqs.append((m.group(1), "!=" if m.group(2) == "!=" else "=", m.group(3)))
            continue
        if re.match(r"^!?[\w./-]+$", part):
            reqs.append((part.lstrip("!"), "!exists" if part.startswith("!") else "exists", None))
            continue
        raise HttpError(400, "BadRequest", f"unable to parse requirement: {part!r}")
    return reqs


def labels_match(labels: dict, reqs) -> bool:
    for k, op, v in reqs:
        if op == "=" and labels.get(k) != v:
            return False
        if op == "!=" and labels.get(k) == v:
            return False
        if op == "in" and labels.get(k) not in v:
            return False
        if op == "notin" and labels.get(k) in v:
            return False
        if op == "exists" and k not in labels:
            return False
        if op == "!exists" and k in labels:
            return False
    return True


def selector_match(selector: dict | None, labels: dict) -> bool:
    """A metav1.LabelSelector (matchLabels + matchExpressions) against labels."""
    if selector is None:
        return False
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        k, op, vals = e["key"], e["operator"], set(e.get("values") or [])
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and labels.get(k) in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


def merge_patch(target, patch):
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for k, v in patch.items():
        if v is None:
            target.pop(k, None)
        else:
            target[k] = merge_patch(target.get(k), v)
    return target


def json_patch(doc, ops):
    if not isinstance(ops, list):
        raise ValueError("a JSON patch is a list of operations")
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for p in parts[:-1]:
            parent = parent[int(p)] if isinstance(parent, list) else parent[p]
        last, o = parts[-1], op["op"]
        if isinstance(parent, list):
            idx = len(parent) if last == "-" else int(last)
            if o == "add":
                parent.insert(idx, op["value"])
            elif o == "replace":
                parent[idx] = op["value"]
            elif o == "remove":
                parent.pop(idx)
            elif o == "test" and parent[idx] != op["value"]:
                raise ValueError(f"test operation failed at {op['path']}")
        else:
            if o == "add" or (o == "replace" and last in parent):
                parent[last] = op["value"]
            elif o in ("replace", "remove"):
                if last not in parent:
                    raise ValueError(f"path {op['path']} does not exist")
                del parent[last]
            elif o == "test" and parent.get(last) != op["value"]:
                raise ValueError(f"test operation failed at {op['path']}")
    return doc


# --- the store --------------------------------------------------------------------------------


class Store:
    """Objects, a global resourceVersion and a bounded event history (the watch cache)."""

    def __init__(self, history: int = 20000):
        self.cv = threading.Condition()
        self.rv = 1000
        self.oldest = self.rv  # watches from an older version get 410 Expired
        self.objs: dict[str, dict] = {r: {} for r in RESOURCES}
        self.events: list[tuple[int, str, str, dict, dict | None]] = []  # (rv, resource, type, obj, old)
        self.history = history
        self.terminating: dict[tuple[str, str], float] = {}  # pod (ns, name) -> when it goes

    def _bump(self) -> str:
        self.rv += 1
        return str(self.rv)

    def _emit(self, resource, etype, obj, old=None):
        self.events.append((int(obj["metadata"]["resourceVersion"]), resource, etype, copy.deepcopy(obj), old))
        if len(self.events) > self.history:
            drop = len(self.events) - self.history
            self.oldest = self.events[drop - 1][0]
            del self.events[:drop]
        self.cv.notify_all()

    def compact(self):
        with self.cv:
            self.events.clear()
            self.oldest = self.rv
            self.cv.notify_all()

    def create(self, resource, ns, obj):
        kind, api, _ = RESOURCES[resource]
        with self.cv:
            md = obj.setdefault("metadata", {})
            if not md.get("name") and md.get("generateName"):
                md["name"] = md["generateName"] + uuid.uuid4().hex[:5]
            key = (ns, md["name"])
            if key in self.objs[resource]:
                raise HttpError(409, "AlreadyExists", f'{resource} "{md["name"]}" already exists',
                                {"name": md["name"], "kind": resource})
            md.update(uid=str(uuid.uuid4()), creationTimestamp=now_iso(), resourceVersion=self._bump())
            if ns:
                md["namespace"] = ns
            obj["kind"], obj["apiVersion"] = kind, api
            obj.setdefault("spec", {})
            if resource == "pods":
                obj.setdefault("status", {}).setdefault("phase", "Pending")
            self.objs[resource][key] = obj
            self._emit(resource, "ADDED", obj)
            return copy.deepcopy(obj)

    def get(self, resource, ns, name):
        with self.cv:
            o = self.objs[resource].get((ns, name))
            if o is None:
                raise HttpError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})
            return copy.deepcopy(o)

    def update(self, resource, ns, name, fn):
        with self.cv:
            o = self.objs[resource].get((ns, name))
            if o is None:
                raise HttpError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})
            new = fn(copy.deepcopy(o))
            for k in ("uid", "name", "namespace", "creationTimestamp"):
                if k in o["metadata"]:
                    new["metadata"][k] = o["metadata"][k]
            new["kind"], new["apiVersion"] = o["kind"], o["apiVersion"]
            new["metadata"]["resourceVersion"] = self._bump()
            self.objs[resource][(ns, name)] = new
            self._emit(resource, "MODIFIED", new, old=copy.deepcopy(o))
            return copy.deepcopy(new)

    def delete(self, resource, ns, name):
        with self.cv:
            o = self.objs[resource].pop((ns, name), None)
            if o is None:
                raise HttpError(404, "NotFound", f'{resource} "{name}" not found', {"name": name, "kind": resource})
            o["metadata"]["resourceVersion"] = self._bump()
            self._emit(resource, "DELETED", o)
            return copy.deepcopy(o)

    def delete_pod(self, ns, name, grace: int | None):
        """Graceful pod deletion (see the module doc): returns the pod as it is now."""
        with self.cv:
            o = self.objs["pods"].get((ns, name))
            if o is None:
                raise HttpError(404, "NotFound", f'pods "{name}" not found', {"name": name, "kind": "pods"})
            if grace is None:
                grace = (o.get("spec") or {}).get("terminationGracePeriodSeconds")
                grace = 30 if grace is None else int(grace)
            grace = max(0, int(grace))
            md = o["metadata"]
            if grace == 0 or not (o.get("spec") or {}).get("nodeName") \
                    or (o.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                return self.delete("pods", ns, name)
            due = time.time() + grace
            if md.get("deletionTimestamp") and _parse_ts(md["deletionTimestamp"]) <= due:
                return copy.deepcopy(o)  # already terminating sooner than that
            def mark(obj):
                obj["metadata"]["deletionTimestamp"] = datetime.fromtimestamp(due, timezone.utc).strftime(
                    "%Y-%m-%dT%H:%M:%SZ")
                obj["metadata"]["deletionGracePeriodSeconds"] = grace
                return obj
            out = self.update("pods", ns, name, mark)
            self.terminating[(ns, name)] = due
            return out

    def reap(self) -> None:
        """Remove the terminating pods whose grace period is over (the kubelet's confirmation)."""
        now = time.time()
        with self.cv:
            for key, due in sorted(self.terminating.items()):
                if due <= now:
                    self.terminating.pop(key, None)
                    if key in self.objs["pods"]:
                        self.delete("pods", *key)

    def items(self, resource, ns=None, match=None):
        """Objects (copies) in name order, and the current resourceVersion; ``match`` filters before
        copying (like the real server's watch-cache indexes: a node's pods cost what they are)."""
        with self.cv:
            return [copy.deepcopy(o) for (ons, _), o in sorted(self.objs[resource].items(), key=lambda kv: kv[0])
                    if (ns is None or ons == ns) and (match is None or match(o))], str(self.rv)

    def reset(self):
        with self.cv:
            self.terminating.clear()
            for resource, objs in self.objs.items():
                for key in sorted(objs):
                    o = objs.pop(key)
                    o["metadata"]["resourceVersion"] = self._bump()
                    self._emit(resource, "DELETED", o)


# --- HTTP ---------------------------------------------------------------------------------------

ROUTES = [
    (re.compile(r"^/api/v1/(?P<res>pods|nodes)$"), "collection"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods)$"), "collection"),
    (re.compile(r"^/apis/policy/v1/(?P<res>poddisruptionbudgets)$"), "collection"),
    (re.compile(r"^/apis/policy/v1/namespaces/(?P<ns>[^/]+)/(?P<res>poddisruptionbudgets)$"), "collection"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods)/(?P<name>[^/]+)$"), "object"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods)/(?P<name>[^/]+)/status$"), "status"),
    (re.compile(r"^/api/v1/namespaces/(?P<ns>[^/]+)/(?P<res>pods)/(?P<name>[^/]+)/eviction$"), "eviction"),
    (re.compile(r"^/api/v1/(?P<res>nodes)/(?P<name>[^/]+)$"), "object"),
    (re.compile(r"^/api/v1/(?P<res>nodes)/(?P<name>[^/]+)/status$"), "status"),
    (re.compile(r"^/apis/policy/v1/namespaces/(?P<ns>[^/]+)/(?P<res>poddisruptionbudgets)/(?P<name>[^/]+)$"),
     "object"),
    (re.compile(r"^/apis/authorization\.k8s\.io/v1/selfsubjectaccessreviews$"), "access_review"),
]

PATCH_TYPES = ("application/merge-patch+json", "application/strategic-merge-patch+json",
               "application/json-patch+json")


class Controls:
    """Test controls and counters (the /_admin endpoints)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.drop_after: int | None = None
        self.drop_count = 0
        self.drop_match = ""
        self.fail_status: int | None = None
        self.fail_count = 0
        self.fail_match = ""
        self.denied: list[dict] = []  # SelfSubjectAccessReview rules denied (POST /_admin/rbac)
        self.stats = self._fresh()

    @staticmethod
    def _fresh() -> dict:
        return {"requests": {}, "evictions": [], "validation_errors": [], "rejected_requests": [], "watches": 0, "watches_dropped": 0,
                "expired": 0, "bookmarks": 0, "unauthorized": 0, "deletes": []}

    def count(self, key: str) -> None:
        with self.lock:
            self.stats["requests"][key] = self.stats["requests"].get(key, 0) + 1


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "spotctl-k8s-testserver/1"
    disable_nagle_algorithm = True  # headers and body go out in two writes: no 40 ms delayed-ACK stall
    store: Store
    schemas: Schemas
    controls: Controls
    token: str | None = None
    bookmark_seconds: float = 1.0

    def log_message(self, fmt, *args):
        log.debug("%s " + fmt, self.address_string(), *args)

    # -- plumbing

    def _send(self, code: int, obj: dict, kind: str | None = None, api: str | None = None) -> None:
        errs = self.schemas.errors(obj, kind, api)
        if errs:
            self._schema_bug("response", obj.get("kind") or kind, errs)
            code, obj = 500, status_body(500, "InternalError", f"test server produced an invalid {kind} body: {errs[0]}")
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _schema_bug(self, where: str, kind, errs: list[str]) -> None:
        log.error("%s %s failed schema validation: %s", where, kind, errs[:3])
        with self.controls.lock:
            self.controls.stats["validation_errors"].append({"where": where, "kind": kind, "errors": errs[:5],
                                                             "path": self.path})

    def _read(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        if not raw:
            return None
        try:
            return json.loads(raw)
        except ValueError:
            raise HttpError(400, "BadRequest", "the request body is not valid JSON") from None

    def _check_request(self, obj, kind: str, api: str) -> None:
        errs = self.schemas.errors(obj, kind, api)
        if errs:
            with self.controls.lock:
                self.controls.stats["rejected_requests"].append({"where": "request", "kind": kind, "errors": errs[:5],
                                                                 "path": self.path})
            raise HttpError(422, "Invalid", f"{kind} is invalid: {errs[0]}",
                            {"kind": kind, "causes": [{"reason": "FieldValueInvalid", "message": e} for e in errs[:5]]})

    def _authorized(self) -> bool:
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            with self.controls.lock:
                self.controls.stats["unauthorized"] += 1
            self._send(401, status_body(401, "Unauthorized", "Unauthorized"))
            return False
        return True

    def _dispatch(self, verb: str) -> None:
        self.body_raw = None
        try:
            body = self._read() if verb in ("POST", "PATCH", "DELETE", "PUT") else None
        except HttpError as e:
            return self._send(e.code, e.body)
        if not self._authorized():
            return
        u = urlparse(self.path)
        q = {k: v[-1] for k, v in parse_qs(u.query, keep_blank_values=True).items()}
        try:
            if u.path.startswith("/_admin/"):
                return self._admin(verb, u.path[len("/_admin/"):], body)
            self.controls.count(f"{verb} {re.sub(r'/namespaces/[^/]+', '/namespaces/*', u.path)}")
            with self.controls.lock:
                if (self.controls.fail_count > 0 and u.path.startswith(("/api/v1/", "/apis/policy"))
                        and self.controls.fail_match in self.path):
                    self.controls.fail_count -= 1
                    code = self.controls.fail_status or 503
                    raise HttpError(code, {429: "TooManyRequests", 500: "InternalError", 503: "ServiceUnavailable",
                                           403: "Forbidden"}.get(code, "InternalError"), "injected failure")
            if verb == "GET" and self._discovery(u.path):
                return
            for rx, route in ROUTES:
                m = rx.match(u.path)
                if m:
                    return getattr(self, f"_{route}")(verb, m.groupdict().get("res"), m.groupdict().get("ns"),
                                                      m.groupdict().get("name"), q, body)
            raise HttpError(404, "NotFound", "the server could not find the requested resource")
        except HttpError as e:
            self._send(e.code, e.body)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PATCH(self):
        self._dispatch("PATCH")

    def do_DELETE(self):
        self._dispatch("DELETE")

    def do_PUT(self):
        self._dispatch("PUT")

    # -- discovery

    def _discovery(self, path: str) -> bool:
        if path in ("/healthz", "/readyz", "/livez"):
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            return True
        if path == "/version":
            body = json.dumps(VERSION).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return True
        return False

    # -- collections

    def _collection(self, verb, res, ns, name, q, body):
        kind, api, namespaced = RESOURCES[res]
        if verb == "GET":
            return self._list_or_watch(res, ns, q)
        if verb == "POST":
            if not namespaced or ns:
                if not isinstance(body, dict):
                    raise HttpError(400, "BadRequest", f"expected a {kind} object")
                body.setdefault("kind", kind)
                body.setdefault("apiVersion", api)
                self._check_request(body, kind, api)
                if body["kind"] != kind or body["apiVersion"] != api:
                    raise HttpError(400, "BadRequest", f"expected {api} {kind}, got {body['apiVersion']} {body['kind']}")
                md = body.get("metadata") or {}
                if not (md.get("name") or md.get("generateName")):
                    raise HttpError(422, "Invalid", f"{kind} is invalid: metadata.name: Required value")
                if namespaced and md.get("namespace", ns) != ns:
                    raise HttpError(400, "BadRequest", "the namespace of the provided object does not match the "
                                                       "namespace sent on the request")
                return self._send(201, self.store.create(res, ns if namespaced else None, body))
        raise HttpError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _list_or_watch(self, res, ns, q):
        kind, api, _ = RESOURCES[res]
        fsel = parse_field_selector(res, q.get("fieldSelector"))
        lsel = parse_label_selector(q.get("labelSelector"))

        def match(o):
            return ((ns is None or o["metadata"].get("namespace") == ns) and field_match(o, fsel)
                    and labels_match(o["metadata"].get("labels") or {}, lsel))

        if q.get("watch") in ("true", "1"):
            return self._watch(res, q, match)
        items, rv = self.store.items(res, ns, match)
        offset = 0
        if q.get("continue"):
            try:
                token = json.loads(base64.urlsafe_b64decode(q["continue"].encode()))
                offset, rv = int(token["offset"]), str(token["rv"])
            except (ValueError, KeyError, TypeError):
                raise HttpError(400, "BadRequest", "invalid continue token") from None
            if int(rv) < self.store.oldest:
                raise HttpError(410, "Expired", "The provided continue parameter is too old to display a consistent "
                                "list result. You can start a new list without the continue parameter.")
        limit = int(q.get("limit") or 0)
        meta: dict = {"resourceVersion": rv}
        page = items[offset:]
        if limit > 0 and len(page) > limit:
            page = page[:limit]
            token = {"rv": int(rv), "offset": offset + limit}
            meta["continue"] = base64.urlsafe_b64encode(json.dumps(token).encode()).decode()
            meta["remainingItemCount"] = len(items) - offset - limit
        for o in page:
            o.pop("kind", None)
            o.pop("apiVersion", None)
        self._send(200, {"kind": kind + "List", "apiVersion": api, "metadata": meta, "items": page}, kind + "List", api)

    def _watch(self, res, q, match):
        kind, api, _ = RESOURCES[res]
        try:
            timeout = float(q.get("timeoutSeconds") or 1800)
        except ValueError:
            raise HttpError(400, "BadRequest", "timeoutSeconds must be a number") from None
        bookmarks = q.get("allowWatchBookmarks") in ("true", "1")
        start = q.get("resourceVersion") or ""
        if start and not start.isdigit():
            raise HttpError(400, "BadRequest", f"invalid resource version: {start!r}")
        ctl = self.controls
        with ctl.lock:
            ctl.stats["watches"] += 1
            drop_after = None
            if ctl.drop_count > 0 and ctl.drop_match in self.path:
                ctl.drop_count -= 1
                drop_after = ctl.drop_after or 0
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        sent = 0

        def chunk(etype: str, obj: dict) -> None:
            nonlocal sent
            if drop_after is not None and sent >= drop_after:
                raise _Drop()
            event = {"type": etype, "object": obj}
            errs = self.schemas.errors(event, "WatchEvent") + self.schemas.errors(obj)
            if errs:
                self._schema_bug("watch event", obj.get("kind"), errs)
                event = {"type": "ERROR", "object": status_body(500, "InternalError", f"invalid object: {errs[0]}")}
            data = (json.dumps(event) + "\n").encode()
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
            sent += 1

        st = self.store
        deadline = time.monotonic() + timeout
        try:
            with st.cv:
                if start in ("", "0"):
                    items, rv = st.items(res)
                    last = int(rv)
                    initial = [o for o in items if match(o)]
                else:
                    last = int(start)
                    initial = []
                    if last < st.oldest:
                        with ctl.lock:
                            ctl.stats["expired"] += 1
                        initial = None
            if initial is None:
                chunk("ERROR", status_body(410, "Expired", f"too old resource version: {last} ({st.oldest})"))
                self.wfile.write(b"0\r\n\r\n")
                return
            for o in initial:
                chunk("ADDED", o)
            next_bookmark = time.monotonic() + self.bookmark_seconds
            while True:
                with st.cv:
                    if last < st.oldest:  # compacted under an open watch: the real server ends it with 410
                        expired = True
                        pending = []
                    else:
                        expired = False
                        pending = [e for e in st.events if e[0] > last and e[1] == res]
                        if not pending:
                            left = deadline - time.monotonic()
                            if left <= 0:
                                break
                            st.cv.wait(timeout=max(0.01, min(left, next_bookmark - time.monotonic(), 5.0)))
                            pending = [e for e in st.events if e[0] > last and e[1] == res]
                    current = st.rv
                if expired:
                    chunk("ERROR", status_body(410, "Expired", f"too old resource version: {last} ({st.oldest})"))
                    break
                for rv, _, etype, obj, old in pending:
                    last = rv
                    if etype == "MODIFIED" and old is not None:
                        was, is_ = match(old), match(obj)
                        if was and not is_:
                            chunk("DELETED", obj)
                        elif is_ and not was:
                            chunk("ADDED", obj)
                        elif is_:
                            chunk("MODIFIED", obj)
                    elif match(obj):
                        chunk(etype, obj)
                if not pending and bookmarks and time.monotonic() >= next_bookmark:
                    last = max(last, current)
                    with ctl.lock:
                        ctl.stats["bookmarks"] += 1
                    chunk("BOOKMARK", {"kind": kind, "apiVersion": api, "metadata": {"resourceVersion": str(last)}})
                    next_bookmark = time.monotonic() + self.bookmark_seconds
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()
        except _Drop:
            with ctl.lock:
                ctl.stats["watches_dropped"] += 1
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            self.close_connection = True
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True

    # -- objects

    def _object(self, verb, res, ns, name, q, body):
        kind, api, _ = RESOURCES[res]
        if verb == "GET":
            return self._send(200, self.store.get(res, ns, name))
        if verb == "DELETE":
            if body is not None:
                self._check_request(body, "DeleteOptions", "v1")
            with self.controls.lock:
                self.controls.stats["deletes"].append(f"{res}/{ns + '/' if ns else ''}{name}")
            if res == "pods":
                return self._send(200, self.store.delete_pod(ns, name, _grace(q, body)))
            return self._send(200, self.store.delete(res, ns, name))
        if verb == "PATCH":
            return self._patch(res, ns, name, body)
        raise HttpError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _status(self, verb, res, ns, name, q, body):
        if verb == "GET":
            return self._send(200, self.store.get(res, ns, name))
        if verb == "PATCH":
            return self._patch(res, ns, name, body)
        raise HttpError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")

    def _patch(self, res, ns, name, patch):
        kind, api, _ = RESOURCES[res]
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip()
        if ctype not in PATCH_TYPES:
            raise HttpError(415, "UnsupportedMediaType", "the body of the request was in an unknown format - "
                            "accepted media types include: " + ", ".join(PATCH_TYPES))
        if patch is None:
            raise HttpError(400, "BadRequest", "empty patch")
        with self.store.cv:  # read, check and write as one step
            o = self.store.get(res, ns, name)
            want = (patch.get("metadata") or {}).get("resourceVersion") if isinstance(patch, dict) else None
            if want is not None and want != o["metadata"]["resourceVersion"]:
                raise HttpError(409, "Conflict", f'Operation cannot be fulfilled on {res} "{name}": the object has '
                                "been modified; please apply your changes to the latest version and try again",
                                {"name": name, "kind": res})
            try:
                new = json_patch(o, patch) if ctype == "application/json-patch+json" else merge_patch(o, patch)
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise HttpError(422, "Invalid", f"the patch cannot be applied: {e}") from None
            errs = self.schemas.errors(new, kind, api)
            if errs:
                raise HttpError(422, "Invalid", f"{kind} {name!r} is invalid: {errs[0]}",
                                {"name": name, "kind": res,
                                 "causes": [{"reason": "FieldValueInvalid", "message": e} for e in errs[:5]]})
            out = self.store.update(res, ns, name, lambda _: new)
        self._send(200, out)

    def _eviction(self, verb, res, ns, name, q, body):
        if verb != "POST":
            raise HttpError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if not isinstance(body, dict):
            raise HttpError(400, "BadRequest", "expected a policy/v1 Eviction")
        body.setdefault("kind", "Eviction")
        body.setdefault("apiVersion", "policy/v1")
        if body["kind"] != "Eviction" or body["apiVersion"] not in ("policy/v1", "policy/v1beta1"):
            raise HttpError(400, "BadRequest", f"expected policy/v1 Eviction, got {body['apiVersion']} {body['kind']}")
        self._check_request(body, "Eviction", body["apiVersion"])
        if (body.get("metadata") or {}).get("name") != name:
            raise HttpError(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self.store.get("pods", ns, name)
        labels = pod["metadata"].get("labels") or {}
        pdbs, _ = self.store.items("poddisruptionbudgets", ns,
                                   lambda p: selector_match(p["spec"].get("selector"), labels))
        result = "evicted"
        try:
            if len(pdbs) > 1:
                raise HttpError(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the "
                                "eviction subresource does not support.")
            ignore_pdb = bool(pod["metadata"].get("deletionTimestamp")) or \
                (pod.get("status") or {}).get("phase") in ("Pending", "Succeeded", "Failed")
            if pdbs and not ignore_pdb and _allowed(self.store, pdbs[0], ns) <= 0:
                pdb = pdbs[0]["metadata"]["name"]
                raise HttpError(429, "TooManyRequests", "Cannot evict pod as it would violate the pod's disruption "
                                "budget.", {"causes": [{"reason": "DisruptionBudget",
                                                        "message": f"The disruption budget {pdb} needs more healthy "
                                                                   "pods to allow this eviction"}]})
            opts = body.get("deleteOptions") or {}
            self.store.delete_pod(ns, name, opts.get("gracePeriodSeconds") if isinstance(opts, dict) else None)
        except HttpError as e:
            result = str(e.code)
            raise
        finally:
            with self.controls.lock:
                self.controls.stats["evictions"].append({"pod": f"{ns}/{name}", "result": result, "at": time.time()})
        self._send(201, {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "code": 201})

    # -- admin

    def _access_review(self, verb, res, ns, name, q, body):
        """SelfSubjectAccessReview: allowed unless a rule of ``/_admin/rbac`` denies the attributes."""
        kind, api = "SelfSubjectAccessReview", "authorization.k8s.io/v1"
        if verb != "POST":
            raise HttpError(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
        if not isinstance(body, dict):
            raise HttpError(400, "BadRequest", f"expected a {kind} object")
        body.setdefault("kind", kind)
        body.setdefault("apiVersion", api)
        self._check_request(body, kind, api)
        spec = body.get("spec") or {}
        attrs = spec.get("resourceAttributes")
        if attrs is None and spec.get("nonResourceAttributes") is None:
            raise HttpError(422, "Invalid", f"{kind} is invalid: spec: Invalid value: exactly one of "
                                            "nonResourceAttributes or resourceAttributes must be specified")
        denied = False
        if attrs is not None:
            with self.controls.lock:
                rules = list(self.controls.denied)
            denied = any(r["verb"] in ("*", attrs.get("verb", "")) and r["resource"] == attrs.get("resource", "")
                         and r["subresource"] == attrs.get("subresource", "") for r in rules)
        out = {"apiVersion": api, "kind": kind, "metadata": {}, "spec": spec,
               "status": {"allowed": not denied, **({"denied": True, "reason": "denied by the test server's "
                                                     "RBAC rules (/_admin/rbac)"} if denied else
                                                    {"reason": "the test server allows everything"})}}
        self._send(201, out, kind, api)

    def _admin(self, verb, what, body):
        ctl = self.controls
        if verb == "GET" and what == "stats":
            with ctl.lock:
                out = json.loads(json.dumps(ctl.stats))
            out["resourceVersion"] = str(self.store.rv)
            return self._raw(200, out)
        if verb != "POST":
            raise HttpError(405, "MethodNotAllowed", "admin endpoints take POST (GET stats)")
        body = body or {}
        if what == "reset":
            self.store.reset()
            with ctl.lock:
                ctl.stats = ctl._fresh()
                ctl.drop_count = ctl.fail_count = 0
                ctl.denied = []
        elif what == "compact":
            self.store.compact()
        elif what == "drop-watches":
            with ctl.lock:
                ctl.drop_after = int(body.get("after_events", 0))
                ctl.drop_count = int(body.get("count", 1))
                ctl.drop_match = str(body.get("match", ""))
        elif what == "rbac":
            deny = body.get("deny", [])
            if not isinstance(deny, list) or not all(isinstance(d, dict) for d in deny):
                raise HttpError(400, "BadRequest", "rbac: deny must be a list of {verb, resource, subresource}")
            with ctl.lock:
                ctl.denied = [{k: str(d.get(k, "")) for k in ("verb", "resource", "subresource")} for d in deny]
        elif what == "fail":
            with ctl.lock:
                ctl.fail_status = int(body.get("status", 503))
                ctl.fail_count = int(body.get("count", 1))
                ctl.fail_match = str(body.get("match", ""))
        else:
            raise HttpError(404, "NotFound", f"no admin endpoint {what!r}")
        self._raw(200, {"ok": True, "resourceVersion": str(self.store.rv)})

    def _raw(self, code: int, obj: dict) -> None:
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class _Drop(Exception):
    """Cut this watch connection without the terminating chunk."""


def _parse_ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _ready(pod: dict) -> bool:
    """Healthy for a PodDisruptionBudget: condition Ready=True and not terminating."""
    if pod["metadata"].get("deletionTimestamp"):
        return False
    return any(isinstance(c, dict) and c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


def _grace(q: dict, body) -> int | None:
    """gracePeriodSeconds of a DELETE: the query parameter, else the DeleteOptions body."""
    raw = q.get("gracePeriodSeconds")
    if raw is None and isinstance(body, dict):
        raw = body.get("gracePeriodSeconds")
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        raise HttpError(400, "BadRequest", f"gracePeriodSeconds {raw!r} is not an integer") from None


def _allowed(store: Store, pdb: dict, ns: str) -> int:
    """Disruptions a PDB allows now (what the disruption controller would put in its status)."""
    sel = pdb["spec"].get("selector")
    matching, _ = store.items("pods", ns, lambda p: selector_match(sel, p["metadata"].get("labels") or {}))
    healthy = sum(1 for p in matching if _ready(p))
    expected = len(matching)

    def resolve(v, total):
        if isinstance(v, str) and v.endswith("%"):
            return -(-int(v[:-1]) * total // 100)
        return int(v)

    spec = pdb["spec"]
    if spec.get("minAvailable") is not None:
        return healthy - resolve(spec["minAvailable"], expected)
    if spec.get("maxUnavailable") is not None:
        return resolve(spec["maxUnavailable"], expected) - (expected - healthy)
    return healthy  # an empty PDB allows everything


def serve(host: str, port: int, token: str | None, schema_version: str, bookmark_seconds: float) -> ThreadingHTTPServer:
    Handler.store = Store()
    Handler.schemas = Schemas(schema_version)
    Handler.controls = Controls()
    Handler.token = token
    Handler.bookmark_seconds = bookmark_seconds
    srv = ThreadingHTTPServer((host, port), Handler)
    srv.daemon_threads = True
    store = Handler.store

    def reaper() -> None:
        while True:
            time.sleep(0.1)
            store.reap()

    threading.Thread(target=reaper, name="reaper", daemon=True).start()
    return srv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=16443)
    ap.add_argument("--token-file", help="file holding the bearer token every request must carry")
    ap.add_argument("--schema-version", default="1.34.0")
    ap.add_argument("--bookmark-seconds", type=float, default=1.0)
    ap.add_argument("--log-level", default="INFO")
    a = ap.parse_args()
    logging.basicConfig(level=a.log_level.upper(), format="%(asctime)s %(levelname)s %(message)s")
    token = open(a.token_file, encoding="utf-8").read().strip() if a.token_file else None
    srv = serve(a.host, a.port, token, a.schema_version, a.bookmark_seconds)
    log.info("Kubernetes API test server on http://%s:%d (schemas v%s)", a.host, a.port, a.schema_version)
    srv.serve_forever()


if __name__ == "__main__":
    main()
