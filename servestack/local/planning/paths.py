"""Paths inside an AWS runtime (`/var/task/...`, `/opt/ml/model`) mapped to their local stand-ins."""

from __future__ import annotations


def map_paths(environment: dict[str, str], mapping: dict[str, str]) -> dict[str, str]:
    """Container and Lambda paths (`/var/task/...`, `/opt/ml/model`) to their local stand-ins."""
    out: dict[str, str] = {}
    for key, value in environment.items():
        for remote, local in mapping.items():
            if value == remote or value.startswith(remote + "/"):
                value = local + value[len(remote) :]
                break
        out[key] = value
    return out
