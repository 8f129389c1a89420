"""One error tree for the whole project.

Every error the user can meet is a :class:`SpotctlError` with a stable ``code``
(for scripts reading JSON) and an :class:`ExitCode` (for shells). Adapters
translate SDK errors into these at their boundary; the CLI and the reconciler
have exactly one place each that catches them.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    """Exit codes shared by ``spotctl`` and ``spot-reconciler``.

    The man pages' EXIT STATUS section is generated from this enum.
    """

    OK = 0
    UNEXPECTED = 1
    USAGE = 2
    CONFIG = 3
    AUTH = 4
    NOT_FOUND = 5
    REFUSED = 6
    PARTIAL = 7
    UNAVAILABLE = 8
    STATE = 9
    OUTPUT = 10
    BUNDLE_INVALID = 20
    BUNDLE_UNTRUSTED = 21
    BUNDLE_DIGEST = 22
    BUNDLE_FILES = 23
    BUNDLE_EXPIRED = 24
    BUNDLE_ROLLBACK = 25
    INTERRUPTED = 130
    PIPE = 141
    TERMINATED = 143


EXIT_CODE_HELP: dict[ExitCode, str] = {
    ExitCode.OK: "success (also: a pass skipped because another pass holds the lock)",
    ExitCode.UNEXPECTED: "unexpected internal error (a bug: run again with --debug and report it)",
    ExitCode.USAGE: "bad command-line usage (unknown option, invalid value)",
    ExitCode.CONFIG: "invalid configuration (malformed file, unknown key, bad value)",
    ExitCode.AUTH: "authentication or authorisation failed",
    ExitCode.NOT_FOUND: "a named thing does not exist (region, pool, node, record)",
    ExitCode.REFUSED: "refused: a guardrail, limit, budget or conflicting state forbids it",
    ExitCode.PARTIAL: "partial: the pass ran but some steps failed or a source was unavailable",
    ExitCode.UNAVAILABLE: "a backend (cloud, scheduler, feed) could not be reached",
    ExitCode.STATE: "the state database is unreadable, corrupt, read-only, or was deleted or replaced while "
                    "in use (nothing was changed)",
    ExitCode.OUTPUT: "standard output could not be written (closed, or the disk is full)",
    ExitCode.BUNDLE_INVALID: "bundle: not a valid bundle (not a tar, a manifest that breaks its schema, another region's)",
    ExitCode.BUNDLE_UNTRUSTED: "bundle: not signed by a trusted key",
    ExitCode.BUNDLE_DIGEST: "bundle: a file does not match its digest in the manifest (tampered with)",
    ExitCode.BUNDLE_FILES: "bundle: a file the manifest lists is missing, or one it does not list is there",
    ExitCode.BUNDLE_EXPIRED: "bundle: expired (freeze protection)",
    ExitCode.BUNDLE_ROLLBACK: "bundle: its revision is older than the last one accepted (rollback protection)",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C / SIGINT)",
    ExitCode.PIPE: "the reader of the output went away (e.g. `| head`): stopped quietly, as on SIGPIPE",
    ExitCode.TERMINATED: "terminated (SIGTERM): stopped as after Ctrl-C, nothing left half-done",
}


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the process is (as Ctrl-C raises KeyboardInterrupt), so that every
    ``finally`` and interrupt handler runs: pass rows, drills and temp directories are closed."""


class SpotctlError(Exception):
    """Base of every error spotctl reports to a user."""

    code = "error"
    exit_code = ExitCode.UNEXPECTED

    def __init__(self, message: str, *, hint: str | None = None, details: dict[str, Any] | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.details = details or {}

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.hint:
            d["hint"] = self.hint
        if self.details:
            d["details"] = self.details
        return d


class UsageError(SpotctlError):
    code = "usage"
    exit_code = ExitCode.USAGE


class ConfigError(SpotctlError):
    code = "config"
    exit_code = ExitCode.CONFIG


class AuthError(SpotctlError):
    code = "auth"
    exit_code = ExitCode.AUTH


class NotFoundError(SpotctlError):
    code = "not_found"
    exit_code = ExitCode.NOT_FOUND


class RefusedError(SpotctlError):
    code = "refused"
    exit_code = ExitCode.REFUSED


class UnavailableError(SpotctlError):
    """A backend could not be reached or answered with a server error."""

    code = "unavailable"
    exit_code = ExitCode.UNAVAILABLE


class TemporaryError(UnavailableError):
    """Retry later (409/429/5xx/timeouts). Steps return it as an outcome."""

    code = "temporary"


class CapacityError(SpotctlError):
    """The cloud has no room (NoValidHost, quota exceeded) in one pool."""

    code = "capacity"
    exit_code = ExitCode.REFUSED


class StateError(SpotctlError):
    """The state database cannot be used; nothing was written."""

    code = "state"
    exit_code = ExitCode.STATE


class InterruptedError_(SpotctlError):
    code = "interrupted"
    exit_code = ExitCode.INTERRUPTED
