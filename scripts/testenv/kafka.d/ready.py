"""Readiness probe for the test broker: a real Kafka metadata round trip with kafka-python."""

import sys

from kafka import KafkaAdminClient

admin = KafkaAdminClient(bootstrap_servers=sys.argv[1], request_timeout_ms=2000)
try:
    admin.list_topics()
finally:
    admin.close()
