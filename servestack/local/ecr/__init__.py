"""ECR, as `cdk deploy` and SageMaker use it: each image asset of the assembly published to the bootstrap
repository, and pulled (its authorization and manifest) with a role's keys before a container starts.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from servestack.local.ecr.images import (
    EcrImage,
    ImagePullError,
    image_uris,
    publish_images,
    published_images,
    pull_image,
)

__all__ = ["EcrImage", "ImagePullError", "image_uris", "publish_images", "published_images", "pull_image"]
