"""Which CPU architecture each SageMaker instance type of the kept list has (servestack/architectures.py)."""

from __future__ import annotations

from servestack.architectures import instance_architecture, is_graviton
from servestack.instance_types import known


def test_every_graviton_family_of_the_kept_list_is_arm64_and_every_other_cpu_type_x86_64() -> None:
    # GIVEN every instance type botocore lists for endpoints and Batch Transform
    types = {t for enum in ("ProductionVariantInstanceType", "TransformInstanceType") for t in known(enum)}

    # WHEN each is classified
    arm64 = {t.split(".")[1] for t in types if instance_architecture(t) == "arm64"}

    # THEN the arm64 families are AWS Graviton's (a `g` after the generation) and Grace's GPU family
    graviton = {"c6g", "c6gd", "c6gn", "c7g", "c8g", "m6g", "m6gd", "m8g", "r6g", "r6gd", "r7gd", "r8g"}
    assert arm64 == graviton | {"p6e-gb200"}
    # AND no GPU family is taken for a Graviton one by its name (ml.g5, ml.g4dn, ml.g6e: a `g` first)
    assert not any(is_graviton(t) for t in types if t.startswith(("ml.g", "ml.p")))
    assert instance_architecture("ml.c7g.xlarge") == "arm64"
    assert instance_architecture("ml.c6i.large") == "x86_64"
    assert instance_architecture("ml.g5.xlarge") == "x86_64"
