"""Policy loading and evaluation: elements, every condition operator, Deny precedence, resource policies."""

from __future__ import annotations

import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from servestack.local.iam.conditions import PolicyError, normalise_context
from servestack.local.iam.policy import Caller, Decision, Policy, PolicySet, compile_policy, evaluate
from servestack.local.iam.wildcards import wildcard_match

ACCOUNT = "123456789012"
ROLE_ARN = f"arn:aws:iam::{ACCOUNT}:role/Worker"
SESSION_ARN = f"arn:aws:sts::{ACCOUNT}:assumed-role/Worker/worker-fn"
WORKER = Caller(SESSION_ARN, ROLE_ARN, ACCOUNT)
BUCKET = "arn:aws:s3:::jobs"


def policy(*statements: dict[str, Any], name: str = "Worker/inline") -> Policy:
    return compile_policy({"Version": "2012-10-17", "Statement": list(statements)}, name=name)


def resource_policy(*statements: dict[str, Any]) -> Policy:
    return compile_policy({"Version": "2012-10-17", "Statement": list(statements)}, name="bucket", kind="resource")


def decide(
    statements: list[dict[str, Any]],
    action: str,
    resource: str,
    context: dict[str, Any] | None = None,
    *,
    on_resource: Policy | None = None,
    caller: Caller = WORKER,
    trust: bool = False,
) -> Decision:
    identity = PolicySet([policy(*statements)]) if statements else PolicySet([])
    return evaluate(
        caller,
        action,
        resource,
        normalise_context(context),
        identity_policies=identity,
        resource_policy=on_resource,
        trust=trust,
    )


def allow(action: str | list[str], resource: str | list[str], **extra: Any) -> dict[str, Any]:
    return {"Effect": "Allow", "Action": action, "Resource": resource, **extra}


def deny(action: str | list[str], resource: str | list[str], **extra: Any) -> dict[str, Any]:
    return {"Effect": "Deny", "Action": action, "Resource": resource, **extra}


# ------------------------------------------------------------------------------------------ elements


def test_an_allow_scoped_to_a_prefix_allows_inside_it_and_nothing_else() -> None:
    # GIVEN a role allowed s3:GetObject on jobs/in/*
    statements = [allow("s3:GetObject", f"{BUCKET}/in/*")]
    # WHEN it reads inside and outside the prefix, and deletes inside it
    inside = decide(statements, "s3:GetObject", f"{BUCKET}/in/x")
    outside = decide(statements, "s3:GetObject", f"{BUCKET}/out/x")
    delete = decide(statements, "s3:DeleteObject", f"{BUCKET}/in/x")
    # THEN only the first is allowed, and the refusals say what AWS says
    assert inside.allowed
    assert inside.statement == "Worker/inline#0"
    assert not outside.allowed
    assert not outside.explicit
    assert outside.reason == "no identity-based policy allows the s3:GetObject action"
    assert delete.aws_clause() == "because no identity-based policy allows the s3:DeleteObject action"


def test_actions_match_without_case_and_resources_with_it() -> None:
    statements = [allow("S3:getobject", f"{BUCKET}/In/*")]
    assert decide(statements, "s3:GetObject", f"{BUCKET}/In/x").allowed
    assert not decide(statements, "s3:GetObject", f"{BUCKET}/in/x").allowed


def test_not_action_allows_everything_but_the_listed_actions() -> None:
    statements = [{"Effect": "Allow", "NotAction": ["iam:*", "sts:*"], "Resource": "*"}]
    assert decide(statements, "s3:GetObject", f"{BUCKET}/k").allowed
    assert not decide(statements, "iam:CreateUser", "*").allowed


def test_not_resource_denies_everywhere_but_the_listed_resources() -> None:
    # GIVEN full access, minus a Deny on everything outside public/*
    statements = [
        allow("s3:*", "*"),
        deny("s3:GetObject", "*"),
        {"Effect": "Allow", "Action": "sqs:*", "NotResource": "*"},
    ]
    statements[1] = {"Effect": "Deny", "Action": "s3:GetObject", "NotResource": f"{BUCKET}/public/*"}
    assert decide(statements, "s3:GetObject", f"{BUCKET}/public/a").allowed
    refused = decide(statements, "s3:GetObject", f"{BUCKET}/private/a")
    assert not refused.allowed
    assert refused.explicit
    # AND an Allow with NotResource "*" covers nothing
    assert not decide(statements, "sqs:SendMessage", "arn:aws:sqs:us-east-1:123456789012:q").allowed


def test_an_explicit_deny_wins_over_any_allow_wherever_it_is() -> None:
    # GIVEN an Allow * and a Deny on one key, in two policies, in either order
    allow_all = policy(allow("*", "*"), name="Admin")
    deny_one = policy({"Sid": "NoSecrets", **deny("s3:GetObject", f"{BUCKET}/secret")}, name="Guard")
    for policies in ([allow_all, deny_one], [deny_one, allow_all]):
        # WHEN the secret is read
        decision = evaluate(
            WORKER, "s3:GetObject", f"{BUCKET}/secret", {}, identity_policies=PolicySet(policies), resource_policy=None
        )
        # THEN the Deny decides, names its statement, and is worded as AWS words it
        assert not decision.allowed
        assert decision.explicit
        assert decision.reason == "explicit deny in Guard#NoSecrets"
        assert decision.aws_clause() == "with an explicit deny in an identity-based policy"


def test_a_deny_in_the_resource_policy_beats_an_identity_allow() -> None:
    bucket_policy = resource_policy(
        {"Effect": "Deny", "Principal": "*", "Action": "s3:DeleteObject", "Resource": f"{BUCKET}/*"}
    )
    decision = decide([allow("s3:*", "*")], "s3:DeleteObject", f"{BUCKET}/k", on_resource=bucket_policy)
    assert not decision.allowed
    assert decision.aws_clause() == "with an explicit deny in a resource-based policy"


def test_a_resource_policy_naming_the_role_allows_without_an_identity_policy() -> None:
    # GIVEN a queue policy that names the role (or the session), and a role with no SQS statement
    for principal in (ROLE_ARN, SESSION_ARN):
        queue_policy = resource_policy(
            {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": "sqs:SendMessage", "Resource": "*"}
        )
        # THEN the queue policy alone allows (same account: either policy may allow)
        assert decide([], "sqs:SendMessage", "arn:aws:sqs:us-east-1:123456789012:q", on_resource=queue_policy).allowed


def test_a_resource_policy_naming_the_account_delegates_to_the_identity_policy() -> None:
    queue = "arn:aws:sqs:us-east-1:123456789012:q"
    for principal in (ACCOUNT, f"arn:aws:iam::{ACCOUNT}:root"):
        account_policy = resource_policy(
            {"Effect": "Allow", "Principal": {"AWS": principal}, "Action": "sqs:*", "Resource": queue}
        )
        assert not decide([], "sqs:SendMessage", queue, on_resource=account_policy).allowed
        assert decide([allow("sqs:SendMessage", queue)], "sqs:SendMessage", queue, on_resource=account_policy).allowed


def test_not_principal_in_a_deny_spares_only_the_listed_principals() -> None:
    bucket_policy = resource_policy(
        {
            "Effect": "Deny",
            "NotPrincipal": {"AWS": [ROLE_ARN, SESSION_ARN]},
            "Action": "s3:*",
            "Resource": f"{BUCKET}/*",
        }
    )
    other = Caller(f"arn:aws:sts::{ACCOUNT}:assumed-role/Other/x", f"arn:aws:iam::{ACCOUNT}:role/Other", ACCOUNT)
    statements = [allow("s3:GetObject", "*")]
    assert decide(statements, "s3:GetObject", f"{BUCKET}/k", on_resource=bucket_policy).allowed
    assert not decide(statements, "s3:GetObject", f"{BUCKET}/k", on_resource=bucket_policy, caller=other).allowed


def test_a_trust_policy_must_allow_the_caller_itself() -> None:
    # GIVEN a role trusted by Lambda only, and a caller whose identity policy allows sts:AssumeRole
    trust = compile_policy(
        {
            "Statement": {
                "Effect": "Allow",
                "Principal": {"Service": "lambda.amazonaws.com"},
                "Action": "sts:AssumeRole",
            }
        },
        name="trust",
        kind="resource",
    )
    decision = decide([allow("sts:AssumeRole", "*")], "sts:AssumeRole", ROLE_ARN, on_resource=trust, trust=True)
    # THEN the identity policy is not enough
    assert not decision.allowed
    # AND the service the policy trusts is allowed
    lambda_service = Caller.of_service("lambda.amazonaws.com")
    assert evaluate(
        lambda_service, "sts:AssumeRole", ROLE_ARN, {}, identity_policies=None, resource_policy=trust, trust=True
    ).allowed


def test_an_anonymous_caller_needs_a_policy_open_to_everyone() -> None:
    public = resource_policy(
        {"Effect": "Allow", "Principal": "*", "Action": "s3:GetObject", "Resource": f"{BUCKET}/public/*"}
    )
    anonymous = Caller.anonymous()
    allowed = evaluate(
        anonymous, "s3:GetObject", f"{BUCKET}/public/a", {}, identity_policies=None, resource_policy=public
    )
    refused = evaluate(
        anonymous, "s3:GetObject", f"{BUCKET}/private/a", {}, identity_policies=None, resource_policy=public
    )
    assert allowed.allowed
    assert not refused.allowed
    assert refused.reason == "no resource-based policy allows the s3:GetObject action"


# ------------------------------------------------------------------------------------------ condition operators


OPERATOR_CASES = [
    # operator, policy value, request value, expected
    ("StringEquals", "a/b", "a/b", True),
    ("StringEquals", "a/b", "A/b", False),
    ("StringNotEquals", "a/b", "a/c", True),
    ("StringNotEquals", "a/b", "a/b", False),
    ("StringEqualsIgnoreCase", "Hello", "hELLO", True),
    ("StringEqualsIgnoreCase", "Hello", "Help", False),
    ("StringNotEqualsIgnoreCase", "Hello", "hello", False),
    ("StringNotEqualsIgnoreCase", "Hello", "world", True),
    ("StringLike", "input/*", "input/part-1", True),
    ("StringLike", "input/?", "input/ab", False),
    ("StringNotLike", "input/*", "output/x", True),
    ("StringNotLike", "input/*", "input/x", False),
    ("NumericEquals", "10", "10.0", True),
    ("NumericEquals", 10, "11", False),
    ("NumericNotEquals", "10", "11", True),
    ("NumericNotEquals", "10", "10", False),
    ("NumericLessThan", "10", "9", True),
    ("NumericLessThan", "10", "10", False),
    ("NumericLessThanEquals", "10", "10", True),
    ("NumericLessThanEquals", "10", "10.5", False),
    ("NumericGreaterThan", "10", "11", True),
    ("NumericGreaterThan", "10", "not-a-number", False),
    ("NumericGreaterThanEquals", "10", "10", True),
    ("NumericGreaterThanEquals", "10", "9", False),
    ("DateEquals", "2026-11-30T00:00:00Z", "2026-11-30T01:00:00+01:00", True),
    ("DateEquals", "2026-11-30T00:00:00Z", "2026-11-30T00:00:01Z", False),
    ("DateNotEquals", "2026-11-30", "2026-12-01", True),
    ("DateNotEquals", "2026-11-30", "2026-11-30T00:00:00Z", False),
    ("DateLessThan", "2026-11-30T12:00:00Z", "1796035200", True),  # epoch seconds: 2026-11-30T10:40Z
    ("DateLessThan", "2026-11-30T12:00:00Z", "2026-11-30T12:00:00Z", False),
    ("DateLessThanEquals", "2026-11-30T12:00:00Z", "2026-11-30T12:00:00Z", True),
    ("DateLessThanEquals", "2026-11-30T12:00:00Z", "2026-12-01", False),
    ("DateGreaterThan", "2026-11-30", "2026-12-01T00:00:00Z", True),
    ("DateGreaterThan", "2026-11-30", "yesterday", False),
    ("DateGreaterThanEquals", "2026-11-30", "2026-11-30", True),
    ("DateGreaterThanEquals", "2026-11-30", "2026-11-29", False),
    ("Bool", "true", "true", True),
    ("Bool", True, "false", False),
    ("BinaryEquals", "QmluYXJ5", "QmluYXJ5", True),
    ("BinaryEquals", "QmluYXJ5", "T3RoZXI=", False),
    ("IpAddress", "10.0.0.0/8", "10.1.2.3", True),
    ("IpAddress", "10.0.0.0/8", "192.168.0.1", False),
    ("NotIpAddress", "10.0.0.0/8", "127.0.0.1", True),
    ("NotIpAddress", "10.0.0.0/8", "10.0.0.1", False),
    ("ArnEquals", "arn:aws:s3:::jobs", "arn:aws:s3:::jobs", True),
    ("ArnEquals", "arn:aws:s3:::jobs", "arn:aws:s3:::other", False),
    ("ArnLike", "arn:aws:s3:::jobs-*", "arn:aws:s3:::jobs-uploads", True),
    ("ArnLike", "arn:aws:s3:::jobs-*", "arn:aws:sqs:::jobs-uploads", False),
    ("ArnNotEquals", "arn:aws:s3:::jobs", "arn:aws:s3:::other", True),
    ("ArnNotEquals", "arn:aws:s3:::jobs", "arn:aws:s3:::jobs", False),
    ("ArnNotLike", "arn:aws:s3:::jobs-*", "arn:aws:s3:::other", True),
    ("ArnNotLike", "arn:aws:s3:::jobs-*", "arn:aws:s3:::jobs-x", False),
]


@pytest.mark.parametrize(("operator", "policy_value", "request_value", "expected"), OPERATOR_CASES)
def test_condition_operator(operator: str, policy_value: Any, request_value: str, expected: bool) -> None:
    # GIVEN an Allow whose condition uses `operator` on a key
    statements = [allow("s3:GetObject", "*", Condition={operator: {"test:key": policy_value}})]
    # WHEN the request carries a value for the key
    decision = decide(statements, "s3:GetObject", f"{BUCKET}/k", {"test:key": request_value})
    # THEN the condition decides
    assert decision.allowed is expected


ABSENT_KEY_CASES = [
    ("StringEquals", False),  # a missing key matches nothing
    ("StringLike", False),
    ("NumericLessThan", False),
    ("Bool", False),
    ("StringNotEquals", True),  # ... but a negated operator is then true
    ("StringNotLike", True),
    ("ArnNotLike", True),
    ("NotIpAddress", True),
    ("StringEqualsIfExists", True),  # ...IfExists: true when absent
    ("NumericLessThanIfExists", True),
    ("ForAnyValue:StringEquals", False),  # set operators: any of nothing is false, all of nothing is true
    ("ForAllValues:StringEquals", True),
]


@pytest.mark.parametrize(("operator", "expected"), ABSENT_KEY_CASES)
def test_condition_on_a_key_the_request_lacks(operator: str, expected: bool) -> None:
    value = {"Bool": "true", "ArnNotLike": "arn:aws:s3:::x", "NotIpAddress": "10.0.0.0/8"}.get(operator, "1")
    statements = [allow("s3:GetObject", "*", Condition={operator: {"test:key": value}})]
    assert decide(statements, "s3:GetObject", f"{BUCKET}/k").allowed is expected


def test_if_exists_still_tests_a_key_that_is_there() -> None:
    statements = [allow("s3:GetObject", "*", Condition={"StringEqualsIfExists": {"test:key": "a"}})]
    assert decide(statements, "s3:GetObject", "k", {"test:key": "a"}).allowed
    assert not decide(statements, "s3:GetObject", "k", {"test:key": "b"}).allowed


def test_null_tests_whether_the_key_is_there() -> None:
    absent = [allow("s3:GetObject", "*", Condition={"Null": {"test:key": "true"}})]
    present = [allow("s3:GetObject", "*", Condition={"Null": {"test:key": False}})]
    assert decide(absent, "s3:GetObject", "k").allowed
    assert not decide(absent, "s3:GetObject", "k", {"test:key": "x"}).allowed
    assert decide(present, "s3:GetObject", "k", {"test:key": "x"}).allowed
    assert not decide(present, "s3:GetObject", "k").allowed


def test_set_operators_on_a_multivalued_key() -> None:
    any_of = [allow("s3:GetObject", "*", Condition={"ForAnyValue:StringEquals": {"test:tags": ["a", "b"]}})]
    all_of = [allow("s3:GetObject", "*", Condition={"ForAllValues:StringEquals": {"test:tags": ["a", "b"]}})]
    none_of = [allow("s3:GetObject", "*", Condition={"ForAllValues:StringNotEquals": {"test:tags": ["a", "b"]}})]
    assert decide(any_of, "s3:GetObject", "k", {"test:tags": ["z", "b"]}).allowed
    assert not decide(any_of, "s3:GetObject", "k", {"test:tags": ["z", "y"]}).allowed
    assert not decide(any_of, "s3:GetObject", "k", {"test:tags": []}).allowed
    assert decide(all_of, "s3:GetObject", "k", {"test:tags": ["a", "b", "a"]}).allowed
    assert not decide(all_of, "s3:GetObject", "k", {"test:tags": ["a", "z"]}).allowed
    assert decide(all_of, "s3:GetObject", "k", {"test:tags": []}).allowed
    assert decide(none_of, "s3:GetObject", "k", {"test:tags": ["y", "z"]}).allowed
    assert not decide(none_of, "s3:GetObject", "k", {"test:tags": ["y", "a"]}).allowed


def test_values_are_ored_keys_and_operators_anded_negations_nored() -> None:
    statements = [
        allow(
            "s3:ListBucket",
            BUCKET,
            Condition={
                "StringLike": {"s3:prefix": ["input/*", "models/*"], "s3:delimiter": "/"},
                "NumericLessThanEquals": {"s3:max-keys": "1000"},
                "StringNotEquals": {"s3:prefix": ["input/secret/", "models/secret/"]},
            },
        )
    ]
    ok = {"s3:prefix": "models/a/", "s3:delimiter": "/", "s3:max-keys": "10"}
    assert decide(statements, "s3:ListBucket", BUCKET, ok).allowed  # one of the values is enough
    assert not decide(statements, "s3:ListBucket", BUCKET, {**ok, "s3:delimiter": ","}).allowed  # every key
    assert not decide(statements, "s3:ListBucket", BUCKET, {**ok, "s3:max-keys": "5000"}).allowed  # every operator
    assert not decide(statements, "s3:ListBucket", BUCKET, {**ok, "s3:prefix": "models/secret/"}).allowed  # NOR


def test_condition_key_names_ignore_case() -> None:
    statements = [allow("s3:GetObject", "*", Condition={"Bool": {"AWS:SecureTransport": "true"}})]
    assert decide(statements, "s3:GetObject", "k", {"aws:securetransport": "true"}).allowed


# ------------------------------------------------------------------------------------------ malformed policies


MALFORMED = [
    ({"Statement": [allow("s3:GetObject", "*", Condition={"StringEqualz": {"k": "v"}})]}, "'StringEqualz'"),
    ({"Statement": [allow("s3:GetObject", "*", Condition={"NullIfExists": {"k": "true"}})]}, "'NullIfExists'"),
    ({"Statement": [allow("s3:GetObject", "*", Condition={"NumericLessThan": {"k": "ten"}})]}, "not a number"),
    ({"Statement": [allow("s3:GetObject", "*", Condition={"DateLessThan": {"k": "soon"}})]}, "ISO 8601"),
    ({"Statement": [allow("s3:GetObject", "*", Condition={"IpAddress": {"k": "10.0.0.0/33"}})]}, "CIDR"),
    ({"Statement": [allow("s3:GetObject", "*", Condition={"Null": {"k": "maybe"}})]}, "true or false"),
    ({"Statement": [{"Effect": "Allow", "Action": "s3:GetObject"}]}, "needs Resource or NotResource"),
    ({"Statement": [{"Effect": "Permit", "Action": "s3:GetObject", "Resource": "*"}]}, "Effect must be Allow or Deny"),
    ({"Statement": [{"Effect": "Allow", "Action": "GetObject", "Resource": "*"}]}, "'service:Action'"),
    ({"Statement": [{**allow("s3:GetObject", "*"), "NotAction": "s3:PutObject"}]}, "both Action and NotAction"),
    ({"Statement": [{**allow("s3:GetObject", "*"), "Principal": "*"}]}, "cannot name a Principal"),
    ({"Statement": [allow("s3:GetObject", {"Fn::GetAtt": ["Bucket", "Arn"]})]}, "no Fn::"),
    ({"Statement": [{**allow("s3:GetObject", "*"), "Conditions": {}}]}, "unknown statement element 'Conditions'"),
    ({"Version": "2020-01-01", "Statement": [allow("s3:GetObject", "*")]}, "unknown Version"),
    ({"Statement": []}, "non-empty list"),
]


@pytest.mark.parametrize(("document", "complaint"), MALFORMED)
def test_a_policy_iam_would_refuse_is_refused_when_loaded(document: dict[str, Any], complaint: str) -> None:
    with pytest.raises(PolicyError) as raised:
        compile_policy(document, name="Worker/inline")
    # THEN the error names the policy (and the statement, for a statement's fault), and what is wrong
    assert complaint in raised.value.message
    assert raised.value.message.startswith("Worker/inline")
    assert raised.value.to_dict()["type"] == "PolicyError"


def test_an_unknown_operator_error_lists_the_allowed_ones() -> None:
    document = {
        "Statement": [
            {"Sid": "ListInput", **allow("s3:ListBucket", "*", Condition={"StringPrefix": {"s3:prefix": "a"}})}
        ]
    }
    with pytest.raises(PolicyError) as raised:
        compile_policy(document, name="BatchRole/Policy")
    assert raised.value.message == "BatchRole/Policy#ListInput: unknown condition operator 'StringPrefix'"
    assert raised.value.value == "StringPrefix"
    assert raised.value.allowed is not None
    assert "StringLike" in raised.value.allowed


def test_a_resource_policy_needs_a_principal_and_may_omit_the_resource() -> None:
    with pytest.raises(PolicyError, match="needs Principal or NotPrincipal"):
        compile_policy({"Statement": [allow("s3:*", "*")]}, name="bucket", kind="resource")
    trust = {
        "Statement": [{"Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}, "Action": "sts:AssumeRole"}]
    }
    assert compile_policy(trust, name="trust", kind="resource").statements[0].resources is None


def test_a_policy_given_as_json_text_loads_like_the_document() -> None:
    assert compile_policy('{"Statement": {"Effect": "Allow", "Action": "*", "Resource": "*"}}', name="p").statements
    with pytest.raises(PolicyError, match="not JSON"):
        compile_policy("{not json", name="p")


# ------------------------------------------------------------------------------ combination rules (hypothesis)


ACTIONS = ["s3:GetObject", "s3:PutObject", "sqs:SendMessage"]
ACTION_PATTERNS = ["s3:GetObject", "s3:*", "*", "sqs:Send*", "s3:?etObject"]
RESOURCES = [f"{BUCKET}/in/a", f"{BUCKET}/out/a", "arn:aws:sqs:us-east-1:123456789012:q"]
RESOURCE_PATTERNS = ["*", f"{BUCKET}/in/*", f"{BUCKET}/*", "arn:aws:sqs:*:*:q", f"{BUCKET}/out/?"]
STATEMENT = st.fixed_dictionaries(
    {
        "Effect": st.sampled_from(["Allow", "Deny"]),
        "Action": st.lists(st.sampled_from(ACTION_PATTERNS), min_size=1, max_size=2),
        "Resource": st.lists(st.sampled_from(RESOURCE_PATTERNS), min_size=1, max_size=2),
    }
)


def expected(statements: list[dict[str, Any]], action: str, resource: str) -> tuple[bool, bool]:
    """(allowed, explicit deny) by the documented rules, from first principles."""

    def covers(statement: dict[str, Any]) -> bool:
        return any(wildcard_match(p, action, case_sensitive=False) for p in statement["Action"]) and any(
            wildcard_match(p, resource) for p in statement["Resource"]
        )

    applicable = [statement for statement in statements if covers(statement)]
    denied = any(statement["Effect"] == "Deny" for statement in applicable)
    allowed = any(statement["Effect"] == "Allow" for statement in applicable)
    return (allowed and not denied), denied


@given(st.lists(STATEMENT, min_size=1, max_size=6), st.sampled_from(ACTIONS), st.sampled_from(RESOURCES), st.randoms())
def test_deny_wins_then_allow_then_implicit_deny_however_statements_are_split(
    statements: list[dict[str, Any]], action: str, resource: str, shuffler: random.Random
) -> None:
    # GIVEN random statements, shuffled and split over one to three policies
    shuffled = list(statements)
    shuffler.shuffle(shuffled)
    cuts = sorted(shuffler.sample(range(1, len(shuffled)), min(2, len(shuffled) - 1))) if len(shuffled) > 1 else []
    groups = [
        shuffled[start:end]
        for start, end in zip([0, *cuts], [*cuts, len(shuffled)], strict=True)
        if shuffled[start:end]
    ]
    policies = [policy(*group, name=f"p{index}") for index, group in enumerate(groups)]
    # WHEN the request is evaluated
    decision = evaluate(WORKER, action, resource, {}, identity_policies=PolicySet(policies), resource_policy=None)
    # THEN the documented combination rule decides, whatever the order or split
    allowed, explicit = expected(statements, action, resource)
    assert decision.allowed is allowed
    assert decision.explicit is explicit


@given(
    st.lists(STATEMENT, max_size=4),
    st.lists(STATEMENT, max_size=4),
    st.sampled_from(ACTIONS),
    st.sampled_from(RESOURCES),
)
def test_identity_and_resource_policies_combine_as_one_account(
    identity_statements: list[dict[str, Any]],
    resource_statements: list[dict[str, Any]],
    action: str,
    resource: str,
) -> None:
    # GIVEN identity statements and resource-policy statements naming the caller's role
    identity = PolicySet([policy(*identity_statements)]) if identity_statements else PolicySet([])
    named = [{**statement, "Principal": {"AWS": ROLE_ARN}} for statement in resource_statements]
    on_resource = resource_policy(*named) if named else None
    decision = evaluate(WORKER, action, resource, {}, identity_policies=identity, resource_policy=on_resource)
    # THEN a Deny in either denies; otherwise an Allow in either allows
    allowed, _ = expected(identity_statements + resource_statements, action, resource)
    assert decision.allowed is allowed
