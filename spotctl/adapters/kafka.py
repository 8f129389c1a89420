"""Lifecycle events to Kafka: the outbox relay's producer (kafka-python).

Region table ``[regions.R.kafka]``::

    bootstrap_servers = "kafka1:9092,kafka2:9092"   # required
    topic = "spot.lifecycle.R"                       # default spot.lifecycle.<region>
    client_id = "spotctl-R"                          # default spotctl-<region>
    max_wait_seconds = 10        # longest a pass waits for an unavailable broker
    batch_size = 500             # events per produce batch / transaction
    transactions = true          # a transaction per batch; a broker without them is a degraded state
    security_protocol = "SASL_SSL"   # PLAINTEXT | SSL | SASL_PLAINTEXT | SASL_SSL
    sasl_mechanism = "SCRAM-SHA-512"
    sasl_plain_username = "spotctl"
    sasl_plain_password = "..."      # or sasl_password_file (re-read at each connection: rotation)
    ssl_cafile = "/etc/ssl/certs/kafka-ca.pem"

Guarantees: ``acks=all`` and an idempotent producer (no broker-side duplicates
from retries, order kept per partition); each batch in one transaction with a
stable ``transactional.id`` per region when the broker supports them, so that
a relay killed mid-batch leaves nothing visible to ``read_committed``
consumers and the next relay fences the dead one. Records are CloudEvents 1.0
in structured mode (``content-type: application/cloudevents+json``), keyed by
node id (one node's events stay in one partition, in order): each value is an
outbox row as it is stored, the event's structured JSON document built with
the ``cloudevents`` SDK (``spotctl.state.outbox``), so that a consumer using the
SDK's Kafka binding (``cloudevents.core.bindings.kafka.from_structured_event``,
or ``from_kafka_event``, which detects the mode) reads it. A batch counts as
delivered only when the broker acknowledged all of it (and the transaction
committed). Consumers must still drop duplicates by CloudEvents ``id``: a crash
between the broker's acknowledgement and the outbox mark re-sends the batch.

The producer's **mode** (``KafkaRelay.mode``) is known after the first
connection: ``transactional``, ``idempotent`` or ``acks-all`` (acks=all only:
a broker older than 0.11). Which one is decided from what the broker offers
(its ApiVersions: InitProducerId, AddPartitionsToTxn, EndTxn), so nothing here
is specific to a broker implementation. A mode weaker than the configuration
asks for (``transactions = true`` → transactional; ``false`` → idempotent) is
not silent: ``KafkaRelay.degraded`` says why, the adapter logs a warning, and
the relay step records it as a degraded state of the pass that ``spotctl
status`` and the reconciler's metrics show (``spotctl.ops.relay``). Setting
``transactions = false`` accepts the idempotent producer: its weaker crash
behaviour (a relay killed mid-batch can leave part of the batch visible, sent
again by the next pass) is then the operator's choice, not a degradation.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from spotctl.core.config import RegionConfig
from spotctl.core.errors import AuthError, ConfigError, TemporaryError, UnavailableError
from spotctl.core.secrets import SecretFile

log = logging.getLogger(__name__)

#: the structured content mode's media type (the SDK's ``JSONFormat.CONTENT_TYPE``), with its charset
CONTENT_TYPE = b"application/cloudevents+json; charset=UTF-8"
#: Kafka API keys a transactional producer needs (KIP-98), and the one an idempotent producer needs.
TXN_APIS = {22: "InitProducerId", 24: "AddPartitionsToTxn", 26: "EndTxn"}
IDEMPOTENCE_API = 22
MODES = ("transactional", "idempotent", "acks-all")
_SECURITY_KEYS = ("security_protocol", "sasl_mechanism", "sasl_plain_username", "sasl_plain_password",
                  "ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_check_hostname")


class KafkaRelay:
    """Publishes outbox events to one topic; implements ``spotctl.ops.relay.Outlet``."""

    def __init__(self, *, bootstrap_servers: str | list[str], topic: str, client_id: str,
                 max_wait_seconds: float = 10.0, transactions: bool = True, transactional_id: str | None = None,
                 security: dict[str, Any] | None = None, linger_ms: int = 5, batch_size: int = 500):
        servers = [s.strip() for s in bootstrap_servers.split(",")] if isinstance(bootstrap_servers, str) \
            else list(bootstrap_servers)
        if not [s for s in servers if s]:
            raise ConfigError("kafka: bootstrap_servers is empty")
        self.bootstrap_servers = [s for s in servers if s]
        self.topic = topic
        self.client_id = client_id
        self.max_wait_seconds = float(max_wait_seconds)
        self.transactions = transactions
        self.transactional_id = transactional_id or f"{client_id}-relay"
        self.security = dict(security or {})
        self.linger_ms = linger_ms
        self.batch_size = max(1, int(batch_size))  # rows per relay batch (one transaction each)
        self.mode: str | None = None  # one of MODES, known after the first connection
        self.degraded: str | None = None  # why `mode` is weaker than the configuration asks; None when it is not
        self.last_error: str | None = None
        self._producer = None

    @property
    def transactional(self) -> bool:
        """Whether the producer of the last connection uses a transaction per batch."""
        return self.mode == "transactional"

    @classmethod
    def from_config(cls, region: RegionConfig) -> "KafkaRelay":
        t = region.section("kafka") or {}
        if not t.get("bootstrap_servers"):
            raise ConfigError(f"region {region.name!r}: [kafka] needs bootstrap_servers",
                              hint='e.g. bootstrap_servers = "kafka1:9092,kafka2:9092"')
        security = {k: t[k] for k in _SECURITY_KEYS if k in t}
        if t.get("sasl_password_file"):
            secret = SecretFile(t["sasl_password_file"], setting=f"regions.{region.name}.kafka.sasl_password_file",
                                spaces_ok=True)
            secret.value()  # a missing or empty file is a ConfigError now, not at the first connection
            security["sasl_plain_password"] = secret
        wait = float(t.get("max_wait_seconds", 10))
        if wait <= 0:
            raise ConfigError(f"region {region.name!r}: kafka.max_wait_seconds must be > 0")
        client_id = t.get("client_id") or f"spotctl-{region.name}"
        return cls(bootstrap_servers=t["bootstrap_servers"], topic=t.get("topic") or f"spot.lifecycle.{region.name}",
                   client_id=client_id, max_wait_seconds=wait, transactions=bool(t.get("transactions", True)),
                   transactional_id=t.get("transactional_id") or f"{client_id}-relay", security=security,
                   batch_size=t.get("batch_size", 500))

    # -- the Outlet interface ----------------------------------------------------

    def deliver(self, rows: list[tuple[str, str]]) -> int:
        """Send (node id, CloudEvent JSON) rows in order; return len(rows) once the broker acknowledged all."""
        if not rows:
            return 0
        return self.publish([(k.encode(), v.encode()) for k, v in rows])

    def publish(self, messages: list[tuple[bytes, bytes]]) -> int:
        from kafka.errors import KafkaError

        self.last_error = None
        try:
            producer = self._connect()
            if self.transactional:
                _bounded(producer.begin_transaction, self.max_wait_seconds, "begin the transaction")
            futures = [producer.send(self.topic, key=k, value=v, headers=[("content-type", CONTENT_TYPE)])
                       for k, v in messages]
            producer.flush(timeout=self.max_wait_seconds)
            for f in futures:
                if f.failed():
                    raise f.exception
            if self.transactional:
                _bounded(producer.commit_transaction, self.max_wait_seconds, "commit the transaction")
            return len(messages)
        except KafkaError as e:
            self._reset(abort=True)
            raise _translate(e, self) from None
        except BaseException:  # TemporaryError from a bound, or anything else: never leave a transaction open
            self._reset(abort=True)
            raise

    def close(self) -> None:
        self._reset(abort=False)

    # -- internals -----------------------------------------------------------------

    def _config(self, mode: str) -> dict:
        ms = int(self.max_wait_seconds * 1000)
        cfg: dict[str, Any] = dict(
            bootstrap_servers=self.bootstrap_servers, client_id=self.client_id, acks="all", linger_ms=self.linger_ms,
            batch_size=256 * 1024, max_block_ms=ms, request_timeout_ms=max(1000, min(ms, 30000)),
            delivery_timeout_ms=max(ms + 1000, min(ms, 30000) + self.linger_ms + 1),
            bootstrap_timeout_ms=ms, reconnect_backoff_max_ms=1000, retry_backoff_ms=100, **self._security())
        if mode == "transactional":
            cfg["transactional_id"] = self.transactional_id
            cfg["transaction_timeout_ms"] = max(10000, 6 * ms)
        else:
            cfg["enable_idempotence"] = mode == "idempotent"
        return cfg

    def _security(self) -> dict[str, Any]:
        """The security settings, with a password file read as it is now (each connection re-reads it)."""
        return {k: v.value() if isinstance(v, SecretFile) else v for k, v in self.security.items()}

    def _offered(self) -> set[int]:
        """The API keys the broker advertises (ApiVersions), through kafka-python's public admin client."""
        from kafka import KafkaAdminClient

        ms = int(self.max_wait_seconds * 1000)
        admin = KafkaAdminClient(bootstrap_servers=self.bootstrap_servers, client_id=self.client_id,
                                 request_timeout_ms=max(1000, min(ms, 30000)), bootstrap_timeout_ms=ms,
                                 reconnect_backoff_max_ms=1000, retry_backoff_ms=100, **self._security())
        try:
            return {int(k) for k in admin.api_versions()}
        finally:
            admin.close()

    def _connect(self):
        if self._producer is not None:
            return self._producer
        from kafka import KafkaProducer
        from kafka.errors import KafkaConfigurationError, UnsupportedVersionError

        offered = self._offered()
        why = None
        if self.transactions:
            missing = [name for key, name in TXN_APIS.items() if key not in offered]
            if missing:
                why = f"the broker does not offer transactions (no {', '.join(missing)} API)"
            else:
                try:
                    p = KafkaProducer(**self._config("transactional"))
                except KafkaConfigurationError as e:  # kafka-python: a broker older than 0.11
                    why = f"the broker does not offer transactions ({e})"
                else:
                    try:
                        _bounded(p.init_transactions, self.max_wait_seconds, "initialise transactions")
                    except UnsupportedVersionError as e:  # older kafka-python versions report it here
                        p.close(timeout=0)
                        why = f"the broker does not offer transactions ({e})"
                    except BaseException:
                        p.close(timeout=0)
                        raise
                    else:
                        return self._use(p, "transactional", None)
        if IDEMPOTENCE_API in offered:
            try:
                p = KafkaProducer(**self._config("idempotent"))
            except KafkaConfigurationError as e:
                why = why or f"the broker does not offer idempotent producers ({e})"
            else:
                return self._use(p, "idempotent", why)
        else:
            why = why or "the broker does not offer idempotent producers (no InitProducerId API)"
        return self._use(KafkaProducer(**self._config("acks-all")), "acks-all", why)

    def _use(self, producer, mode: str, why: str | None):
        self._producer, self.mode = producer, mode
        self.degraded = None if why is None else f"{why}: using an {mode} producer" + (
            "; a relay killed mid-batch can leave part of the batch visible, and the next pass sends it again"
            if mode != "transactional" else "")
        if self.degraded:
            log.warning("kafka %s: %s", ",".join(self.bootstrap_servers), self.degraded)
        return producer

    def _reset(self, *, abort: bool) -> None:
        p, self._producer = self._producer, None
        if p is None:
            return
        if abort and self.transactional:
            try:
                _bounded(p.abort_transaction, min(2.0, self.max_wait_seconds), "abort the transaction")
            except Exception as e:  # the broker is gone or fenced us: the transaction times out there
                log.debug("kafka: abort failed: %s", e)
        try:
            p.close(timeout=0 if abort else min(5.0, self.max_wait_seconds))
        except Exception as e:
            log.debug("kafka: close failed: %s", e)


def _bounded(fn: Callable[[], Any], seconds: float, what: str) -> Any:
    """Run a blocking client call with a deadline (some kafka-python calls wait without one)."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # handed to the caller's thread
            box["error"] = e

    t = threading.Thread(target=run, name=f"kafka-{what}", daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise TemporaryError(f"kafka: could not {what} within {seconds:g}s")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def _translate(e: Exception, relay: KafkaRelay) -> Exception:
    from kafka import errors as ke

    where = ",".join(relay.bootstrap_servers)
    name = type(e).__name__
    relay.last_error = str(e) or name
    if isinstance(e, _errors(ke, "SaslAuthenticationFailedError", "AuthenticationFailedError",
                             "TopicAuthorizationFailedError", "TransactionalIdAuthorizationFailedError",
                             "ClusterAuthorizationFailedError")):
        return AuthError(f"kafka {where}: not authorised ({name})",
                         hint="check the [kafka] security settings and the broker ACLs")
    if isinstance(e, _errors(ke, "NoBrokersAvailable", "KafkaConnectionError", "KafkaTimeoutError",
                             "NodeNotReadyError", "RequestTimedOutError")):
        return UnavailableError(f"kafka {where}: unavailable ({e})",
                                hint="the events stay queued in the outbox; the next pass sends them")
    return TemporaryError(f"kafka {where}: {e}", hint="the events stay queued in the outbox")


def _errors(module, *names: str) -> tuple[type, ...]:
    """The named exception classes this kafka-python version has (names moved between 2.x and 3.x)."""
    return tuple(getattr(module, n) for n in names if isinstance(getattr(module, n, None), type))
