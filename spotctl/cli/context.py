"""The CLI's typed context object (``ctx.obj``): global options, lazily built config and runtime."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
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
    config_path: str | None = None
    state_dir: str | None = None
    command: str = ""
    _config: Config | None = None
    _runtime: Runtime | None = None
    identity: Identity | None = None  # who runs the command, when the region has [identity] (issue 15)
    _authorized: str | None = None  # the region whose identity was checked
    cleanups: list[Callable[[], object]] = field(default_factory=list)

    def setup_logging(self, configured: str | None = None) -> None:
        """Logging, set up once per process at the entry point: stderr, with a prefix. The level is
        -v/-vv/--debug/-q when given, else the configured ``log_level`` (SPOTCTL_LOG_LEVEL)."""
        import logging

        from .logs import LibraryFormatter, StderrHandler

        if self.debug or self.verbosity >= 2:
            level = logging.DEBUG
        elif self.verbosity == 1:
            level = logging.INFO
        elif self.quiet:
            level = logging.ERROR
        else:
            level = getattr(logging, (configured or "warning").upper(), logging.WARNING)
        root = logging.getLogger()
        if not any(getattr(h, "_spotctl", False) for h in root.handlers):
            h = StderrHandler()
            h.setFormatter(LibraryFormatter())
            h._spotctl = True  # type: ignore[attr-defined]
            root.addHandler(h)
        root.setLevel(level)
        from spotctl.wiring import quiet_libraries

        quiet_libraries(level)

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
        if not self.quiet:
            print(f"spotctl: {message}", file=sys.stderr, flush=True)

    def close(self) -> None:
        while self.cleanups:
            self.cleanups.pop()()


#: Commands that find out who is logged in themselves (and need no role for it).
SELF_CHECKED = frozenset({"whoami", "config show"})


def state(ctx: typer.Context) -> AppState:
    obj = ctx.find_root().obj
    if not isinstance(obj, AppState):
        obj = ctx.find_root().obj = AppState()
    obj.command = " ".join(ctx.command_path.split()[1:]) or obj.command
    return obj
