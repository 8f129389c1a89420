"""The real private cloud: Placement and quotas, Blazar, Nova and Ironic, through openstacksdk.

:class:`OpenStackCloud` implements :class:`spotctl.core.ports.CloudPort` for a region
configured with ``backend = "openstack"``. The cloud is a ``clouds.yaml`` entry named by
the region's ``cloud`` (or ``$OS_CLOUD``); credentials never appear in spotctl's config.
One keystone session is reused for every call; compute and bare-metal microversions are
negotiated by openstacksdk, Placement's is pinned to what the queries need.

The modules:

- :mod:`.options` — the ``[regions.R.openstack]`` table, read once.
- :mod:`.errors` — SDK and keystoneauth exceptions as spotctl's errors (the adapter's boundary).
- :mod:`.api` — the shared connection, the tags we put on what we create, OpenStack timestamps.
- :mod:`.placement` — hosts of a pool and what is left on each (headroom).
- :mod:`.blazar` — leases holding hosts (the forward calendar).
- :mod:`.nova` — our servers, flavors, images, aggregates, the quota.
- :mod:`.ironic` — bare-metal pools deployed through Ironic directly (claims, deploy, undeploy).
- :mod:`.cloud` — :class:`OpenStackCloud`, which composes them, and the bounded waits.

Options, in ``[regions.R.openstack]``::

    image = "spot-image"          # default image (name or id) when a pool sets none
    networks = "none"             # "none" | "auto" | comma-separated network ids
    key_name = "ops"              # optional keypair
    user_data = "..."             # template: {name} {pool} {region} {action_id}
    wait_active_seconds = 600     # bound of wait_active() (tests, operators); a pass never waits for ACTIVE
    delete_verify_seconds = 300   # bound of delete_and_verify()
    timeout_seconds = 30          # per API call
    blazar = true                 # read reservations from Blazar (the forward calendar)
    host_placement = "off"        # "off" | "hint" (JsonFilter query hint) | "target" (host-targeted boot, 2.74):
                                  # keep boots off hosts a reservation takes too soon (spotctl.core.hostaware)
    [regions.R.openstack.pools.NAME]
    via = "nova" | "ironic"       # bare-metal pools: through Nova (baremetal flavor) or Ironic directly
    traits = ["CUSTOM_SPOT"]      # select hosts by traits instead of (or on top of) the aggregate
    image = "..."; networks = "..."; host_placement = "..."

What is ours: servers carry the tags ``spotctl:region=R``, ``spotctl:pool=P`` and
``spotctl:action=A`` and the same keys as metadata; Ironic allocations carry them in
``extra``. Instance ids of Ironic nodes deployed directly are ``ironic:<node uuid>``.
"""

from __future__ import annotations

from .api import ALLOC_PREFIX, IRONIC_PREFIX, POLL_SECONDS, TAG_ACTION, TAG_POOL, TAG_REGION
from .cloud import OpenStackCloud
from .errors import translate
from .options import Options, PoolOptions

__all__ = ["ALLOC_PREFIX", "IRONIC_PREFIX", "POLL_SECONDS", "TAG_ACTION", "TAG_POOL", "TAG_REGION", "OpenStackCloud",
           "Options", "PoolOptions", "translate"]
