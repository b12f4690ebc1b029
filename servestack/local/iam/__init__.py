"""IAM enforcement for local mode: every AWS call a local deployment makes is refused when the caller's role
would be refused in the cloud, with the error AWS sends.

Local mode keeps moto as the data plane and puts this check in front of it (`IamEnforcer.wsgi(moto_app)`),
and in front of servestack's own AWS fronts (`IamEnforcer.check(...)`: SageMaker Runtime, Lambda Invoke,
the HTTP API). Each Lambda function and realtime container gets credentials standing for its role
(`IdentityStore.role(...)`); the developer's own keys (`local`/`local` by default) stand for an
administrator.

    store = IdentityStore(seed=project_name)       # role keys derive from the seed: stable across restarts
    store.developer()                              # `local`/`local`: the developer, an administrator
    worker = store.role("AsyncWorkerRole", {"Policy": resolved_policy_document}, session_name="worker-fn")
    child_env.update(worker.environment())        # AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN
    policies = ResourcePolicies()
    policies.put("arn:aws:s3:::uploads", resolved_bucket_policy)
    enforcer = IamEnforcer(store, policies, enabled=not no_iam)   # --no-iam: a setting, one warning
    access = LocalAccess(enforced=not no_iam)      # what local up holds: the store, the policies, the enforcer
    moto = EnforcedMotoServer(enforcer).start()    # in place of ThreadedMotoServer (servestack/local/iam/server.py)
    reply_or_identity = enforcer.check_request(request, "sagemaker")    # in servestack's own fronts
    decision = enforcer.authorize(scheduler_role, "lambda:InvokeFunction", function_arn)  # without HTTP

Modules: `policy` (loading and evaluation), `conditions` (condition operators), `wildcards`, `canonical`
(the one form of a request that is authorized and forwarded), `operations` (which action on which resource
a request needs: `calls` and, per family, `s3_operations`, `rpc_operations`, `rest_operations`), `sigv4` (who
signed it), `identities` (the one credentials type and key derivation), `resource_policies`, `replies`
(refusals in each service's protocol), `enforcer` (the plug points, with `verdicts` and `wsgi`), `server`
(moto behind it), `access` (what local up asks of all this, enforced or not), `roles_route` (local up's
`/_servestack/iam/roles`), `control` (local mode's own routes answer only the developer's signature).

What is enforced
- Identity-based policies of the caller (inline and managed, as documents the template resolved), and
  resource-based policies: S3 bucket policies, SQS queue policies, SNS topic policies, Lambda permissions,
  role trust policies for `sts:AssumeRole`. Explicit Deny wins; otherwise an Allow from either; otherwise
  implicit deny (one account: a resource policy naming the account delegates to the identity policy).
- Action/NotAction, Resource/NotResource, Principal/NotPrincipal, `*`/`?` wildcards, and the Condition
  operators String*, Numeric*, Date*, Bool, BinaryEquals, IpAddress/NotIpAddress, Arn*, Null, with
  `...IfExists` and `ForAnyValue:`/`ForAllValues:`. A policy IAM would refuse (unknown operator, malformed
  statement) raises `PolicyError` when it is loaded.
- Context keys filled in: `aws:SecureTransport` (always `true`: the local endpoints are plain HTTP standing
  in for AWS's HTTPS, and the stacks' TLS-only policies must not deny every local call), `aws:CurrentTime`,
  `aws:EpochTime`, `aws:SourceIp`, `aws:RequestedRegion`, `aws:PrincipalArn`, `aws:PrincipalAccount`,
  `aws:PrincipalType`, `aws:userid`, `aws:username`, `aws:TokenIssueTime`, `aws:PrincipalIsAWSService`,
  `aws:ViaAWSService`; `s3:prefix`, `s3:delimiter`, `s3:max-keys`, `s3:VersionId`, `s3:x-amz-*` request
  headers, `s3:RequestObjectTag/*`, `s3:authType`, `s3:signatureversion`, `s3:signatureAge`;
  `cloudwatch:namespace`; `dynamodb:ReturnValues`, `dynamodb:Select`, `dynamodb:ReturnConsumedCapacity`;
  for service principals (`evaluate_service_principal`) whatever the caller passes (`aws:SourceArn`,
  `aws:SourceAccount`).
- Authentication: SigV4 from the Authorization header or a presigned URL (and S3's SigV2 presigned form,
  which boto3 still makes), session tokens, presigned expiry, `x-amz-content-sha256`, a credential scope
  naming the endpoint's region and service, `host` among the signed headers, and a request time within 15
  minutes of the server's clock. Unknown keys, bad signatures, missing authentication, expired URLs, a
  wrong scope, an unsigned host and a skewed clock get AWS's codes.
- One reading of each request (`canonical`): the enforcer authorizes the request in one canonical form
  (path-style S3 with no body where S3 reads none, each parameter once, one SQS queue, JSON bodies alone and
  written anew so that moto cannot read them as a form, query calls as one form naming their Action) and
  forwards exactly that form to moto; what AWS would refuse (repeated parameters, a queue named two ways, a
  `Host` that is neither the emulator nor `<bucket>.<one of its host names>`) is refused with AWS's code. Host names:
  `IamEnforcer(host_names=...)`, by default `localhost`, `127.0.0.1`, `::1` and the address it serves on.

What is not enforced, and why
- Permission boundaries, service control policies, resource control policies and session policies: the
  templates servestack synthesizes define none, and they need an organization or an AssumeRole policy
  argument that local mode never has. A stack that adds a boundary is more permissive locally than in AWS.
- KMS key policies and grants: moto stores SSE-KMS settings but does not encrypt, so no KMS call happens
  locally; a role missing `kms:Decrypt` on a customer key passes locally and fails in AWS.
- Tag-based access control beyond the keys listed above (`aws:ResourceTag/*`, `aws:PrincipalTag/*`,
  `s3:ExistingObjectTag/*`, `dynamodb:LeadingKeys`, `dynamodb:Attributes`): their values live in the data
  plane or in IAM tags local mode does not track. A condition on them sees the key as absent.
- VPC endpoint policies, `aws:SourceVpc`/`aws:SourceVpce`: local calls do not go through a VPC.
- Policy variables (`${aws:username}`) are not substituted: a Resource holding one matches only itself,
  which denies (fails closed).
- S3 ACLs and Object Ownership, S3 Block Public Access, requester pays: not evaluated (servestack's buckets
  disable ACLs and block public access).
- Per-chunk signatures of `aws-chunked` uploads (the seed signature is checked).
- Resource policies changed at run time through the emulator's API (`PutBucketPolicy`,
  `SetQueueAttributes(Policy)`) are not picked up: `ResourcePolicies` is loaded from the templates.
- Calls the engine does not recognise (servestack/local/iam/operations.py and its families list what it knows)
  are checked as `<service>:<Operation>` on `*`: a policy scoped to ARNs denies them and the refusal says why.

Why not moto's own enforcement (moto 5.2.5, `INITIAL_NO_AUTH_ACTION_COUNT`, `moto/iam/access_control.py`)
Tried in-process with `mock_aws` and an IAM user holding a servestack-like policy
(tests/functional/test_iam_moto_builtin.py repeats the experiment):
- Every request other than S3, SQS, IAM and STS is checked against resource `*` (`call_action` only asks
  services with a `_determine_resource`): `dynamodb:PutItem` allowed on `table/jobs` is refused on that
  table. The refusal is query-protocol XML, which boto3's JSON parser cannot read (error code `403`).
- The action takes the SigV4 signing name as its prefix: CloudWatch calls are checked as
  `monitoring:PutMetricData`, which no `cloudwatch:` statement matches.
- Conditions: only `StringEquals` is evaluated, and request values are only filled in for `sts:ExternalId`;
  any other operator and any absent key count as satisfied. So an Allow with a condition allows whatever the
  request (`ListBucket` under `StringLike s3:prefix input/*` lists `output/`), and a Deny with a condition
  denies whatever the request (CDK's `enforce_ssl` bucket policy, `Deny` when `aws:SecureTransport` is
  `false`, refuses every S3 call). An Allow whose condition fails becomes an explicit deny.
- Action matching is a case-sensitive regular expression built from the pattern (`.` and `?` are regex
  characters); resource policies other than bucket policies are not read; Lambda, SageMaker Runtime and
  API Gateway are not moto's to serve in local mode at all.
Hence our own engine in front of moto, with moto's check left off.
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servestack.local.iam.access import LocalAccess
    from servestack.local.iam.conditions import PolicyError
    from servestack.local.iam.control import CONTROL_PREFIX, ControlGate, is_control_path
    from servestack.local.iam.enforcer import DISABLED_WARNING, IamEnforcer, disabled_warning
    from servestack.local.iam.identities import ADMIN_POLICY, DEVELOPER, Credentials, Identity, IdentityStore
    from servestack.local.iam.operations import Check, ExecuteApi, Operation
    from servestack.local.iam.policy import Caller, Decision, Policy, compile_policy
    from servestack.local.iam.replies import access_denied
    from servestack.local.iam.resource_policies import ResourcePolicies, evaluate_service_principal, lambda_permission
    from servestack.local.iam.roles_route import ROUTE, RolePolicies
    from servestack.local.iam.server import EnforcedMotoServer
    from servestack.local.iam.sigv4 import AuthFailure, authenticate, check_scope, parse_signature
    from servestack.local.iam.verdicts import Denial
    from servestack.local.iam.wire import HttpRequest
else:
    from servestack.local import lazy_interface

    __getattr__, __dir__ = lazy_interface(__name__, __file__)

__all__ = [
    "ADMIN_POLICY",
    "CONTROL_PREFIX",
    "DEVELOPER",
    "DISABLED_WARNING",
    "ROUTE",
    "AuthFailure",
    "Caller",
    "Check",
    "ControlGate",
    "Credentials",
    "Decision",
    "Denial",
    "EnforcedMotoServer",
    "ExecuteApi",
    "HttpRequest",
    "IamEnforcer",
    "Identity",
    "IdentityStore",
    "LocalAccess",
    "Operation",
    "Policy",
    "PolicyError",
    "ResourcePolicies",
    "RolePolicies",
    "access_denied",
    "authenticate",
    "check_scope",
    "compile_policy",
    "disabled_warning",
    "evaluate_service_principal",
    "is_control_path",
    "lambda_permission",
    "parse_signature",
]
