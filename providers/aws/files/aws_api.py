"""What gpu-k8s's scripts on an EC2 node share: the instance's identity from IMDSv2 and Signature Version 4
signed calls to AWS JSON APIs, with the Python standard library only (Ubuntu cloud images have no AWS CLI).
The node keeps it beside the scripts that import it (cloud-init writes them to the same directory)."""

import datetime
import hashlib
import hmac
import json
import urllib.request
from urllib.parse import quote

IMDS = "http://169.254.169.254/latest"


def imds(path, token):
    request = urllib.request.Request(f"{IMDS}/{path}", headers={"X-aws-ec2-metadata-token": token})
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.read().decode()


def imds_token():
    request = urllib.request.Request(
        f"{IMDS}/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return response.read().decode()


def instance_credentials():
    """The node's region and its instance profile's current credentials."""
    token = imds_token()
    region = imds("meta-data/placement/region", token)
    role = imds("meta-data/iam/security-credentials/", token).splitlines()[0]
    return region, json.loads(imds(f"meta-data/iam/security-credentials/{role}", token))


def _hmac(key, message):
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def sign(method, host, path, query, headers, body, service, region, credentials, now):
    """`headers` with the SigV4 date, session token and authorization added (AWS General Reference,
    "Signature Version 4 signing process"). `query`: the request's parameters, unencoded."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = now.strftime("%Y%m%d")
    headers = {
        **{name.lower(): value for name, value in headers.items()},
        "host": host,
        "x-amz-date": amz_date,
    }
    if credentials.get("Token"):
        headers["x-amz-security-token"] = credentials["Token"]
    names = sorted(headers)
    canonical = "\n".join(
        [
            method,
            quote(path, safe="/-_.~"),
            "&".join(f"{quote(k, safe='-_.~')}={quote(v, safe='-_.~')}" for k, v in sorted(query.items())),
            "".join(f"{name}:{headers[name]}\n" for name in names),
            ";".join(names),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{date}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(
        _hmac(_hmac(_hmac(("AWS4" + credentials["SecretAccessKey"]).encode(), date), region), service),
        "aws4_request",
    )
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials['AccessKeyId']}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def signed_headers(host, service, region, target, credentials, body, now):
    """Headers of a signed AWS JSON 1.1 request: POST / with the operation in X-Amz-Target."""
    headers = {"content-type": "application/x-amz-json-1.1", "x-amz-target": target}
    return sign("POST", host, "/", {}, headers, body, service, region, credentials, now)


def call(host, service, region, target, credentials, payload, endpoint=None):
    """One AWS JSON 1.1 call to https://<host> (or `endpoint`, in tests); the decoded answer."""
    body = json.dumps(payload).encode()
    now = datetime.datetime.now(datetime.UTC)
    headers = signed_headers(host, service, region, target, credentials, body, now)
    request = urllib.request.Request(
        f"{endpoint or 'https://' + host}/", data=body, method="POST", headers=headers
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())
