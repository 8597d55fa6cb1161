"""The first boot's founding check and marker on a k3s server (their meaning: the comment on
NodeBootstrap.snapshot_store_py). `founded <bucket>` prints `founded` or `new`; `record <bucket>` writes the
marker. Cloud Storage's JSON API as the service account (gce_api.py, beside this script); errors name their
type only.
"""

import json
import sys
import urllib.parse
import urllib.request

from gce_api import access_token

STORAGE = "https://storage.googleapis.com"
MARKER = "gpu-k8s/founded"


def storage(method, url, body=None):
    headers = {"Authorization": f"Bearer {access_token()}"}
    if body is not None:
        headers["Content-Type"] = "application/octet-stream"
    request = urllib.request.Request(f"{STORAGE}{url}", data=body, method=method, headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read() or b"{}")


def founded(bucket):
    """objects.list of at most one object, anywhere in the bucket."""
    answer = storage("GET", f"/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?maxResults=1")
    return bool(answer.get("items"))


def record(bucket):
    query = urllib.parse.urlencode({"uploadType": "media", "name": MARKER})
    storage("POST", f"/upload/storage/v1/b/{urllib.parse.quote(bucket, safe='')}/o?{query}", b"")


def main():
    command, bucket = sys.argv[1], sys.argv[2]
    try:
        if command == "founded":
            print("founded" if founded(bucket) else "new")
        else:
            record(bucket)
    except (OSError, ValueError, KeyError) as error:
        print(f"gpu-k8s: {command} in {bucket} failed ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
