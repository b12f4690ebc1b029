"""The schema of `serving.yaml`: which models exist and how each deployment serves them.

`load_spec(path)` reads and validates the file. Every problem is reported at once, one line each, as
`<dotted path>: <value> is not <allowed>`, e.g.
`deployments.fraud-api.strategy.canary_percent: 150 is not in 1..99`. Unknown keys are rejected.

One module per idea, and this package's names are what callers import:
- `base.py`: `SpecError`, the constrained scalar types, and `Strict`, the base of every block;
- `blocks.py`: what every deployment shares (`ModelSpec`, `Strategy`, `AlarmSettings`, `Batching`);
- `realtime.py`: realtime's deployment and its parts (variants, shadow, serverless, components);
- `modes.py`: the serverless, async and batch deployments;
- `loading.py`: the whole file (`ServingSpec`), `parse_spec` and `load_spec`.

This package must not import aws_cdk: the CLI imports it and has to start fast.
"""

from servestack.spec.base import SpecError, uses_gpu
from servestack.spec.blocks import AlarmSettings, Batching, Capture, GpuSettings, ModelSpec, Monitor, Strategy
from servestack.spec.loading import MODES, Deployment, ServingSpec, load_spec, parse_spec
from servestack.spec.modes import AsyncDeployment, BatchDeployment, ServerlessDeployment
from servestack.spec.realtime import Component, RealtimeDeployment, RealtimeServerless, ShadowVariant, Variant

__all__ = [
    "MODES",
    "AlarmSettings",
    "AsyncDeployment",
    "BatchDeployment",
    "Batching",
    "Capture",
    "Component",
    "Deployment",
    "GpuSettings",
    "ModelSpec",
    "Monitor",
    "RealtimeDeployment",
    "RealtimeServerless",
    "ServerlessDeployment",
    "ServingSpec",
    "ShadowVariant",
    "SpecError",
    "Strategy",
    "Variant",
    "load_spec",
    "parse_spec",
    "uses_gpu",
]
