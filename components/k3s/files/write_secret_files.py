"""Write the files of a gpu-k8s bootstrap secret (run once, at first boot, as root).

Usage: <cloud's fetch script> <secret> | python3 write_secret_files.py

The payload on stdin is JSON {"files": {path: content}}. It is parsed whole before anything is written, so
a failed or partial fetch writes nothing. Each file gets mode 0600 in a directory of mode 0700, and only
the paths are printed.
"""

import json
import os
import sys


def write_files(payload):
    files = json.loads(payload)["files"]
    for path, content in files.items():
        os.makedirs(os.path.dirname(path), mode=0o700, exist_ok=True)
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(content)
        print(f"gpu-k8s: wrote {path}")


def main():
    try:
        write_files(sys.stdin.read())
    except (ValueError, KeyError):
        print("gpu-k8s: the secret payload is not the expected JSON", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
