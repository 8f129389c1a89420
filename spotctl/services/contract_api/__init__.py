"""The provider contract API (``docs/contract/openapi.yaml``) served from a simulated world (``spotctl sim serve``).

- :mod:`.state` — :class:`ContractAPI`: the notice log, reclaims and receipts over one world, and
  the checks of a reclaim request (:class:`ApiError` carries the HTTP status of a refusal);
- :mod:`.handler` — :class:`ContractServer` and its request handler (routes, auth, query and body
  parsing), built by :func:`make_server`;
- :mod:`.runner` — :func:`serve_region`: the world, the server and its defaults from the region's
  ``[contract]`` table, run until Ctrl-C or SIGTERM;
- :mod:`.world` — :class:`World`, what the API needs of the world (it never imports the simulator).

The client of this API is :mod:`spotctl.adapters.contract_http`.
"""

from __future__ import annotations

from .handler import DEFAULT_PORT, ContractServer, make_server
from .runner import is_loopback, populate, region_endpoint, serve_region
from .state import MAX_LEAD_SECONDS, MAX_WAIT, MIN_NOTICE_SECONDS, ApiError, ContractAPI, iso
from .world import World

__all__ = [
    "DEFAULT_PORT", "MAX_LEAD_SECONDS", "MAX_WAIT", "MIN_NOTICE_SECONDS", "ApiError", "ContractAPI",
    "ContractServer", "World", "is_loopback", "iso", "make_server", "populate", "region_endpoint", "serve_region",
]
