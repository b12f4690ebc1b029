"""Batch deployments' data on a running `local up`: the sample input it seeds, the developer's uploads and downloads,
and the manifest a run writes.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.batch import data
    from servestack.local.batch.data import s3_client
    from servestack.local.batch.manifests import print_manifest
    from servestack.local.batch.planning import BatchPlanner
    from servestack.local.batch.seed import retire_seeded_input, seed_batch_input
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = ["BatchPlanner", "data", "print_manifest", "retire_seeded_input", "s3_client", "seed_batch_input"]
