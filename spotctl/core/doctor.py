"""``spotctl doctor``: what each check observed, turned into its result, its remediation hint and the exit code.

Pure: the probes (``spotctl.ops.doctor`` runs them; the adapters, the store and ``spotctl.wiring`` make them)
report what they saw as a :class:`Seen`; :func:`judge` decides. A check ``pass``es only on an answer that
was observed (rule 1): a call that answered, a file whose mode and contents were read. ``info`` is a check
that does not apply here and says why (no systemd on this host, a token cache not created yet); it is not a
failure. ``skipped`` is a check not made because the one it needs failed (no endpoint is asked once
keystone refused the login). A ``fail`` carries the exit code of what went wrong.

Exit code of the whole run (:func:`exit_code`): 0 when nothing failed; else the first of, in this order,
4 (a backend refuses our credentials, or Kubernetes RBAC denies a verb spotctl needs), 8 (a backend
cannot be reached), 9 (the state database), 3 (configuration), then any other failure's own code. Auth
wins over unavailable: a refused credential needs an operator to act, an outage may pass by itself, and a
run that exits 4 still lists the unreachable backends in its table.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from .errors import ExitCode

PASS, FAIL, INFO, SKIPPED = "pass", "fail", "info", "skipped"
RESULTS = (PASS, FAIL, INFO, SKIPPED)

#: Which failure decides the exit code when several checks fail: the first in this list that occurs.
PRECEDENCE = (ExitCode.AUTH, ExitCode.UNAVAILABLE, ExitCode.STATE, ExitCode.CONFIG)

#: The systemd units of ``contrib/systemd`` (templates instantiated per region: ``%i`` is the region name).
#: ``required``: the unit must be enabled and running on a control host of the region; else it is reported.
SYSTEMD_UNITS: tuple[tuple[str, str], ...] = (
    ("spot-reconciler@{region}.timer", "required"),   # the pass timer
    ("spot-reconciler@{region}.service", "pass"),     # the pass itself: a oneshot, inactive between passes
    ("spot-reconciler-watch@{region}.service", "watch"),  # the notice fast path: needs a [contract] feed
    ("spot-bundle-server@{region}.service", "optional"),  # only on hosts that serve bundles
)

#: Kubernetes access spotctl needs (SelfSubjectAccessReview attributes), with why.
K8S_ACCESS: tuple[tuple[str, str, str, str], ...] = (
    # verb, resource, subresource, why
    ("list", "pods", "", "to find pending pods and what runs on our nodes"),
    ("watch", "pods", "", "to keep the pod cache current between passes"),
    ("get", "nodes", "", "to read a node before patching it"),
    ("patch", "nodes", "", "to cordon, taint and annotate our nodes"),
    ("create", "pods", "eviction", "to drain our nodes (the Eviction API)"),
    ("delete", "pods", "", "to delete pods that cannot move before a hard notice's deadline"),
    ("delete", "nodes", "", "to remove the node objects of instances that are gone"),
)


class Kind(str, Enum):
    """What a probe looks at: decides which judge reads its facts."""

    CALL = "call"          # a network call: answered (pass) or raised (fail with its error's exit code)
    STATE_DB = "state_db"  # facts: exists, mode, schema_version, code_schema_version, problems
    PRIVATE_DIR = "private_dir"  # facts: exists, mode (the token cache: 0700)
    ACCESS = "access"      # facts: allowed, reason, verb, resource (a Kubernetes access review)
    SYSTEMD = "systemd"    # facts: systemd (bool), units {name: {LoadState, UnitFileState, ActiveState, Result}}
    TOPIC = "topic"        # facts: topic, partitions (None: the broker does not know the topic)


@dataclass(frozen=True)
class Observed:
    """What a probe's call returned: a line of evidence and the facts its judge reads."""

    detail: str
    facts: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Probe:
    """One check to make: ``run`` makes the one cheap call (bounded by the adapter's timeout, never retried)
    and returns what it saw; it raises a :class:`~spotctl.core.errors.SpotctlError` when the call fails.
    ``needs``: the check (by ``check`` name) that must pass first; when it does not, this one is skipped."""

    check: str
    target: str
    run: Callable[[], Observed]
    kind: Kind = Kind.CALL
    needs: str | None = None
    context: Mapping[str, str] = field(default_factory=dict)  # for the hint: url, cloud, user, path, ...


@dataclass(frozen=True)
class Seen:
    """What one probe observed, or how it failed (``error``: the error's code, message, hint, exit code)."""

    check: str
    target: str
    kind: Kind = Kind.CALL
    detail: str = ""
    facts: Mapping[str, Any] = field(default_factory=dict)
    error_code: str | None = None
    error_hint: str | None = None
    error_exit: int | None = None
    skipped_because: str | None = None
    elapsed_s: float = 0.0
    context: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Result:
    check: str
    target: str
    result: str
    detail: str
    hint: str | None = None
    exit_code: int = 0
    elapsed_s: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return {"check": self.check, "target": self.target, "result": self.result, "detail": self.detail,
                "hint": self.hint, "exit_code": self.exit_code, "elapsed_s": round(self.elapsed_s, 3)}


# --- hints -------------------------------------------------------------------------------------------------

#: (check, error code or 'fail') -> the remediation hint, formatted with the probe's context (and target).
#: A check missing here falls back to ("*", code), then to the adapter's own hint.
HINTS: dict[tuple[str, str], str] = {
    ("openstack.auth", "auth"): ("the cloud refuses the credentials of clouds.yaml entry {cloud}: check them with "
                                 "`openstack --os-cloud {cloud} token issue` (user, password or application "
                                 "credential, project, domain)"),
    ("openstack.auth", "unavailable"): ("keystone at {target} cannot be reached: check auth_url of clouds.yaml "
                                        "entry {cloud}, the network, and that keystone runs"),
    ("openstack.auth", "config"): "fix clouds.yaml entry {cloud} (or regions.{region}.cloud / $OS_CLOUD)",
    ("openstack.nova", "unavailable"): ("Nova's API ({target}) does not answer: check that nova-api runs and "
                                        "that the catalog's compute endpoint is right (`openstack endpoint list "
                                        "--service compute`)"),
    ("openstack.placement", "unavailable"): ("Placement ({target}) does not answer: check that the placement API "
                                             "runs and the catalog's placement endpoint (`openstack endpoint list "
                                             "--service placement`)"),
    ("openstack.blazar", "unavailable"): ("Blazar ({target}) does not answer: check blazar-api and the catalog's "
                                          "reservation endpoint; or set regions.{region}.openstack.blazar = false "
                                          "to run without reservation data (its pools lose the forward calendar)"),
    ("openstack.ironic", "unavailable"): ("Ironic ({target}) does not answer: check ironic-api and the catalog's "
                                          "baremetal endpoint (`openstack endpoint list --service baremetal`)"),
    ("*openstack", "auth"): ("the cloud refuses this call with our token: give the account of clouds.yaml entry "
                             "{cloud} the role the service needs in its project"),
    ("slurm.version", "unavailable"): ("slurmrestd at {target} does not answer: is it running and listening "
                                       "there (`systemctl status slurmrestd`)? Check regions.{region}.slurm.url"),
    ("slurm.version", "auth"): ("the token ({source}) cannot be used (refused, expired, not a JWT or of another "
                                "user): generate a new one with `scontrol token username={user} lifespan=SECONDS` "
                                "and write it to the token file"),
    ("slurm.auth", "auth"): ("slurmctld refuses the token of user {user} ({source}): generate a new one with "
                             "`scontrol token username={user} lifespan=SECONDS` (the JWT key of slurmctld and "
                             "slurmrestd must be the same: AuthAltParameters=jwt_key=...)"),
    ("slurm.auth", "unavailable"): ("slurmrestd answers but slurmctld does not: check slurmctld "
                                    "(`scontrol ping`, `systemctl status slurmctld`)"),
    ("kubernetes.auth", "auth"): ("the Kubernetes API refuses the credentials of {source}: check the token, the "
                                  "exec plugin or the client certificate (`kubectl --kubeconfig ... auth whoami`)"),
    ("kubernetes.auth", "not_found"): ("the server at {target} has no authorization.k8s.io/v1 access review API: "
                                       "is it the Kubernetes API server itself (not a proxy or another service)?"),
    ("kubernetes.auth", "unavailable"): ("the Kubernetes API at {target} cannot be reached: check the server "
                                         "address of {source} and the network (`kubectl cluster-info`)"),
    ("kubernetes.rbac", "fail"): ("grant spotctl's account `{verb}` on {resource} (a ClusterRole bound to it: see "
                                  "the RBAC manifest in docs/wire-your-region.md); check with `kubectl auth can-i "
                                  "{verb} {resource}`"),
    ("kafka.metadata", "unavailable"): ("the Kafka brokers {target} do not answer: check "
                                        "regions.{region}.kafka.bootstrap_servers and that the brokers run; "
                                        "lifecycle events stay queued in the outbox meanwhile"),
    ("kafka.metadata", "auth"): ("the brokers refuse our credentials: check the SASL/TLS settings of "
                                 "regions.{region}.kafka"),
    ("kafka.metadata", "fail"): ("the brokers do not know topic {topic}: create it (`kafka-topics.sh --create "
                                 "--topic {topic}`) or let the brokers create topics (auto.create.topics.enable)"),
    ("audit.service", "unavailable"): ("the audit service at {target} does not answer: check that it runs and "
                                       "regions.{region}.audit.url; audit records stay queued in the outbox "
                                       "meanwhile (`spotctl status` shows the backlog)"),
    ("audit.service", "auth"): ("the audit service refuses our token: check regions.{region}.audit.token_file "
                                "(the token the service was given)"),
    ("oidc.discovery", "unavailable"): ("Keycloak's realm at {target} does not answer: check "
                                        "regions.{region}.identity.server_url and realm, and that Keycloak runs"),
    ("oidc.jwks", "unavailable"): ("Keycloak publishes no signing keys at {target}: check the realm's keys "
                                   "(Realm settings > Keys) and the network"),
    ("oidc.service_token", "auth"): ("Keycloak refuses the secret of client {client}: check its secret file "
                                     "({source}) against the client's credentials in Keycloak, and that "
                                     "the client has service accounts enabled"),
    ("oidc.service_token", "unavailable"): "Keycloak's token endpoint at {target} does not answer",
    ("oidc.service_token", "config"): ("set regions.{region}.identity.service_secret_file, or load the secret "
                                       "with systemd's LoadCredential= ({client})"),
    ("contract.rate_card", "unavailable"): ("the contract feed at {target} does not answer: check "
                                            "regions.{region}.contract.url; the region's pools degrade to the "
                                            "no-notice policy while it is down"),
    ("contract.static", "unavailable"): ("the region has no [regions.{region}.contract] feed and its pools no "
                                         "`price`: configure the provider's contract feed (or a list price per pool)"),
    ("contract.rate_card", "auth"): "the contract feed refuses our token: check regions.{region}.contract.token_file",
    ("*sim", "unavailable"): "the embedded simulator could not be read: run `spotctl reconcile` and see its error",
}

STATE_HINTS = {
    "missing": "no pass has run yet: the first `spotctl reconcile` (or timer pass) creates it",
    "mode": "chmod 600 {path} (and its -wal/-shm files): it holds the region's audit trail and budget",
    "older": ("the state database has schema version {schema_version}, this spotctl {code_schema_version}: the "
              "next command that opens it migrates it (back it up first: `sqlite3 {path} .backup copy.db`)"),
    "newer": ("the state database has schema version {schema_version}, newer than this spotctl understands "
              "({code_schema_version}): upgrade spotctl on this host"),
    "corrupt": ("the state database is corrupt: stop the timer, restore it from a backup "
                "(docs/operator-guide.md, backups), then `spotctl audit verify`"),
    "unreadable": "{error}: check the file and its directory ({path})",
}


def _fmt(template: str, seen: Seen, extra: Mapping[str, Any] | None = None) -> str:
    values: dict[str, Any] = {"target": seen.target, **seen.context, **dict(extra or {})}

    class Default(dict[str, Any]):
        def __missing__(self, key: str) -> str:
            return "{" + key + "}"

    return template.format_map(Default(values))


def _hint(seen: Seen, code: str, extra: Mapping[str, Any] | None = None) -> str | None:
    family = "*" + seen.check.split(".", 1)[0]
    for key in ((seen.check, code), (family, code), ("*", code)):
        if key in HINTS:
            return _fmt(HINTS[key], seen, extra)
    return seen.error_hint


def _error_kind(seen: Seen) -> str:
    """The hint key of a raised error: auth, unavailable, config, state or its own code."""
    if seen.error_exit == ExitCode.AUTH:
        return "auth"
    if seen.error_exit == ExitCode.UNAVAILABLE:
        return "unavailable"
    return seen.error_code or "error"


# --- judges ----------------------------------------------------------------------------------------------


def judge(seen: Seen) -> Result:
    """The result of one check from what its probe saw."""
    if seen.skipped_because is not None:
        return Result(seen.check, seen.target, SKIPPED, f"not checked: {seen.skipped_because}", None, 0,
                      seen.elapsed_s)
    if seen.error_code is not None:
        kind = _error_kind(seen)
        exit_ = int(seen.error_exit if seen.error_exit is not None else ExitCode.UNEXPECTED)
        return Result(seen.check, seen.target, FAIL, seen.detail, _hint(seen, kind) or seen.error_hint, exit_,
                      seen.elapsed_s)
    judges: dict[Kind, Callable[[Seen], Result]] = {
        Kind.CALL: _call, Kind.STATE_DB: _state_db, Kind.PRIVATE_DIR: _private_dir, Kind.ACCESS: _access,
        Kind.SYSTEMD: _systemd, Kind.TOPIC: _topic}
    return judges[seen.kind](seen)


def _ok(seen: Seen, detail: str | None = None) -> Result:
    return Result(seen.check, seen.target, PASS, detail or seen.detail, None, 0, seen.elapsed_s)


def _fail(seen: Seen, detail: str, hint: str | None, code: int) -> Result:
    return Result(seen.check, seen.target, FAIL, detail, hint, int(code), seen.elapsed_s)


def _info(seen: Seen, detail: str) -> Result:
    return Result(seen.check, seen.target, INFO, detail, None, 0, seen.elapsed_s)


def _call(seen: Seen) -> Result:
    if not seen.detail:  # a probe that says nothing of what it saw proves nothing
        return _fail(seen, "the probe returned no evidence", None, ExitCode.UNEXPECTED)
    return _ok(seen)


def world_access(mode: int) -> list[str]:
    """What others (not the owner, not the group) may do with a file of this mode: ``world-readable``,
    ``world-writable``."""
    return [what for bit, what in ((0o004, "world-readable"), (0o002, "world-writable")) if mode & bit]


def _state_db(seen: Seen) -> Result:
    f = seen.facts
    path = f.get("path", seen.target)
    if not f.get("exists"):
        return _info(seen, f"no state database at {path} yet; " + STATE_HINTS["missing"])
    if f.get("error"):
        return _fail(seen, f"cannot read {path}: {f['error']}", _fmt(STATE_HINTS["unreadable"], seen, f),
                     ExitCode.STATE)
    problems: list[str] = []
    hints: list[str] = []
    modes = dict(f.get("modes") or {})  # file -> mode, the database and its -wal/-shm files
    open_to_all = {name: world_access(int(m)) for name, m in modes.items() if world_access(int(m))}
    if open_to_all:
        problems.append("; ".join(f"{name} is {' and '.join(w)} (mode {int(modes[name]):04o})"
                                  for name, w in sorted(open_to_all.items())))
        hints.append(_fmt(STATE_HINTS["mode"], seen, f))
    version, code_version = f.get("schema_version"), f.get("code_schema_version")
    if version != code_version:
        older = isinstance(version, int) and isinstance(code_version, int) and version < code_version
        problems.append(f"schema version {version}, this spotctl's is {code_version}")
        hints.append(_fmt(STATE_HINTS["older" if older else "newer"], seen, f))
    integrity = list(f.get("problems") or [])
    if integrity:
        problems.append(f"{f.get('check', 'integrity_check')} found {len(integrity)} problem(s): "
                        + "; ".join(integrity[:3])[:300])
        hints.append(_fmt(STATE_HINTS["corrupt"], seen, f))
    if problems:
        return _fail(seen, "; ".join(problems), " — ".join(hints), ExitCode.STATE)
    mode_text = ", ".join(f"{name} {int(m):04o}" for name, m in sorted(modes.items()))
    return _ok(seen, f"{f.get('check', 'integrity_check')} ok; schema version {version} (this spotctl's); "
                     f"mode {mode_text}; {int(f.get('size', 0))} bytes")


def _private_dir(seen: Seen) -> Result:
    f = seen.facts
    path = f.get("path", seen.target)
    if not f.get("exists"):
        return _info(seen, f"{path} does not exist yet (`spotctl login` creates it with mode 0700)")
    mode = int(f.get("mode", 0))
    if mode & 0o077:
        return _fail(seen, f"{path} has mode {mode:04o}: others than its owner may enter it",
                     f"chmod 700 {path} (it holds the region's cached tokens); then `spotctl login` again if "
                     f"someone else may have read them", ExitCode.CONFIG)
    return _ok(seen, f"{path} has mode {mode:04o} (owner only)")


def _access(seen: Seen) -> Result:
    f = seen.facts
    verb, resource = f.get("verb", "?"), f.get("resource", "?")
    if f.get("allowed") is True:
        return _ok(seen, f"allowed ({seen.detail})")
    reason = f.get("reason") or "no reason given"
    return _fail(seen, f"denied: {reason} ({seen.detail})",
                 _hint(seen, "fail", {"verb": verb, "resource": resource}), ExitCode.AUTH)


def _topic(seen: Seen) -> Result:
    f = seen.facts
    parts = f.get("partitions")
    if parts is None:
        return _fail(seen, f"the brokers do not know topic {f.get('topic')} ({seen.detail})",
                     _hint(seen, "fail", {"topic": f.get("topic")}), ExitCode.PARTIAL)
    return _ok(seen)


def systemd_expectation(role: str, region_has_contract: bool) -> str:
    """``required``, ``optional`` or ``pass`` for a unit of :data:`SYSTEMD_UNITS` in a region."""
    if role == "watch":
        return "required" if region_has_contract else "optional"
    return role


def _systemd(seen: Seen) -> Result:
    f = seen.facts
    if not f.get("systemd"):
        return _info(seen, f"systemd does not run on this host ({f.get('why') or 'no /run/systemd/system'}): "
                           "the units are not checked (a container or the demo)")
    units: dict[str, dict[str, str]] = dict(f.get("units") or {})
    roles: dict[str, str] = dict(f.get("roles") or {})
    seen_text, problems, hints = [], [], []
    loaded = {name: u for name, u in units.items() if u.get("LoadState") == "loaded"}
    if not loaded:
        return _info(seen, "no spotctl unit is installed on this host (" + ", ".join(sorted(units)) + " not found): "
                           "the timer does not run passes here; install them on the region's control hosts "
                           "(contrib/systemd, docs/operator-guide.md)")
    for name in sorted(units):
        u, role = units[name], roles.get(name, "optional")
        state = f"{u.get('LoadState')}/{u.get('UnitFileState') or '-'}/{u.get('ActiveState')}"
        seen_text.append(f"{name} {state}")
        if u.get("LoadState") != "loaded":
            if role == "required":
                problems.append(f"{name} is not installed")
                hints.append(f"install contrib/systemd/{_template(name)} and `systemctl enable --now {name}`")
            continue
        if role == "pass":
            if u.get("Result") not in (None, "", "success"):
                problems.append(f"{name}'s last run failed (result {u.get('Result')})")
                hints.append(f"`journalctl -u {name}` shows the failed pass")
            continue
        if role == "required" and u.get("UnitFileState") not in ("enabled", "static", "indirect", "generated"):
            problems.append(f"{name} is not enabled ({u.get('UnitFileState')})")
            hints.append(f"`systemctl enable --now {name}`")
        elif role == "required" and u.get("ActiveState") != "active":
            problems.append(f"{name} is {u.get('ActiveState')}")
            hints.append(f"`systemctl start {name}`; `journalctl -u {name}` says why it stopped")
    if problems:
        return _fail(seen, "; ".join(problems) + " (" + "; ".join(seen_text) + ")", "; ".join(hints),
                     ExitCode.PARTIAL)
    return _ok(seen, "; ".join(seen_text))


def _template(unit: str) -> str:
    """``spot-reconciler@east.timer`` -> ``spot-reconciler@.timer`` (the file in contrib/systemd)."""
    if "@" not in unit:
        return unit
    head, rest = unit.split("@", 1)
    return f"{head}@.{rest.rsplit('.', 1)[-1]}"


# --- the whole run --------------------------------------------------------------------------------------


def exit_code(results: list[Result]) -> int:
    """0 when no check failed; else by :data:`PRECEDENCE`, then the first failure's own code."""
    failed = [r.exit_code for r in results if r.result == FAIL]
    if not failed:
        return int(ExitCode.OK)
    for code in PRECEDENCE:
        if int(code) in failed:
            return int(code)
    return failed[0] or int(ExitCode.UNEXPECTED)


def summary(region: str, backend: str, results: list[Result]) -> dict[str, Any]:
    """The data of ``spotctl doctor``'s envelope."""
    counts = {r: sum(1 for x in results if x.result == r) for r in RESULTS}
    return {"region": region, "backend": backend, "ok": counts[FAIL] == 0, "counts": counts,
            "exit_code": exit_code(results), "checks": [r.to_dict() for r in results]}
