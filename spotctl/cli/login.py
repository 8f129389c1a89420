"""spotctl login / logout / whoami (issue 15): OIDC identities against the region's Keycloak realm."""

from __future__ import annotations

import sys
import time
from typing import Annotated, Any, Optional

import typer

from spotctl.core.errors import ConfigError, ExitCode

from . import render
from .context import state

login_app = typer.Typer(rich_markup_mode=None, add_completion=False)
logout_app = typer.Typer(rich_markup_mode=None, add_completion=False)
whoami_app = typer.Typer(rich_markup_mode=None, add_completion=False)


def _realm(ctx: typer.Context) -> tuple[Any, Any, Any, Any]:
    """The app state, the region, its identity settings and its identity port; ConfigError without
    ``[identity]``."""
    from spotctl.core.identity import IdentitySettings
    from spotctl.wiring import identity_port

    st = state(ctx)
    region = st.config().region(st.region)
    settings = IdentitySettings.of(region.section("identity"))
    if settings is None:
        raise ConfigError(f"region {region.name!r} has no [identity]: there is nothing to log in to",
                          hint=f"add [regions.{region.name}.identity] (server_url, realm): see docs/identity.md")
    return st, region, settings, identity_port(region)


def _show_identity(console, d: dict) -> None:
    if d.get("identity") in ("none", "optional, not logged in"):
        console.print(f"{d['actor']} (region {d['region']}: identity {d['identity']})")
        return
    console.print(f"{d['name']} ({d['identity']}) in {d['issuer']}")
    console.print(f"  sub {d['sub']}, client {d['client']}")
    console.print(f"  realm roles: {', '.join(d['realm_roles']) or 'none'}")
    for client, roles in d["client_roles"].items():
        console.print(f"  roles of client {client}: {', '.join(roles) or 'none'}")
    console.print(f"  expires in {d['expires_in_seconds']} s; region {d['region']}")


@login_app.command()
def login(
    ctx: typer.Context,
    client_credentials: Annotated[bool, typer.Option(
        "--client-credentials", help="Log in as a service account (CI jobs, timers) with its client secret.")] = False,
    client_id: Annotated[Optional[str], typer.Option(
        "--client-id", help="The service account's client (with --client-credentials; default: the region's "
                            "service_client_id).", show_default=False)] = None,
    secret_file: Annotated[Optional[str], typer.Option(
        "--secret-file", help="File holding the client secret (never give the secret itself on the command line).",
        show_default=False)] = None,
    secret_env: Annotated[str, typer.Option(
        "--secret-env", help="Environment variable holding the client secret, when no --secret-file.")]
        = "SPOTCTL_CLIENT_SECRET",
) -> None:
    """Log in to the region's Keycloak realm.

    By default the OAuth device flow (RFC 8628), which needs no browser on
    this host: open the URL it prints anywhere, enter the code, and approve.
    The tokens are cached under $XDG_CACHE_HOME/spotctl/identity (mode 0600),
    refreshed before they expire, and checked before every use. With
    --client-credentials, a service account logs in with its secret, read
    from --secret-file or an environment variable. Exit 4 when the login is
    denied, expires, or the secret is wrong.

    Example: spotctl login -r east --client-credentials --client-id spot-ci --secret-file /run/secrets/ci
    """
    from spotctl.ops.identity import SecretSource, describe, login_client, login_device
    from spotctl.ops.runtime import os_actor

    st, region, settings, port = _realm(ctx)
    if client_credentials:
        cid = client_id or settings.service_client_id
        source = SecretSource(file=secret_file) if secret_file else SecretSource(env=secret_env)
        ident = login_client(port, settings, region.name, cid, source, time.time())
    else:
        if client_id or secret_file:
            raise typer.BadParameter("--client-id and --secret-file go with --client-credentials")

        def show(start: dict) -> None:
            err = sys.stderr
            print(f"spotctl: to log in to {settings.issuer}, open {start.get('verification_uri')}", file=err)
            print(f"spotctl: and enter the code {start.get('user_code')}", file=err)
            if start.get("verification_uri_complete"):
                print(f"spotctl: (or open {start['verification_uri_complete']})", file=err)
            print(f"spotctl: waiting for the approval (the code expires in {int(start.get('expires_in') or 600)} s; "
                  "Ctrl-C to stop)", file=err, flush=True)

        ident = login_device(port, settings, region.name, show=show)
    data = describe(ident, settings, region.name, os_actor(), time.time())
    render.emit(st.fmt(), "login", data, table=_show_identity)


@logout_app.command()
def logout(ctx: typer.Context) -> None:
    """Log out of the region: revoke the cached sessions at Keycloak, delete the cache.

    The cache is deleted even when the server cannot be reached (said, with
    exit 7: the session then ends only at its expiry).

    Example: spotctl logout -r east
    """
    from spotctl.ops.identity import logout as do_logout

    st, region, settings, port = _realm(ctx)
    data = do_logout(port, settings, region.name)
    failed = [s for s in data["sessions"] if s["revoked"] is False]
    code = ExitCode.PARTIAL if failed else ExitCode.OK

    def table(console, d: dict) -> None:
        if not d["sessions"]:
            console.print(f"not logged in to region {d['region']}")
        for s in d["sessions"]:
            state_ = {True: "revoked", False: f"NOT revoked ({s['error']})", None: "nothing to revoke"}[s["revoked"]]
            console.print(f"logged out: {s['identity']} ({state_}); cache deleted")

    render.emit(st.fmt(), "logout", data, status="partial" if failed else "ok", exit_code=int(code), table=table)
    if failed:
        raise typer.Exit(int(code))


@whoami_app.command()
def whoami(ctx: typer.Context) -> None:
    """Show who you act as in the region: identity, realm and client roles, expiry.

    Without [identity] (the demo region), the OS user. Exit 4 when the
    region requires a login and nobody is logged in (or the session ended).

    Example: spotctl whoami -o json
    """
    from spotctl.core.identity import IdentitySettings
    from spotctl.ops.identity import current, describe
    from spotctl.ops.runtime import os_actor
    from spotctl.wiring import identity_port

    st = state(ctx)
    region = st.config().region(st.region)
    settings = IdentitySettings.of(region.section("identity"))
    ident = None
    if settings is not None:
        ident = current(identity_port(region), settings, region.name, time.time())
        if ident is None and settings.required:
            from spotctl.core.errors import AuthError

            raise AuthError(f"not logged in to region {region.name!r}", hint=f"run `spotctl login -r {region.name}`")
    data = describe(ident, settings, region.name, region.actor or os_actor(), time.time())
    render.emit(st.fmt(), "whoami", data, table=_show_identity)
