"""Write the files of a gpu-k8s bootstrap secret from AWS Secrets Manager (run once, at first boot, as root).

Usage: python3 fetch_secret.py <secret name or ARN>

The node authenticates with its instance profile: credentials come from IMDSv2 and the request is signed
with Signature Version 4, using only the Python standard library (Ubuntu cloud images have no AWS CLI).
The secret's value is JSON {"files": {path: content}}; each file is written with mode 0600 and nothing of it
is printed.
"""

import datetime
import hashlib
import hmac
import json
import os
import sys
import time
import urllib.request

IMDS = "http://169.254.169.254/latest"
SERVICE = "secretsmanager"
ATTEMPTS = 10


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


def write_files(payload):
    for path, content in json.loads(payload)["files"].items():
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(content)
        print(f"gpu-k8s: wrote {path}")


def main():
    secret_id = sys.argv[1]
    for attempt in range(1, ATTEMPTS + 1):
        try:
            write_files(secret_value(secret_id))
            return 0
        except OSError as error:
            # The instance profile's credentials can take a moment to appear after boot.
            print(f"gpu-k8s: reading {secret_id} failed ({type(error).__name__}), attempt {attempt}")
            time.sleep(min(2**attempt, 30))
    return 1


if __name__ == "__main__":
    sys.exit(main())
