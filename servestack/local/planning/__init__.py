"""The interface between `local up` and the service packages: a service's planner (`LocalService`), what it is
given of the world (`PlanContext`), what it returns (`ServicePlan`), and the child process it plans (`Child`).

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.planning.banner import curl_sigv4, self_command, shown
    from servestack.local.planning.children import Child, pump
    from servestack.local.planning.errors import PlanError
    from servestack.local.planning.paths import map_paths
    from servestack.local.planning.service import LocalService, PlanContext, ServicePlan, StagedImage
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "Child",
    "LocalService",
    "PlanContext",
    "PlanError",
    "ServicePlan",
    "StagedImage",
    "curl_sigv4",
    "map_paths",
    "pump",
    "self_command",
    "shown",
]
