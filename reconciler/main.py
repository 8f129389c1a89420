"""spot-reconciler: one reconcile pass per invocation (the systemd timer's job).

Exit codes are the ones spotctl uses: 0 ok (or skipped: another pass holds the
lock), 2 usage, 3 config, 5 unknown region, 7 partial, 8 backend unavailable, 9 state,
10 the metrics file could not be written.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import socket
import sys
import time

from spotctl.core.errors import ExitCode, SpotctlError

log = logging.getLogger("spot-reconciler")


def service_login(config, region_name: str | None, verb: str):
    """The reconciler's service account, where the region has ``[identity]``: a client-credentials token
    (cached; renewed with the secret from ``service_secret_file``, systemd's ``LoadCredential=`` or
    ``$SPOTCTL_CLIENT_SECRET``), checked, and its roles allowing ``verb``. None without ``[identity]``."""
    from spotctl.core.identity import Forbidden, IdentitySettings, authorize
    from spotctl.ops.identity import service_identity, service_secret
    from spotctl.wiring import identity_port

    region = config.region(region_name)
    settings = IdentitySettings.of(region.section("identity"))
    if settings is None:
        return None
    ident = service_identity(identity_port(region), settings, region.name, time.time(), service_secret(settings))
    try:
        authorize(verb, ident, settings.roles)
    except Forbidden as refusal:  # audited, as the CLI's refusals are
        from spotctl.wiring import audit_refusal

        audit_refusal(config, region, refusal)
        raise
    return ident


def setup_logging(fmt: str, level: int):
    """stderr, as JSON lines for journald (``--log-format json``) or plain lines: the formatters the
    ``spotctl`` CLI uses too (:mod:`spotctl.logsetup`)."""
    from spotctl.logsetup import JsonFormatter, LineFormatter, RegionFilter

    h = logging.StreamHandler(sys.stderr)
    h.setFormatter(JsonFormatter() if fmt == "json" else LineFormatter())
    region = RegionFilter()  # every line names the region once it is known
    h.addFilter(region)
    root = logging.getLogger()
    root.handlers[:] = [h]
    root.setLevel(level)
    from spotctl.wiring import quiet_libraries

    quiet_libraries(level)
    return region


def _seconds(text: str) -> float:
    import math

    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text[:60]!r}") from None
    if not math.isfinite(v) or not 0 < v <= 300:
        raise argparse.ArgumentTypeError(f"must be > 0 and <= 300 seconds, got {text[:60]!r}")
    return v


def _check_metrics_file(path: str) -> str | None:
    """Why ``--metrics-file`` cannot be written (checked before the pass, so a pass is not run for nothing)."""
    target = os.path.abspath(path)
    parent = os.path.dirname(target)
    if os.path.isdir(target):
        return f"--metrics-file {path} is a directory"
    if not os.path.isdir(parent):
        return f"--metrics-file {path}: directory {parent} does not exist"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--metrics-file {path}: directory {parent} is not writable"
    return None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="spot-reconciler",
        description="Run one spotctl reconcile pass for a region (for a systemd timer), or, with `watch`, "
                    "long-poll the provider's notices and handle each at once (a long-running service).",
        epilog="Exit status: 0 ok or skipped, 2 usage, 3 config, 5 unknown region, 7 partial, "
               "8 backend unavailable, 9 state database, 10 metrics file not written, 1 unexpected, "
               "130 interrupted, 143 terminated.")
    p.add_argument("mode", nargs="?", choices=("pass", "watch"), default="pass",
                   help="pass (default): one reconcile pass; watch: the notice fast path, until SIGTERM")
    p.add_argument("--wait", type=_seconds, default=20.0, help="watch: long-poll seconds per request (default 20)")
    p.add_argument("--region", "-r", default=os.environ.get("SPOTCTL_REGION"), help="region (default: config default)")
    p.add_argument("--config", help="config file (same as SPOTCTL_CONFIG)")
    p.add_argument("--state-dir", help="state directory (default: $XDG_STATE_HOME/spotctl)")
    p.add_argument("--dry-run", action="store_true", help="observe and plan, act on nothing")
    p.add_argument("--log-format", choices=("plain", "json"), default=None,
                   help="plain lines, or JSON lines for journald (default: $SPOTCTL_LOG_FORMAT, else plain)")
    p.add_argument("--metrics-file", help="pass: write the region's Prometheus metrics here after the pass "
                   "(atomically; for node_exporter's textfile collector)")
    p.add_argument("--metrics-listen", type=_listen, metavar="[HOST:]PORT",
                   help="watch: serve the region's metrics on http://HOST:PORT/metrics (HOST default 127.0.0.1)")
    p.add_argument("-v", "--verbose", action="count", default=0)
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.log_format is None:  # the environment's value is checked as a flag's is (argparse leaves defaults be)
        chosen = os.environ.get("SPOTCTL_LOG_FORMAT", "").strip().lower() or "plain"
        if chosen not in ("plain", "json"):
            p.error(f"SPOTCTL_LOG_FORMAT must be plain or json, got {chosen[:60]!r}")
        args.log_format = chosen
    import signal

    from spotctl.core.errors import Terminated

    def on_term(signum, frame):  # a pass stops as after Ctrl-C: its row and intents are closed, exit 143
        raise Terminated()

    signal.signal(signal.SIGTERM, on_term)
    region_filter = setup_logging(args.log_format, logging.DEBUG if args.verbose > 1 else logging.INFO if args.verbose else logging.WARNING)
    if args.metrics_file and (why := _check_metrics_file(args.metrics_file)):
        log.error("%s", why)
        return int(ExitCode.USAGE)
    try:
        from spotctl.core.config import load_config
        from spotctl.ops.reconcile import run_pass
        from spotctl.wiring import build_runtime

        env = dict(os.environ)
        if args.config:
            env["SPOTCTL_CONFIG"] = args.config
        config = load_config(env=env, host=True, flags={"default_region": args.region, "state_dir": args.state_dir})
        region_filter.region = args.region or config.default_region
        if not args.verbose:  # -v/-vv win; else the configured log_level (SPOTCTL_LOG_LEVEL)
            logging.getLogger().setLevel(config.log_level.upper())
        identity = service_login(config, args.region, "watch" if args.mode == "watch" else "reconcile")
        actor = str(identity.actor) if identity is not None else f"spot-reconciler@{socket.gethostname()}"
        rt = build_runtime(config, args.region, actor=actor, progress=lambda m: log.info("%s", m), identity=identity)
        try:
            if args.mode == "watch":
                return run_watch(rt, args.wait, args.metrics_listen)
            result = run_pass(rt, dry_run=args.dry_run)
            written = _write_metrics(rt, args.metrics_file, result.status) if args.metrics_file else None
        finally:
            rt.store.close()
    except SpotctlError as e:
        log.error("%s%s", e.message, f" (hint: {e.hint})" if e.hint else "")
        return int(e.exit_code)
    except KeyboardInterrupt as e:
        term = isinstance(e, Terminated)
        log.error("%s", "terminated (SIGTERM)" if term else "interrupted")
        return int(ExitCode.TERMINATED if term else ExitCode.INTERRUPTED)
    except Exception as e:  # a bug: one line; the traceback with -vv
        log.error("internal error: %s: %s (a bug: run with -vv for the traceback, and report it)",
                  type(e).__name__, str(e)[:200], exc_info=args.verbose > 1)
        return int(ExitCode.UNEXPECTED)
    summary = {
        "region": result.region, "status": result.status, "duration_s": round(result.duration_s, 3),
        "actions": len(result.plan.actions) if result.plan else 0,
        "outcomes": {s: sum(1 for o in result.outcomes if o.status == s) for s in ("ok", "failed", "partial", "skipped")},
        "tokens_used": result.tokens_used, "tokens_left": round(result.tokens_left, 3),
        "degraded": sorted(result.degraded),
    }
    try:
        print(json.dumps(summary), flush=True)
    except BrokenPipeError:
        pass
    if written is False:
        return int(ExitCode.OUTPUT)
    if result.auth_failed:
        log.error("%s refused our credentials", ", ".join(result.auth_failed))
        return int(ExitCode.AUTH)
    return 0 if result.status in ("ok", "skipped", "dry-run") else int(ExitCode.PARTIAL)


def _write_metrics(rt, path: str, status: str) -> bool:
    """The region's metrics as a node_exporter textfile (prometheus_client, atomically); False when it could
    not be written (exit 10: the pass itself ran and is recorded)."""
    from spotctl.ops.metrics import write_textfile

    try:
        write_textfile(rt, path)
    except OSError as e:
        log.error("the pass ran (%s) but --metrics-file %s could not be written: %s", status, path, e.strerror or e)
        return False
    return True


def run_watch(rt, wait: float, listen: tuple[str, int] | None = None) -> int:
    """The fast path: handle notices as they arrive until SIGTERM/SIGINT; with ``listen``, ``/metrics`` too."""
    import signal
    import threading

    from spotctl.ops.watch import watch

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = None
    if listen is not None:
        from spotctl.ops.metrics import serve

        try:
            server = serve(rt, *listen)
        except OSError as e:
            log.error("--metrics-listen %s:%d: %s", listen[0], listen[1], e.strerror or e)
            return int(ExitCode.USAGE)
        log.info("metrics on http://%s:%d/metrics", listen[0], server.server_address[1])
    log.info("watching notices for region %s", rt.region.name)
    try:
        stats = watch(rt, stop=stop, wait=wait, on_event=lambda ev: print(json.dumps(ev), flush=True))
    finally:
        if server is not None:
            server.shutdown()
            server.server_close()
    log.info("watcher stopped: %s", stats)
    return 0


def _listen(text: str) -> tuple[str, int]:
    """``--metrics-listen``: ``PORT`` (on 127.0.0.1) or ``HOST:PORT``; port 0 picks a free one."""
    host, _, port = text.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    try:
        n = int(port)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not HOST:PORT or PORT: {text[:60]!r}") from None
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"port must be 0-65535, got {n}")
    return host, n


def run() -> None:
    t0 = time.monotonic()
    try:
        code = main()
    finally:
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):  # done: a late signal must not turn the exit code into -N
            signal.signal(sig, signal.SIG_IGN)
    log.debug("exit %s after %.3fs", code, time.monotonic() - t0)
    sys.exit(code)


if __name__ == "__main__":
    run()
