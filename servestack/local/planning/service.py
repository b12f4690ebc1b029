"""The one small interface each service package of local mode offers `local up`: from one stack's topology, the
children the service starts, the fields it adds to the deployment's state-file entry (what `local status`, the
banner and the other commands read of it), and, kept by the planner, what its in-process service needs later."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from servestack.local.iam import Credentials
from servestack.local.planning.children import Child

Topology_contra = TypeVar("Topology_contra", contravariant=True)


@dataclass(frozen=True)
class StagedImage:
    """A container image's files as its Dockerfile places them (under `root`), what its RUN steps install, and
    its CMD."""

    root: Path
    requirements: str | None
    cmd: tuple[str, ...]


@dataclass(frozen=True)
class PlanContext:
    """What a planner needs of the world for one stack, as values and narrow callables (never the world itself)."""

    region: str
    emulator_url: str
    work: Path  # .servestack: cdk.out, staged images, packages
    run_dir: Path  # where children's config files go
    env_base: dict[str, str]  # every child's environment before its own
    service_endpoints: dict[str, str]  # AWS_ENDPOINT_URL_<SERVICE>: local up's own front for some services
    credentials: dict[str, Credentials]  # role logical id -> that role's keys
    api_ports: dict[str, int]  # HTTP API logical id -> the port its URL was resolved with
    free_port: Callable[[], int]
    # (child name, log group, the role's keys, stream or None for Lambda's) -> the line sink shipping to the group
    log_shipper: Callable[[str, str, Credentials, str | None], Callable[[str], None]]
    sample: Path | None  # the sample request of the deployment's model (serving.yaml), None without one
    # an image URI of the templates -> its files staged from cdk.out (None: not an asset of the assembly);
    # raises PlanError for an image local mode cannot run
    stage_image: Callable[[str], StagedImage | None]


@dataclass
class ServicePlan:
    """One service's part of one stack: its children, its fields of the deployment's state-file entry
    (`log_groups` merged with the other services', every other key set as given), and its lines of the banner."""

    children: list[Child] = field(default_factory=list)
    entry: dict[str, Any] = field(default_factory=dict)
    log_groups: dict[str, str] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)  # what the banner shows for trying it (a curl, a command)


class LocalService(Protocol[Topology_contra]):
    """A service package's planner. `Topology_contra` is the part of a stack's topology it reads (a protocol of its
    own package, which the stack's topology satisfies), so that no service package imports `stack/`."""

    @property
    def name(self) -> str: ...

    def plan(self, topology: Topology_contra, context: PlanContext) -> ServicePlan: ...
