"""Credentials and TLS: a :class:`~.api.Connection` from kubeconfig files (:func:`load_kubeconfig`) or from
the pod's service account (:func:`in_cluster`), read by the official ``kubernetes`` client's configuration
loading (``kubernetes.config``, imported on first use) — so exec credential plugins (kubelogin/OIDC, cloud
token plugins) and auth providers work as they do for kubectl.

The official loader fills a ``kubernetes.client.Configuration``; we read its host, CA, verify flag, client
certificate and key into our Connection and keep our own requests-based client. A user's token file
(``tokenFile``) is re-read by us whenever it changes; an exec plugin's or auth provider's credentials stay
with the official loader, whose refresh hook runs the plugin again once its token expires
(``expirationTimestamp``), and again after the server refused them (a 401, as client-go does). Every
problem — no file, bad YAML, an unknown context, a plugin that fails — is one ConfigError line.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from spotctl.core.errors import AuthError, ConfigError

from .api import Connection

if TYPE_CHECKING:  # pragma: no cover
    from kubernetes.client import Configuration
    from kubernetes.config.kube_config import KubeConfigLoader

SERVICEACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
_LOADER_ERRORS = (OSError, ValueError, TypeError, KeyError, AttributeError)  # besides its ConfigException
_PLUGIN_HINT = "run the user's exec command by hand to see why it fails, or use a token or client certificate"


def _configuration() -> Configuration:
    """A fresh official Configuration (its constructor resets the levels of the ``urllib3`` and ``client``
    loggers: put them back, logging is set up by our entry points)."""
    from kubernetes.client import Configuration

    loggers = [logging.getLogger(name) for name in ("urllib3", "client")]
    levels = [lg.level for lg in loggers]
    cfg = Configuration()
    for lg, level in zip(loggers, levels):
        lg.setLevel(level)
    return cfg


@contextmanager
def _plugin_errors() -> Iterator[list[str]]:
    """Collect what the official loader reports while it runs an exec plugin. It does not raise when the plugin
    fails: it logs the error on the root logger and goes on without credentials. We keep that record off the
    log and raise it as our own error instead."""
    errors: list[str] = []
    here = f"{os.sep}kubernetes{os.sep}config{os.sep}"

    def catch(record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR and here in record.pathname:
            errors.append(record.getMessage())
            return False
        return True

    root = logging.getLogger()
    guard = logging.NullHandler()  # with no handler at all, logging.error() would call basicConfig()
    root.addFilter(catch)
    root.addHandler(guard)
    try:
        yield errors
    finally:
        root.removeFilter(catch)
        root.removeHandler(guard)


class KubeconfigCredentials:
    """An exec plugin's (or auth provider's) credentials, kept by the official loader: the token or client
    certificate the plugin gave, renewed by the Configuration's refresh hook once it expires, and by loading
    again after a 401. Thread-safe: a drain fan-out asks from many threads, the plugin runs once."""

    def __init__(self, loader: KubeConfigLoader, cfg: Configuration, where: str):
        self._loader = loader
        self._cfg = cfg
        self.where = where  # for messages: which kubeconfig, context and user
        self._lock = threading.Lock()
        self._stale = False

    def __repr__(self) -> str:  # never shows the token
        return f"KubeconfigCredentials({self.where!r})"

    def authorization(self) -> str | None:
        from kubernetes.config.config_exception import ConfigException

        with self._lock, _plugin_errors() as errors:
            try:
                if self._stale:
                    self._stale = False
                    self._loader.load_and_set(self._cfg)
                value = self._cfg.get_api_key_with_prefix("BearerToken")  # runs the refresh hook
            except (ConfigException, *_LOADER_ERRORS) as e:
                raise ConfigError(f"kubeconfig {self.where}: {e}") from None
        if errors:  # the old token stays in place: do not send it, say why there is no new one
            raise AuthError(f"kubeconfig {self.where}: the exec plugin failed to renew the credentials: "
                            f"{errors[-1].removeprefix('exec: ')}", hint=_PLUGIN_HINT)
        return value

    def cert(self) -> tuple[str, str] | None:
        cert, key = self._cfg.cert_file, self._cfg.key_file
        return (cert, key) if cert and key else None

    def invalidate(self) -> None:
        self._stale = True


def load_kubeconfig(paths: list[str], context: str | None) -> Connection:
    """A Connection from kubeconfig file(s), merged like kubectl (the first definition of a name wins), for
    ``context`` (default: the current one)."""
    import yaml
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import ENV_KUBECONFIG_PATH_SEPARATOR, KubeConfigLoader, KubeConfigMerger

    found = [str(Path(p).expanduser()) for p in paths if Path(p).expanduser().is_file()]
    if not found:
        raise ConfigError(f"no kubeconfig found (looked at {', '.join(paths)})",
                          hint="set kubeconfig in [regions.R.kubernetes], or in_cluster = true")
    source = ", ".join(found)
    try:
        merged = KubeConfigMerger(ENV_KUBECONFIG_PATH_SEPARATOR.join(found)).config
        name = context or merged.value.get("current-context")
        if not name:
            raise ConfigError(f"kubeconfig {source} has no current-context; set `context` in [regions.R.kubernetes]")
        known = [getattr(c, "value", c).get("name") for c in merged.value.get("contexts") or []]
        if name not in known:
            raise ConfigError(f"kubeconfig {source}: no context named {name!r} (it has: {', '.join(known) or '-'})")
        cfg = _configuration()
        cfg.host = ""  # so that a cluster without a server shows
        with _plugin_errors() as errors:
            loader = KubeConfigLoader(config_dict=merged, active_context=name, config_base_path=None)
            loader.load_and_set(cfg)
        ctx = merged["contexts"].get_with_name(name).value.get("context") or {}
        user_node = merged["users"].get_with_name(ctx["user"], safe=True) if ctx.get("user") else None
    except yaml.YAMLError as e:
        raise ConfigError(f"cannot read kubeconfig {source}: {e}") from None
    except (ConfigException, *_LOADER_ERRORS) as e:
        raise ConfigError(f"kubeconfig {source}: {e}") from None
    where = f"{source} (context {name})"
    user = (user_node.value.get("user") if user_node is not None else None) or {}
    if errors:
        raise ConfigError(f"kubeconfig {where}: the exec plugin of user {ctx.get('user')!r} failed: "
                          f"{errors[-1].removeprefix('exec: ')}", hint=_PLUGIN_HINT)
    if not cfg.host:
        raise ConfigError(f"kubeconfig {where}: cluster {ctx.get('cluster')!r} has no server")
    conn = Connection(server=cfg.host, source=where, ca_file=cfg.ssl_ca_cert, verify=bool(cfg.verify_ssl),
                      client_cert=cfg.cert_file, client_key=cfg.key_file)
    if user.get("exec") or user.get("auth-provider"):
        conn.credentials = KubeconfigCredentials(loader, cfg, f"{where}, user {ctx.get('user')!r}")
    elif user.get("token"):
        conn.token = str(user["token"])
    elif user.get("tokenFile"):  # read by the Api, again whenever it changes (the official loader reads it once)
        base = os.path.dirname(user_node.path) if user_node is not None and user_node.path else "."
        conn.token_file = os.path.normpath(os.path.join(base, os.path.expanduser(str(user["tokenFile"]))))
    elif user.get("username") is not None:
        conn.username, conn.password = str(user["username"]), str(user.get("password") or "")
    return conn


def in_cluster(sa_dir: str = SERVICEACCOUNT_DIR, env: dict | None = None) -> Connection:
    """The pod's service account, by the official in-cluster loader: KUBERNETES_SERVICE_HOST/PORT, token and
    CA from ``sa_dir``. The token file is re-read by the Api whenever it changes (it rotates)."""
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.incluster_config import InClusterConfigLoader

    token = os.path.join(sa_dir, "token")
    cfg = _configuration()
    try:
        InClusterConfigLoader(token_filename=token, cert_filename=os.path.join(sa_dir, "ca.crt"),
                              try_refresh_token=False, environ=os.environ if env is None else env).load_and_set(cfg)
    except (ConfigException, OSError) as e:
        raise ConfigError(f"in_cluster = true, but the pod's service account is not usable: {str(e).rstrip('.')} "
                          f"(KUBERNETES_SERVICE_HOST/PORT, and token and ca.crt in {sa_dir}); not running in a pod?"
                          ) from None
    return Connection(server=cfg.host, token_file=token, ca_file=cfg.ssl_ca_cert, source="in-cluster service account")
