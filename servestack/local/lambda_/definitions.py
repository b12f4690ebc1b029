"""The Lambda resources of a template, as local up runs them: functions and their SQS event source mappings."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FunctionDef:
    logical_id: str
    name: str
    arn: str
    handler: str
    environment: dict[str, str]
    timeout_sec: int
    memory_mib: int
    reserved_concurrency: int | None
    role: str  # role logical id
    aliases: tuple[str, ...] = ()
    runtime: str = "python3.12"
    log_group: str = ""  # LoggingConfig.LogGroup, else Lambda's default /aws/lambda/<name>
    code_dir: Path | None = None  # what its Code asset is made from (the function's /var/task); None: inline code
    image_uri: str | None = None  # a container-image function's image (PackageType: Image)
    architecture: str = "x86_64"  # Architectures: x86_64 or arm64 (AWS Graviton)


@dataclass(frozen=True)
class EventSourceMappingDef:
    logical_id: str
    function: str  # function logical id
    queue_arn: str
    batch_size: int
    window_sec: int
    report_batch_item_failures: bool
    maximum_concurrency: int | None
    enabled: bool
