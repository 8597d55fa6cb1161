"""The first boot's founding check and marker on a k3s server (their meaning: the comment on
NodeBootstrap.snapshot_store_py). `founded <bucket>` prints `founded` or `new`; `record <bucket>` writes the
marker. S3 REST calls signed with the instance profile (aws_api.py, beside this script); errors name their
type only.
"""

import datetime
import hashlib
import sys
import urllib.parse
import urllib.request
import xml.etree.ElementTree as ElementTree

from aws_api import instance_credentials, sign

MARKER = "gpu-k8s/founded"


def s3(method, bucket, key, query, body=b""):
    region, credentials = instance_credentials()
    host = f"s3.{region}.amazonaws.com"
    path = f"/{bucket}/{key}"
    headers = {"x-amz-content-sha256": hashlib.sha256(body).hexdigest()}
    if method == "PUT":
        headers["content-type"] = "application/octet-stream"
    now = datetime.datetime.now(datetime.UTC)
    signed = sign(method, host, path, query, headers, body, "s3", region, credentials, now)
    url = f"https://{host}{urllib.parse.quote(path, safe='/-_.~')}"
    if query:
        url += "?" + urllib.parse.urlencode(sorted(query.items()))
    request = urllib.request.Request(
        url, data=body if method == "PUT" else None, method=method, headers=signed
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.read()


def founded(bucket):
    """ListObjectsV2 of at most one key, anywhere in the bucket."""
    answer = ElementTree.fromstring(s3("GET", bucket, "", {"list-type": "2", "max-keys": "1"}))
    return any(element.tag.rsplit("}", 1)[-1] == "Contents" for element in answer)


def record(bucket):
    s3("PUT", bucket, MARKER, {})


def main():
    command, bucket = sys.argv[1], sys.argv[2]
    try:
        if command == "founded":
            print("founded" if founded(bucket) else "new")
        else:
            record(bucket)
    except (OSError, ValueError, KeyError, ElementTree.ParseError) as error:
        print(f"gpu-k8s: {command} in {bucket} failed ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
