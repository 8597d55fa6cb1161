"""Print a gpu-k8s bootstrap secret from Google Secret Manager to stdout (run at first boot, as root).

Usage: python3 fetch_secret.py projects/<project>/secrets/<secret> | python3 write_secret_files.py

The node authenticates as its service account (gce_api.py, beside this script); Secret Manager's REST API
returns the latest version's payload, base64-encoded. Standard library only. Errors name their type only,
never a value.
"""

import base64
import json
import sys
import urllib.request

from gce_api import access_token

SECRET_MANAGER = "https://secretmanager.googleapis.com/v1"


def access_url(secret):
    return f"{SECRET_MANAGER}/{secret}/versions/latest:access"


def secret_value(secret):
    headers = {"Authorization": f"Bearer {access_token()}"}
    request = urllib.request.Request(access_url(secret), headers=headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        return base64.b64decode(json.loads(response.read())["payload"]["data"]).decode()


def main():
    try:
        sys.stdout.write(secret_value(sys.argv[1]))
    except (OSError, ValueError, KeyError) as error:
        # The service account's access can take a moment to propagate after boot; the caller retries.
        print(f"gpu-k8s: reading {sys.argv[1]} failed ({type(error).__name__})", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
