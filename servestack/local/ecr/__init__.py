"""ECR, as `cdk deploy` and SageMaker use it: each image asset of the assembly published to the bootstrap
repository, and pulled (its authorization and manifest) with a role's keys before a container starts.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.ecr.images import (
        EcrImage,
        ImagePullError,
        image_uris,
        publish_images,
        published_images,
        pull_image,
    )
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = ["EcrImage", "ImagePullError", "image_uris", "publish_images", "published_images", "pull_image"]
