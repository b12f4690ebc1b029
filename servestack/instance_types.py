"""SageMaker instance types serving.yaml may name, and the validator that suggests the nearest ones.

The list is kept in the repository (`servestack/data/sagemaker_instance_types.json`) so that validation works
offline and the same everywhere. It comes from botocore's SageMaker service model, which AWS updates as
instance types launch: the `ProductionVariantInstanceType` enum (real-time and async endpoints) and the
`TransformInstanceType` enum (batch transform). Refresh it after upgrading botocore with

    .venv/bin/python -m servestack.instance_types --refresh

and commit the file. A name in the list can still be unavailable in a region or to an account (quotas):
CloudFormation reports that at deploy time.
"""

from __future__ import annotations

import argparse
import difflib
import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import GetCoreSchemaHandler
from pydantic_core import PydanticCustomError, core_schema

DATA_FILE = Path(__file__).resolve().parent / "data" / "sagemaker_instance_types.json"
ENUMS = {"ProductionVariantInstanceType": "real-time endpoints", "TransformInstanceType": "batch transform"}


@functools.cache
def known(enum: str) -> tuple[str, ...]:
    """The instance types of `enum` in the kept list."""
    data: dict[str, Any] = json.loads(DATA_FILE.read_text(encoding="utf-8"))
    return tuple(data["enums"][enum])


def nearest(value: str, enum: str, count: int = 3) -> list[str]:
    return difflib.get_close_matches(value, known(enum), n=count, cutoff=0.5)


@dataclass(frozen=True)
class KnownInstanceType:
    """A pydantic validator: the value must be in the kept list of `enum`; the error names the nearest ones."""

    enum: str

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> core_schema.CoreSchema:
        return core_schema.no_info_after_validator_function(self._check, handler(source))

    def _check(self, value: str) -> str:
        if value in known(self.enum):
            return value
        close = nearest(value, self.enum)
        suggestion = f"; nearest: {', '.join(close)}" if close else ""
        raise PydanticCustomError(
            "unknown_instance_type",
            "{value} is not a SageMaker instance type for {use}{suggestion} (list: {source})",
            {
                "value": repr(value),
                "use": ENUMS[self.enum],
                "suggestion": suggestion,
                "source": "servestack/data/sagemaker_instance_types.json",
            },
        )


# vCPUs and GPUs per instance type, where servestack knows them: the instance table of the price file that
# `servestack plan` reads (its source page is named there). Types outside that table have no known shape.
SHAPES_FILE = Path(__file__).resolve().parent / "data" / "prices.json"


@functools.cache
def _shapes() -> dict[str, tuple[int, int]]:
    data: dict[str, Any] = json.loads(SHAPES_FILE.read_text(encoding="utf-8"))
    instances: dict[str, Any] = data["sagemaker_realtime"]["instances"]
    return {name: (int(row["vcpus"]), int(row["gpus"])) for name, row in instances.items()}


def instance_shape(instance_type: str) -> tuple[int, int] | None:
    """(vCPUs, GPUs) of one instance of `instance_type`, or None where servestack does not know them."""
    return _shapes().get(instance_type)


def from_botocore() -> dict[str, Any]:
    """The enums from the installed botocore's SageMaker service model."""
    import botocore
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    return {
        "source": (
            f"botocore {botocore.__version__}, service model sagemaker {model.api_version}: "
            f"enums {', '.join(ENUMS)}. Regenerate: python -m servestack.instance_types --refresh"
        ),
        "enums": {enum: sorted(model.shape_for(enum).enum) for enum in ENUMS},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m servestack.instance_types",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--refresh", action="store_true", help="rewrite the kept list from the installed botocore")
    parser.add_argument("--check", action="store_true", help="exit 1 if the kept list differs from botocore's")
    args = parser.parse_args(argv)
    fresh = from_botocore()
    current = json.loads(DATA_FILE.read_text(encoding="utf-8")) if DATA_FILE.exists() else {"enums": {}}
    if args.refresh:
        DATA_FILE.parent.mkdir(parents=True, exist_ok=True)
        DATA_FILE.write_text(json.dumps(fresh, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {DATA_FILE} ({fresh['source']})")
        return 0
    for enum in ENUMS:
        added = sorted(set(fresh["enums"][enum]) - set(current["enums"].get(enum, [])))
        removed = sorted(set(current["enums"].get(enum, [])) - set(fresh["enums"][enum]))
        print(f"{enum}: {len(added)} new in botocore {added[:10]}, {len(removed)} gone {removed[:10]}")
    same = all(fresh["enums"][e] == current["enums"].get(e) for e in ENUMS)
    return 0 if same or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
