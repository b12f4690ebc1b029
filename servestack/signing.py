"""The one SigV4 client signer of servestack: the headers `aws`, the SDKs and `curl --aws-sigv4` add to a
request (Authorization, X-Amz-Date, X-Amz-Security-Token, x-amz-content-sha256 where the service wants it),
by botocore's signer. `servestack invoke` against `local up`, the client's Function URL / HTTP API targets
and `loadtest`'s https targets all sign here."""

from __future__ import annotations

from collections.abc import Mapping


def sigv4_headers(
    method: str,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    access_key_id: str,
    secret_access_key: str,
    session_token: str | None,
    service: str,
    region: str,
) -> dict[str, str]:
    """`headers` plus the SigV4 ones for `method url` with `body`, signed for `service` in `region`."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    SigV4Auth(Credentials(access_key_id, secret_access_key, session_token), service, region).add_auth(request)
    return {name: str(value) for name, value in request.headers.items()}
