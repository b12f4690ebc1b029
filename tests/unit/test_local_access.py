"""The one access layer of local mode: `--no-iam` is a setting of the one enforcer, said once, with the keys
an enforced run hands out (one derivation)."""

from __future__ import annotations

from servestack.local.iam import DISABLED_WARNING, LocalAccess, disabled_warning

ROLE = "arn:aws:iam::123456789012:role/Worker"
OBJECT = "arn:aws:s3:::uploads/input/1.json"


def test_no_iam_warns_once_and_allows_what_the_enforced_layer_refuses() -> None:
    off_lines: list[str] = []
    on_lines: list[str] = []
    off = LocalAccess(enforced=False, log=off_lines.append)
    on = LocalAccess(log=on_lines.append)
    assert off.credentials_for(ROLE, ()) == on.credentials_for(ROLE, ())
    assert off.developer == on.developer
    assert not off.enabled
    assert on.enabled
    assert off.authorize(ROLE, "s3:GetObject", OBJECT) is None
    assert off.authorize(ROLE, "s3:PutObject", OBJECT) is None
    refused = on.authorize(ROLE, "s3:GetObject", OBJECT)
    assert refused is not None
    assert "not authorized to perform: s3:GetObject" in refused
    assert off.may_send("arn:aws:sqs:us-east-1:123456789012:work", "s3.amazonaws.com", "arn:aws:s3:::b", "1")
    assert off_lines == [DISABLED_WARNING]
    assert on_lines
    assert all("ENFORCEMENT IS OFF" not in line for line in on_lines)


def test_the_warning_names_why_enforcement_is_off() -> None:
    lines: list[str] = []
    LocalAccess(enforced=False, disabled_because="http://localhost:4566 is an external emulator", log=lines.append)
    assert lines == [disabled_warning("http://localhost:4566 is an external emulator")]
    assert "external emulator" in lines[0]
