"""A SPIFFE Workload API server for tests: the gRPC service a SPIRE agent serves on its Unix socket
(``FetchX509SVID``, server-streaming), from the protocol stubs the ``spiffe`` package ships, serving one
X.509 SVID of the test PKI (tests/pki.py). It checks the ``workload.spiffe.io: true`` header, as SPIRE does."""

from __future__ import annotations

from concurrent import futures
from pathlib import Path

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from spiffe._proto import workload_pb2, workload_pb2_grpc


def _der_chain(pem: bytes) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.DER) for c in x509.load_pem_x509_certificates(pem))


class WorkloadApi(workload_pb2_grpc.SpiffeWorkloadAPIServicer):
    def __init__(self, spiffe_id: str, cert: str, key: str, bundle: str):
        self.spiffe_id, self.cert, self.key, self.bundle = spiffe_id, cert, key, bundle
        self.calls = 0

    def FetchX509SVID(self, request, context):  # noqa: N802 (the protocol's name)
        if dict(context.invocation_metadata()).get("workload.spiffe.io") != "true":
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "security header missing from request")
        self.calls += 1
        key = serialization.load_pem_private_key(Path(self.key).read_bytes(), password=None)
        der_key = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
        svid = workload_pb2.X509SVID(spiffe_id=self.spiffe_id, x509_svid=_der_chain(Path(self.cert).read_bytes()),
                                     x509_svid_key=der_key, bundle=_der_chain(Path(self.bundle).read_bytes()))
        yield workload_pb2.X509SVIDResponse(svids=[svid])


def serve(socket_path: Path, api: WorkloadApi) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    workload_pb2_grpc.add_SpiffeWorkloadAPIServicer_to_server(api, server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    return server
