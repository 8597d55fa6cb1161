"""Upstream contract data (Helm chart values, CRDs, schemas, examples) at pinned commits, verified by sha256.

    gpu-k8s upstream verify    # check every file against upstream/manifest.json; exit 1 on a problem
    gpu-k8s upstream fetch     # re-download missing or altered files from their pinned URLs

The files are committed under `upstream/` next to `manifest.json` (Apache-2.0, licence and NOTICE files
beside them), so the tests need neither network nor anything outside the clone. The manifest lists each
file's path, its URL at the pinned upstream commit and its sha256; bumping a pin means editing the entry
and running `fetch`. $GPU_K8S_UPSTREAM points the tests at another verified copy.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import sys
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# In a checkout the repository's upstream/; an installed package carries only what the program renders.
UPSTREAM_ROOT = Path(__file__).resolve().parents[1] / "upstream"
MANIFEST = UPSTREAM_ROOT / "manifest.json"
FETCH_HINT = "restore it with `git checkout upstream/` or `gpu-k8s upstream fetch`"


@dataclass(frozen=True)
class UpstreamFile:
    path: str
    url: str
    sha256: str
    # An excerpt (a YAML example inside a README): these 1-based lines of `url`, inclusive, after `prefix`
    # (a comment naming the source).
    lines: tuple[int, int] | None = None
    prefix: str = ""
    # A file inside a zip archive at `url` (a data file a PyPI wheel ships, such as Google's discovery docs).
    member: str | None = None

    def content(self, downloaded: bytes) -> bytes:
        if self.member is not None:
            with zipfile.ZipFile(io.BytesIO(downloaded)) as archive:
                return archive.read(self.member)
        if self.lines is None:
            return downloaded
        first, last = self.lines
        excerpt = downloaded.decode().splitlines(keepends=True)[first - 1 : last]
        return (self.prefix + "".join(excerpt)).encode()


def manifest() -> list[UpstreamFile]:
    return [
        UpstreamFile(**{**entry, "lines": tuple(entry["lines"])} if "lines" in entry else entry)
        for entry in json.loads(MANIFEST.read_text())["files"]
    ]


def upstream_dir() -> Path:
    return Path(os.environ.get("GPU_K8S_UPSTREAM") or UPSTREAM_ROOT)


def sha256_of(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class UpstreamMissing(Exception):
    """A contract file is absent or differs from the pinned one."""


def locate(relative_path: str, root: Path | None = None) -> Path:
    """The verified local copy of a manifest file; UpstreamMissing says why it cannot be used."""
    entry = next((f for f in manifest() if f.path == relative_path), None)
    if entry is None:
        raise KeyError(f"{relative_path} is not in {MANIFEST}")
    path = (root or upstream_dir()) / relative_path
    if not path.is_file():
        raise UpstreamMissing(f"contract file {path} is missing; {FETCH_HINT}")
    if sha256_of(path) != entry.sha256:
        raise UpstreamMissing(f"contract file {path} does not match its pinned sha256; {FETCH_HINT}")
    return path


def _download(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=60) as response:
        return response.read()


def fetch(root: Path, download: Callable[[str], bytes] = _download) -> list[str]:
    """Download every missing or altered file into `root`; returns the paths fetched.

    A download whose sha256 differs from the manifest is rejected and nothing is written for it.
    """
    fetched = []
    for entry in manifest():
        target = root / entry.path
        if target.is_file() and sha256_of(target) == entry.sha256:
            continue
        body = entry.content(download(entry.url))
        digest = hashlib.sha256(body).hexdigest()
        if digest != entry.sha256:
            raise UpstreamMissing(f"{entry.url} has sha256 {digest}, expected {entry.sha256}; not written")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(body)
        fetched.append(entry.path)
    return fetched


def verify(root: Path) -> list[str]:
    """Problems with the local copy, one line per file; empty when everything matches."""
    problems = []
    for entry in manifest():
        try:
            locate(entry.path, root)
        except UpstreamMissing as exc:
            problems.append(str(exc))
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpu-k8s upstream", description=__doc__.split("\n")[0])
    parser.add_argument("command", choices=["fetch", "verify"])
    args = parser.parse_args(argv)
    if not MANIFEST.is_file():
        print(
            f"{MANIFEST}: not here; the contract data ships with a checkout of gpu-k8s, run it there",
            file=sys.stderr,
        )
        return 2
    root = upstream_dir()
    if args.command == "fetch":
        fetched = fetch(root)
        print(f"fetched {len(fetched)} file(s) into {root}")
    problems = verify(root)
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"all {len(manifest())} contract files in {root} match upstream/manifest.json")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
