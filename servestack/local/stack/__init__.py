"""One stack of the templates as `local up` runs it: its resources read by type into each service's
definitions, the report `--explain` prints, and what is provisioned on the emulator.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.stack.bucket_notifications import BucketNotifications, HandlerRefused
    from servestack.local.stack.provisioning import ProvisionError, provision
    from servestack.local.stack.topology import StackTopology, read_stack
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "BucketNotifications",
    "HandlerRefused",
    "ProvisionError",
    "StackTopology",
    "provision",
    "read_stack",
]
