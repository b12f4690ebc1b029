"""The synthesized CloudFormation templates as `local up` reads them: `cdk synth`, resources, intrinsics and
the values `Ref`/`Fn::GetAtt` return.

Other packages of local mode import from here only (tests/unit/test_import_boundaries.py).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.cloudformation.assets import ImageAsset, file_asset_sources, image_asset, image_assets
    from servestack.local.cloudformation.return_values import PARTITION
    from servestack.local.cloudformation.synth import (
        SynthError,
        app_command,
        project_context,
        stack_templates,
        synthesize,
    )
    from servestack.local.cloudformation.templates import (
        ACCOUNT,
        DEFAULT_REGION,
        LocalValues,
        Resolver,
        Resource,
        StackTemplate,
        TemplateError,
        as_list,
        logical_id_of,
        str_map,
    )
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "ACCOUNT",
    "DEFAULT_REGION",
    "PARTITION",
    "ImageAsset",
    "LocalValues",
    "Resolver",
    "Resource",
    "StackTemplate",
    "SynthError",
    "TemplateError",
    "app_command",
    "as_list",
    "file_asset_sources",
    "image_asset",
    "image_assets",
    "logical_id_of",
    "project_context",
    "stack_templates",
    "str_map",
    "synthesize",
]
