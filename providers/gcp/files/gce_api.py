"""What gpu-k8s's scripts on a Compute Engine node share: the service account's access token from the
metadata server (which answers only requests that carry Metadata-Flavor: Google), with the Python standard
library only. The node keeps it beside the scripts that import it (cloud-init writes them to the same
directory)."""

import json
import urllib.request

METADATA = "http://metadata.google.internal/computeMetadata/v1"


def access_token():
    request = urllib.request.Request(
        f"{METADATA}/instance/service-accounts/default/token", headers={"Metadata-Flavor": "Google"}
    )
    with urllib.request.urlopen(request, timeout=5) as response:
        return json.loads(response.read())["access_token"]
