"""Write the files of a gpu-k8s bootstrap secret (run once, at first boot, as root).

Usage: <cloud's fetch script> <secret> | python3 write_secret_files.py

The payload on stdin is JSON {"files": {path: content}}. It is parsed and every path checked before anything
is written, so a failed or partial fetch, or a payload naming any other path, writes nothing. Only the places
a bootstrap secret has (the join tokens, the etcd snapshot credentials, the cluster's certificates and keys)
are written: whoever can change the secret cannot make this root process write anywhere else (though
through the snapshot credentials, a k3s config drop-in, they can set k3s options: no more than the CA keys
in the same secret already give). Each file
gets mode 0600 in a directory of mode 0700, is never written through a symbolic link, and only the paths
are printed.
"""

import json
import os
import sys

# components/k3s/cloudinit.py builds the payloads; tests/test_k3s.py keeps the two in step.
ALLOWED_FILES = (
    "/etc/rancher/k3s/token",
    "/etc/rancher/k3s/agent-token",
    "/etc/rancher/k3s/config.yaml.d/20-etcd-s3-credentials.yaml",
)
ALLOWED_DIRECTORIES = ("/var/lib/rancher/k3s/server/tls", "/var/lib/rancher/k3s/server/tls/etcd")


class RefusedPath(ValueError):
    pass


def allowed(path):
    """An absolute, normalised path that is one of the known files, or a plain file name in a known
    directory."""
    if not isinstance(path, str) or os.path.normpath(path) != path or not path.startswith("/"):
        return False
    directory, name = os.path.split(path)
    if path in ALLOWED_DIRECTORIES:
        return False
    return path in ALLOWED_FILES or (directory in ALLOWED_DIRECTORIES and not name.startswith("."))


def write_files(payload, root="/"):
    files = json.loads(payload)["files"]
    if not isinstance(files, dict) or not all(isinstance(content, str) for content in files.values()):
        raise ValueError("files must map paths to text")
    refused = sorted(str(path) for path in files if not allowed(path))
    if refused:
        raise RefusedPath(", ".join(refused))
    for path, content in files.items():
        target = os.path.join(root, path.lstrip("/"))
        os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
        descriptor = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "w") as handle:
            handle.write(content)
        print(f"gpu-k8s: wrote {path}")


def main():
    try:
        write_files(sys.stdin.read())
    except RefusedPath as refused:
        print(f"gpu-k8s: the secret payload names paths outside its own: {refused}", file=sys.stderr)
        return 1
    except (ValueError, KeyError, AttributeError, TypeError):
        print("gpu-k8s: the secret payload is not the expected JSON", file=sys.stderr)
        return 1
    except OSError as error:
        print(f"gpu-k8s: could not write the secret's files: {error.strerror}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
