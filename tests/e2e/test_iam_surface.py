"""A mutation test of the whole IAM surface: for every Allow statement of every role in the four modes'
templates, removing it makes an exercise of its deployment fail locally, or the statement is listed in
tests/e2e/iam_unexercised.txt with the reason no local run can exercise it.

One `local up` serves every mutation: the statement is removed from the running IAM store
(servestack/local/iam_roles.py), which holds the templates' resolved statements and decides each call as the
templates without that statement would; the exercise runs; the statement is put back and the same exercise
must pass again. Sampled by default (a few statements chosen by the UTC date, tests/e2e/iam_surface.py);
`SERVESTACK_IAM_MUTATION=full` mutates every statement and prints the table (statements, caught, listed)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LocalUp, start_local_up
from tests.e2e.iam_surface import (
    EXERCISES,
    FULL_ENV,
    Statement,
    sample,
    statements,
    store,
    unexercised,
    without,
)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalUp]:
    where = tmp_path_factory.mktemp("surface")
    local = start_local_up(where, "--fresh", "--data-dir", str(where / "data"))
    yield local
    assert local.stop() == 0, local.log_text()[-4000:]


def deployment_of(up: LocalUp, role: str) -> str:
    """The deployment whose stack created the role (CloudFormation names a role `<stack>-<logical id>-...`)."""
    stacks = sorted(up.state["stacks"].items(), key=lambda item: -len(item[0]))
    return str(next(about["deployment"] for stack, about in stacks if role.startswith(f"{stack}-")))


def exercise(up: LocalUp, deployment: str, scratch: Path) -> str | None:
    return EXERCISES[up.deployment(deployment)["mode"]](up, deployment, scratch)


def test_every_statement_is_caught_or_listed_with_its_reason(up: LocalUp, tmp_path: Path) -> None:
    # GIVEN every Allow statement of every role local up holds, and the listed ones
    roles = store(up)["roles"]
    surface = statements(roles)
    listed = unexercised()
    stale = [entry for entry in listed if not any(entry.covers(s) for s in surface)]
    assert not stale, f"iam_unexercised.txt lists statements no template has: {stale}"
    candidates = [s for s in surface if not any(entry.covers(s) for entry in listed)]
    full = os.environ.get(FULL_ENV) == "full"
    chosen = candidates if full else sample(candidates)
    deployments = {deployment_of(up, s.role) for s in chosen}
    for deployment in sorted(deployments):  # each exercise passes with the templates' statements
        assert exercise(up, deployment, tmp_path) is None, f"{deployment}: fails with every statement in place"
    missed: list[Statement] = []
    for statement in chosen:
        deployment = deployment_of(up, statement.role)
        # WHEN the statement is removed from its role in the running store and its deployment is exercised
        store(up, "PUT", statement.role, without(roles, statement))
        try:
            failure = exercise(up, deployment, tmp_path)
        finally:
            store(up, "PUT", statement.role, roles[statement.role]["policies"])
        # THEN the exercise fails (and passes again once the statement is back)
        if failure is None:
            missed.append(statement)
        else:
            assert exercise(up, deployment, tmp_path) is None, f"{deployment}: still fails after restoring"
    caught = len(chosen) - len(missed)
    listed_count = len(surface) - len(candidates)
    table = (
        f"\nIAM mutation ({'full' if full else 'sampled'}): {len(surface)} statements, {len(chosen)} mutated, "
        f"{caught} caught, {listed_count} listed with reasons, {len(missed)} missed"
        + "".join(f"\n  missed: {s.label}" for s in missed)
        + "".join(f"\n  listed: {s.label}" for s in surface if s not in candidates)
    )
    print(table)
    assert not missed, table
