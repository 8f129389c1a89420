"""The CLI's typed context object (``ctx.obj``): global options, lazily built config and runtime."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import typer

if TYPE_CHECKING:  # imported where they are built, so that --help stays fast
    from spotctl.core.config import Config
    from spotctl.core.identity import Identity
    from spotctl.ops.runtime import Runtime


@dataclass
class AppState:
    output: str | None = None
    region: str | None = None
    verbosity: int = 0
    quiet: bool = False
    debug: bool = False
    log_format: str = "plain"  # plain | json (--log-format, SPOTCTL_LOG_FORMAT): how stderr's lines look
    config_path: str | None = None
    state_dir: str | None = None
    command: str = ""
    _config: Config | None = None
    _runtime: Runtime | None = None
    identity: Identity | None = None  # who runs the command, when the region has [identity] (issue 15)
    _authorized: str | None = None  # the region whose identity was checked
    cleanups: list[Callable[[], object]] = field(default_factory=list)
    log_file: Path | None = None  # this run's DEBUG log file (named when the command fails)
    _log_handlers: tuple | None = None  # (stderr handler, file handler or None, region filter)

    def setup_logging(self, configured: str | None = None) -> None:
        """Logging, set up once per run at the entry point: stderr, with a prefix (or JSON lines with
        ``--log-format json``), at -v/-vv/--debug/-q when given, else the configured ``log_level``
        (SPOTCTL_LOG_LEVEL); and every DEBUG record in this run's log file (:meth:`open_log_file`). Called
        again once the config is read (its level, and the region every record then names)."""
        import logging

        if self.debug or self.verbosity >= 2:
            level = logging.DEBUG
        elif self.verbosity == 1:
            level = logging.INFO
        elif self.quiet:
            level = logging.ERROR
        else:
            level = getattr(logging, (configured or "warning").upper(), logging.WARNING)
        root = logging.getLogger()
        if self._log_handlers is None:
            from spotctl.logsetup import JsonFormatter, RegionFilter

            from .logs import LibraryFormatter, StderrHandler

            h = StderrHandler()
            h.setFormatter(JsonFormatter() if self.log_format == "json" else LibraryFormatter())
            h._spotctl = True  # type: ignore[attr-defined]
            region = RegionFilter()
            h.addFilter(region)
            for old in [x for x in root.handlers if getattr(x, "_spotctl", False) or getattr(x, "_spotctl_file", False)]:
                root.removeHandler(old)  # an earlier in-process run's (a test's, never closed)
                if getattr(old, "_spotctl_file", False):
                    _close_file(old)
            root.addHandler(h)
            h.setLevel(level)
            root.setLevel(level)  # a warning that no log file can be written obeys -q as any other
            file_handler = self.open_log_file(region)
            self._log_handlers = (h, file_handler, region)
            self.cleanups.append(self.close_log)
        h, file_handler, region = self._log_handlers
        h.setLevel(level)
        root.setLevel(logging.DEBUG if file_handler is not None else level)
        if self._config is not None:
            region.region = self.region or self._config.default_region
        from spotctl.wiring import quiet_libraries

        quiet_libraries(level)

    def open_log_file(self, region_filter):
        """This run's DEBUG log file under ``$XDG_STATE_HOME/spotctl/logs`` (the last 10 kept, as pipx does),
        its first lines what ran; None, after one warning, when the directory cannot be written (the
        command goes on without one)."""
        import logging
        import platform

        from spotctl import __version__
        from spotctl.logsetup import LineFormatter, log_dir, open_run_log, redacted_argv

        try:
            self.log_file, stream = open_run_log(log_dir())
        except OSError as e:
            logging.getLogger("spotctl").warning("no log file for this run: %s: %s", log_dir(), e.strerror or e)
            return None
        fh = logging.StreamHandler(stream)
        fh.setFormatter(LineFormatter(timestamps=True))
        fh.setLevel(logging.DEBUG)
        fh.addFilter(region_filter)
        fh._spotctl_file = True  # type: ignore[attr-defined]
        logging.getLogger().addHandler(fh)
        fh.handle(logging.makeLogRecord({
            "name": "spotctl", "levelno": logging.DEBUG, "levelname": "DEBUG",
            "msg": "spotctl %s (python %s, pid %d): %s", "args": (
                __version__, platform.python_version(), os.getpid(),
                " ".join(["spotctl", *redacted_argv(sys.argv[1:])]))}))
        return fh

    def log_file_level(self, level: int, why: str) -> None:
        """From now on the run's log file keeps records of ``level`` and above only (with ``why`` said in it),
        and records below both it and stderr's level are not even made: for a command whose work is thousands
        of passes (``simulate``), whose debug lines would cost more than they tell."""
        import logging

        if self._log_handlers is None or self._log_handlers[1] is None:
            return
        h, fh, _ = self._log_handlers
        self.log_to_file(logging.INFO, "%s: this file keeps %s records and above from here on",
                         why, logging.getLevelName(level))
        fh.setLevel(level)
        logging.getLogger().setLevel(min(h.level, level))

    def log_to_file(self, level: int, msg: str, *args, exc: BaseException | None = None) -> None:
        """A record for this run's log file only (the error site's: what stderr already told, with its
        traceback)."""
        import logging

        fh = self._log_handlers[1] if self._log_handlers else None
        if fh is None:
            return
        record = logging.makeLogRecord({"name": "spotctl", "levelno": level, "levelname": logging.getLevelName(level),
                                        "msg": msg, "args": args})
        if exc is not None:
            record.exc_info = (type(exc), exc, exc.__traceback__)
        try:
            fh.handle(record)
        except Exception:
            pass

    def close_log(self) -> None:
        import logging

        if self._log_handlers is None:
            return
        h, fh, _ = self._log_handlers
        root = logging.getLogger()
        if fh is not None:
            root.removeHandler(fh)
            _close_file(fh)
            self._log_handlers = (h, None, self._log_handlers[2])  # nothing more goes to the closed file
        root.setLevel(h.level)  # no DEBUG records made for nobody after the run

    def config(self) -> Config:
        if self._config is None:
            self.setup_logging()
            from spotctl.core.config import load_config

            env = dict(os.environ)
            if self.config_path:
                env["SPOTCTL_CONFIG"] = self.config_path
            self._config = load_config(env=env, host=True, flags={"default_region": self.region, "state_dir": self.state_dir,
                                                      "output": self.output})
            self.setup_logging(self._config.log_level)
            self.authorize()
        return self._config

    def authorize(self) -> None:
        """Before a command does anything to a region with ``[identity]``: who runs it (the cached login,
        checked and refreshed), and whether their roles allow the command. Not logged in where a login is
        required: exit 4. A role missing: exit 6 (``forbidden``), the refusal audited, nothing else done.
        Without ``[identity]`` (the demo region) the actor is the OS user."""
        from spotctl.core.identity import UNGATED, IdentitySettings

        verb = self.command
        if verb in UNGATED or verb in SELF_CHECKED or self._config is None:
            return
        region = self._config.region(self.region)
        if self._authorized == region.name:
            return
        settings = IdentitySettings.of(region.section("identity"))
        self._authorized = region.name
        if settings is None:
            return
        import time

        from spotctl.core.identity import Forbidden
        from spotctl.ops.identity import require
        from spotctl.wiring import identity_port

        port = identity_port(region)
        try:
            self.identity = require(port, settings, region.name, time.time(), verb)
        except Forbidden as refusal:
            from spotctl.wiring import audit_refusal

            audit_refusal(self._config, region, refusal)
            raise

    def actor(self) -> str | None:
        """The actor of this command's records: the logged-in identity, else None (the region's ``actor``
        or the OS user)."""
        return str(self.identity.actor) if self.identity is not None else None

    def fmt(self) -> str:
        """table | json | yaml: flags > SPOTCTL_OUTPUT > config file > table on a TTY, JSON otherwise."""
        out = (self.output or os.environ.get("SPOTCTL_OUTPUT") or "").lower()
        if not out and self._config is not None:
            out = self._config.output
        if out not in ("table", "json", "yaml"):  # auto, or a bad value the config load refuses
            out = "auto"
        if out == "auto":
            return "table" if sys.stdout.isatty() else "json"
        return out

    def runtime(self) -> Runtime:
        if self._runtime is None:
            from spotctl.wiring import build_runtime

            from .waiting import LockSpinner

            config = self.config()
            self._runtime = build_runtime(config, self.region, progress=self.progress, actor=self.actor(),
                                          identity=self.identity)
            self._runtime.lock_wait = LockSpinner(self)  # a wait for the region lock shows on stderr
            self.cleanups.append(self._runtime.store.close)
        return self._runtime

    def progress(self, message: str) -> None:
        import logging

        self.log_to_file(logging.INFO, "%s", message)
        if self.quiet:
            return
        if self.log_format == "json":
            import time

            from spotctl.logsetup import JsonFormatter

            region = self._log_handlers[2].region if self._log_handlers else None
            record = logging.makeLogRecord({"name": "spotctl.progress", "levelno": logging.INFO, "levelname": "INFO",
                                            "msg": message, "created": time.time(), "region": region})
            print(JsonFormatter().format(record), file=sys.stderr, flush=True)
        else:
            print(f"spotctl: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        while self.cleanups:
            self.cleanups.pop()()


def _close_file(handler) -> None:
    """Close a run log's handler and its file (a StreamHandler leaves its stream open)."""
    handler.close()
    handler.stream.close()


#: Commands that find out who is logged in themselves (and need no role for it).
SELF_CHECKED = frozenset({"whoami", "config show"})


def state(ctx: typer.Context) -> AppState:
    obj = ctx.find_root().obj
    if not isinstance(obj, AppState):
        obj = ctx.find_root().obj = AppState()
    obj.command = " ".join(ctx.command_path.split()[1:]) or obj.command
    return obj
