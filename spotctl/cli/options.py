"""Checks for option values, where they enter: finite numbers in range, URLs, addresses, bounded text.

Typer's own ``min``/``max`` cover integers; these cover what it does not (NaN and infinity pass a float
range, a URL or a host is just a string to it). Each raises ``typer.BadParameter``, which the error site
turns into one ``spotctl: error: --opt …`` line and exit 2.

Also the shell completion of option values and arguments (:func:`complete_pool`, :func:`complete_node`),
given to ``typer.Option``/``typer.Argument`` as ``autocompletion=``."""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable
from typing import Any

import typer

MAX_REASON = 1000  # characters of a --reason: it goes into audit records and scheduler reasons


def _n(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else f"{v:g}"


def finite(lo: float | None = None, hi: float | None = None, gt: float | None = None) -> Callable:
    """A float option: finite, and within ``[lo, hi]`` (``gt``: strictly above)."""

    def check(value: float | None) -> float | None:
        if value is None:
            return value
        if not math.isfinite(value):
            raise typer.BadParameter(f"must be a finite number, got {value!r}")
        if (lo is not None and value < lo) or (hi is not None and value > hi) or (gt is not None and value <= gt):
            parts = ([f"> {_n(gt)}"] if gt is not None else []) + ([f">= {_n(lo)}"] if lo is not None else []) \
                + ([f"<= {_n(hi)}"] if hi is not None else [])
            raise typer.BadParameter(f"must be {' and '.join(parts)}, got {_n(value)}")
        return value

    return check


def url(value: str | None) -> str | None:
    """An http(s) URL with a host."""
    if value is None:
        return value
    from urllib.parse import urlsplit

    try:
        u = urlsplit(value)
        u.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError as e:
        raise typer.BadParameter(f"is not a valid URL ({e}): {cut(value)}") from None
    if u.scheme not in ("http", "https") or not u.hostname or any(c.isspace() for c in value):
        raise typer.BadParameter(f"must be an http:// or https:// URL with a host, got {cut(value)}")
    return value


def host(value: str | None) -> str | None:
    """An IP address or a DNS name to listen on."""
    if value is None:
        return value
    import ipaddress
    import re

    try:
        ipaddress.ip_address(value)
        return value
    except ValueError:
        pass
    labels = value.rstrip(".").split(".")
    dotted_quad = all(p.isdigit() for p in labels)
    ok = not dotted_quad and len(value) <= 253 and all(
        re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?", p) for p in labels)
    if not ok:
        raise typer.BadParameter(f"is not an IP address or host name, got {cut(value)}")
    return value


def text(limit: int) -> Callable:
    """Free text of at most ``limit`` characters, on one line."""

    def check(value: str | None) -> str | None:
        if value is None:
            return value
        if len(value) > limit:
            raise typer.BadParameter(f"is {len(value)} characters long; at most {limit} are kept")
        if any(c in value for c in "\r\n\0"):
            raise typer.BadParameter("must be one line (no newline or NUL)")
        return value

    return check


def name(value: str | None) -> str | None:
    """A node, drill or pool id: one word of printable characters, at most 253 of them."""
    if value is None:
        return value
    if not value or len(value) > 253 or any(c.isspace() or not c.isprintable() for c in value):
        raise typer.BadParameter(f"is not an id (one word, at most 253 printable characters): {cut(value)}")
    return value


def cut(value: object, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: what an error echoes of a user's input."""
    r = repr(value)
    return r if len(r) <= limit else r[: limit - 1] + "…'"


# -- shell completion -------------------------------------------------------------------------------------
# Called by the shell on each Tab (``_SPOTCTL_COMPLETE=complete_bash``, see completions/): they read the config
# and, for node ids, the region's state database read-only — no network, no region lock, no simulated world,
# nothing created — and print nothing: any error (no config, no database yet, a locked or damaged file) gives
# no candidates. Typer passes the click context, whose root holds the global options parsed so far
# (``spotctl -r lab drain <Tab>`` completes lab's nodes).

Candidates = list[tuple[str, str]]  # (value, help: shown by zsh and fish)


def _quietly(read: Callable[[typer.Context], Candidates], ctx: typer.Context) -> Candidates:
    import contextlib
    import io
    import logging

    before = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            return read(ctx)
    except Exception:  # a completion never fails, and never says why on the user's prompt
        return []
    finally:
        logging.disable(before)


def _region(ctx: typer.Context):
    """The config and region the command would use, from the global options given so far."""
    import os

    from spotctl.core.config import load_config

    opts = ctx.find_root().params
    env = dict(os.environ)
    if opts.get("config"):
        env["SPOTCTL_CONFIG"] = opts["config"]
    config = load_config(env=env, host=True, flags={"default_region": opts.get("region"),
                                                    "state_dir": opts.get("state_dir")})
    return config, config.region(opts.get("region"))


def _pools(ctx: typer.Context) -> Candidates:
    from .fmt import shape_of

    _, region = _region(ctx)
    return [(name, f"{p.kind.value}, {p.pool_class.value}, {shape_of(p.shape)}, az {p.az}")
            for name, p in sorted(region.pools.items())]


def _nodes(ctx: typer.Context) -> Candidates:
    import sqlite3

    from spotctl.core.lifecycle import DRAINABLE
    from spotctl.wiring import state_path

    config, region = _region(ctx)
    path = state_path(config, region.name)
    if not path.is_file():
        return []  # no database yet: nothing to complete, and nothing is created
    states = [s.value for s in DRAINABLE]
    conn = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True, timeout=0.5)
    try:
        rows = conn.execute(f"SELECT id, pool, state FROM nodes WHERE state IN ({','.join('?' * len(states))}) "
                            "ORDER BY id", states).fetchall()
    finally:
        conn.close()
    return [(str(i), f"{state} in {pool}") for i, pool, state in rows]


def complete_pool(ctx: typer.Context, incomplete: str) -> Candidates:
    """``--pool <Tab>``: the region's pool names, from the config."""
    return [c for c in _quietly(_pools, ctx) if c[0].startswith(incomplete)]


def complete_node(ctx: typer.Context, incomplete: str) -> Candidates:
    """``drain <Tab>``: the ids of the region's drainable nodes (building, active, advised), from its state
    database, read-only."""
    return [c for c in _quietly(_nodes, ctx) if c[0].startswith(incomplete)]


# -- values without pydantic -------------------------------------------------------------------------------
# Typer turns every option and argument value into its Python type through a pydantic TypeAdapter built on
# first use, and builds it even for a value that needs nothing (an option not given: None; a count: 0), so
# any sub-command, `spotctl plan --help` included, imports pydantic (~50-100 ms). The values that need no
# parsing, or whose parsing is plain (digits to an int, a choice), are taken here the way Typer's adapters
# take them; anything else, and any value that fails, goes through Typer's own coercion unchanged (so its
# errors, which cli.errors words from pydantic's, stay the same).

_SLOW = object()
_INT = re.compile(r"-?[0-9]{1,18}")  # longer: Typer's coercion (and Python's limit on int digits) decides
_FLOAT = re.compile(r"-?[0-9]{1,18}(\.[0-9]{1,18})?")


def _plain(param: Any, value: Any, ctx: Any) -> Any:
    """``value`` as Typer's coercion would give it, or ``_SLOW`` when only Typer's coercion can tell."""
    if value is None:
        return () if param.multiple or param.nargs == -1 else None
    td = param.type_descriptor
    info, ann = td.parameter_info, td.annotation
    if param.multiple or param.nargs != 1 or info.parser is not None or td.file_annotation is not None:
        return _SLOW
    if ann is str:
        return value if type(value) is str else _SLOW
    if isinstance(ann, type) and issubclass(ann, enum.Enum):
        from typer._param_types import coerce_cli_choice

        try:
            return coerce_cli_choice(value, choices=list(ann), case_sensitive=info.case_sensitive, ctx=ctx)
        except ValueError:
            return _SLOW
    if ann is int or ann is float:
        if type(value) is str and (_INT if ann is int else _FLOAT).fullmatch(value):
            value = ann(value)
        if type(value) is not ann or info.clamp or not math.isfinite(value):
            return _SLOW
        if (info.min is not None and value < info.min) or (info.max is not None and value > info.max):
            return _SLOW  # out of range: Typer's coercion says so
        return value
    return _SLOW


class PlainValues:
    """Stands in for Typer's coercion of one parameter (its ``_runtime_param``): :func:`_plain` first, Typer's
    own (and pydantic) only for what that leaves."""

    def __init__(self) -> None:
        self.full: Any = None

    def coerce(self, value: Any, param: Any, ctx: Any) -> Any:
        out = _plain(param, value, ctx)
        if out is not _SLOW:
            return out
        if self.full is None:
            from typer._coercion import build_runtime_param

            self.full = build_runtime_param(param.type_descriptor)
        return self.full.coerce(value, param=param, ctx=ctx)


def plain_values(cmd: Any, ctx: Any = None) -> None:
    """Give each Typer parameter of ``cmd`` (and of its sub-commands, once built) :class:`PlainValues`; with the
    context ``cmd`` is reached from, its ``-h/--help`` option too (click builds that one on first use, from
    the context's help option names, which sub-commands inherit). A Typer without the private
    ``_runtime_param`` hook is left as it is: slower, the same values."""
    params = list(getattr(cmd, "params", []))
    own = (getattr(cmd, "context_settings", None) or {}).get("help_option_names")
    if ctx is not None and own in (None, ctx.help_option_names) and hasattr(cmd, "get_help_option"):
        params.append(cmd.get_help_option(ctx))
    for p in params:
        if hasattr(p, "type_descriptor") and getattr(p, "_runtime_param", False) is None:
            p._runtime_param = PlainValues()
    for sub in (getattr(cmd, "commands", None) or {}).values():
        plain_values(sub, ctx)
