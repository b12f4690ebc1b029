"""SageMaker, as `local up` plays it: the runtime front, endpoints and their router, asynchronous and
multi-model endpoints, inference components, Batch Transform, and the model containers they run.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.sagemaker import releases
    from servestack.local.sagemaker.async_inference import AsyncInferenceConfig, AsyncInvocations
    from servestack.local.sagemaker.backends import Faults
    from servestack.local.sagemaker.container import image_venv, read_image, staged_container
    from servestack.local.sagemaker.definitions import ComponentDef, ContainerDef, EndpointDef, TransformDef, VariantDef
    from servestack.local.sagemaker.dockerfile import DockerfileError, container_command, image_requirements, stage_root
    from servestack.local.sagemaker.inference_components import ComponentState, InferenceComponents, copies_on_router
    from servestack.local.sagemaker.model_data import (
        ModelDataError,
        fetch_model_data,
        model_data_urls,
        publish_model_data,
    )
    from servestack.local.sagemaker.multi_model import MultiModelFront
    from servestack.local.sagemaker.planning import AsyncEndpoint, HostingSettings, SageMakerPlanner
    from servestack.local.sagemaker.reading import SAGEMAKER_TYPES, read_endpoint, read_transforms
    from servestack.local.sagemaker.runtime_front import ENDPOINT_PREFIX, AsyncTarget, RealtimeTarget, SageMakerRuntime
    from servestack.local.sagemaker.transform import JobRefused, create_job, execute_job, role_client, run_transform
    from servestack.local.sagemaker.transform_jobs import TransformJobs
    from servestack.local.sagemaker.variant_start import ContainerSource, VariantStartError, prepare
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "ENDPOINT_PREFIX",
    "SAGEMAKER_TYPES",
    "AsyncEndpoint",
    "AsyncInferenceConfig",
    "AsyncInvocations",
    "AsyncTarget",
    "ComponentDef",
    "ComponentState",
    "ContainerDef",
    "ContainerSource",
    "DockerfileError",
    "EndpointDef",
    "Faults",
    "HostingSettings",
    "InferenceComponents",
    "JobRefused",
    "ModelDataError",
    "MultiModelFront",
    "RealtimeTarget",
    "SageMakerPlanner",
    "SageMakerRuntime",
    "TransformDef",
    "TransformJobs",
    "VariantDef",
    "VariantStartError",
    "container_command",
    "copies_on_router",
    "create_job",
    "execute_job",
    "fetch_model_data",
    "image_requirements",
    "image_venv",
    "model_data_urls",
    "prepare",
    "publish_model_data",
    "read_endpoint",
    "read_image",
    "read_transforms",
    "releases",
    "role_client",
    "run_transform",
    "stage_root",
    "staged_container",
]
