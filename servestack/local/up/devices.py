"""What runs where in local mode: a deployment whose instance type has a GPU runs here on the CPU. `local up`
(and `--explain`) say so for each one, so that a latency or a throughput read locally is not taken for the GPU's.

The local children run the project's own onnxruntime, the CPU build (uv.lock pins `onnxruntime`, not the GPU
image's `onnxruntime-gpu`): its only accelerator-free provider is the CPU one, whatever the container's
SERVESTACK_PROVIDERS asks, and `gpu:`'s TensorRT is not there either."""

from __future__ import annotations

from servestack.gpu_families import gpu_family
from servestack.local.stack import StackTopology
from servestack.spec import uses_gpu


def gpu_notes(topologies: list[StackTopology]) -> list[str]:
    """One line per endpoint variant (production or shadow) or Batch Transform job of a GPU instance type."""
    lines = []
    for topology in topologies:
        placed: list[tuple[str, str | None]] = []
        for endpoint in topology.endpoints.values():
            placed += [(f"variant {v.name} of {endpoint.name}", v.instance_type) for v in endpoint.variants]
            placed += [
                (f"shadow variant {v.name} of {endpoint.name}", v.instance_type) for v in endpoint.shadow_variants
            ]
        for transform in topology.transforms:
            instance_type = transform.job.get("TransformResources", {}).get("InstanceType")
            placed.append((f"the transform job of schedule {transform.schedule}", instance_type))
        for what, instance_type in placed:
            if instance_type is None or not uses_gpu(instance_type):
                continue
            family = gpu_family(instance_type)
            gpu = f", {family.gpu}" if family is not None else ""
            lines.append(
                f"{topology.deployment}: {what} is a GPU instance type on AWS ({instance_type}{gpu}); here it runs "
                "on this machine's CPU, with onnxruntime's CPU provider (latency and throughput are not the GPU's)"
            )
    return lines
