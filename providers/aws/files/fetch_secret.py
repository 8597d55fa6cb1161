"""Print a gpu-k8s bootstrap secret from AWS Secrets Manager to stdout (run at first boot, as root).

Usage: python3 fetch_secret.py <secret name or ARN> | python3 write_secret_files.py

The node authenticates with its instance profile: credentials come from IMDSv2 and the request is signed
with Signature Version 4, using only the Python standard library (Ubuntu cloud images have no AWS CLI).
Errors name their type only, never a value.
"""

import datetime
import hashlib
import hmac
import json
import sys
import urllib.request

IMDS = "http://169.254.169.254/latest"
SERVICE = "secretsmanager"


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


def _hmac(key, message):
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def signed_headers(region, credentials, body, now):
    """Headers of a SigV4-signed Secrets Manager GetSecretValue request (AWS General Reference, "Signature
    Version 4 signing process")."""
    host = f"{SERVICE}.{region}.amazonaws.com"
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = now.strftime("%Y%m%d")
    headers = {
        "content-type": "application/x-amz-json-1.1",
        "host": host,
        "x-amz-date": amz_date,
        "x-amz-target": "secretsmanager.GetSecretValue",
    }
    if credentials.get("Token"):
        headers["x-amz-security-token"] = credentials["Token"]
    names = sorted(headers)
    canonical = "\n".join(
        [
            "POST",
            "/",
            "",
            "".join(f"{name}:{headers[name]}\n" for name in names),
            ";".join(names),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{date}/{region}/{SERVICE}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(
        _hmac(_hmac(_hmac(("AWS4" + credentials["SecretAccessKey"]).encode(), date), region), SERVICE),
        "aws4_request",
    )
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={credentials['AccessKeyId']}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return headers


def secret_value(secret_id):
    token = imds_token()
    region = imds("meta-data/placement/region", token)
    role = imds("meta-data/iam/security-credentials/", token).splitlines()[0]
    credentials = json.loads(imds(f"meta-data/iam/security-credentials/{role}", token))
    body = json.dumps({"SecretId": secret_id}).encode()
    headers = signed_headers(region, credentials, body, datetime.datetime.now(datetime.UTC))
    request = urllib.request.Request(f"https://{headers['host']}/", data=body, method="POST", headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())["SecretString"]


def main():
    try:
        sys.stdout.write(secret_value(sys.argv[1]))
    except (OSError, ValueError, KeyError) as error:
        # The instance profile's credentials can take a moment to appear after boot; the caller retries.
        print(f"gpu-k8s: reading {sys.argv[1]} failed ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
