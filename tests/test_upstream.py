"""The upstream contract-data manifest and its fetch/verify tool (no network: downloads are faked)."""

from __future__ import annotations

import hashlib
import io
import re
import zipfile
from pathlib import Path

import pytest

from gpu_k8s.tools import upstream as up
from tests.conftest import upstream


def test_manifest_pins_every_file_to_a_commit_or_a_released_wheel():
    files = up.manifest()
    assert len(files) >= 80
    for entry in files:
        assert len(entry.sha256) == 64
        if entry.member is not None:
            # PyPI file URLs are immutable; the wheel's version is in its name.
            assert entry.url.startswith("https://files.pythonhosted.org/packages/"), entry.url
            assert re.search(r"-\d+\.\d+\.\d+-py3-none-any\.whl$", entry.url), entry.url
            continue
        assert entry.url.startswith("https://raw.githubusercontent.com/")
        assert len(entry.url.split("/")[5]) == 40, entry.url  # the commit sha, never a branch


def test_fetch_writes_verified_files_and_skips_present_ones(tmp_path: Path, monkeypatch):
    entry = up.UpstreamFile(
        "chart/values.yaml", "https://example.invalid/values.yaml", hashlib.sha256(b"a: 1\n").hexdigest()
    )
    monkeypatch.setattr(up, "manifest", lambda: [entry])
    calls = []

    def fake_download(url: str) -> bytes:
        calls.append(url)
        return b"a: 1\n"

    assert up.fetch(tmp_path, fake_download) == ["chart/values.yaml"]
    assert up.fetch(tmp_path, fake_download) == []
    assert calls == [entry.url]
    assert up.verify(tmp_path) == []


def test_fetch_refuses_a_tampered_download(tmp_path: Path, monkeypatch):
    entry = up.UpstreamFile("x.yaml", "https://example.invalid/x.yaml", hashlib.sha256(b"good").hexdigest())
    monkeypatch.setattr(up, "manifest", lambda: [entry])
    with pytest.raises(up.UpstreamMissing, match="not written"):
        up.fetch(tmp_path, lambda url: b"evil")
    assert not (tmp_path / "x.yaml").exists()


def test_locate_rejects_an_altered_file(tmp_path: Path, monkeypatch):
    entry = up.UpstreamFile("x.yaml", "https://example.invalid/x.yaml", hashlib.sha256(b"good").hexdigest())
    monkeypatch.setattr(up, "manifest", lambda: [entry])
    (tmp_path / "x.yaml").write_bytes(b"changed")
    with pytest.raises(up.UpstreamMissing, match="sha256"):
        up.locate("x.yaml", tmp_path)
    assert up.verify(tmp_path)


def test_missing_contract_data_skips_locally_and_fails_in_ci(tmp_path: Path, monkeypatch):
    from _pytest.outcomes import Failed, Skipped

    monkeypatch.setenv("GPU_K8S_UPSTREAM", str(tmp_path))
    path = up.manifest()[0].path
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(Skipped, match="gpu-k8s upstream fetch"):
        upstream(path)
    monkeypatch.setenv("CI", "true")
    with pytest.raises(Failed, match="gpu-k8s upstream fetch"):
        upstream(path)


def test_fetch_cuts_a_readme_excerpt_and_verifies_it(tmp_path: Path, monkeypatch):
    readme = "".join(f"line {n}\n" for n in range(1, 21))
    expected = b"# from README lines 3-5\nline 3\nline 4\nline 5\n"
    entry = up.UpstreamFile(
        "ex.yaml",
        "https://example.invalid/README.md",
        hashlib.sha256(expected).hexdigest(),
        lines=(3, 5),
        prefix="# from README lines 3-5\n",
    )
    monkeypatch.setattr(up, "manifest", lambda: [entry])
    assert up.fetch(tmp_path, lambda url: readme.encode()) == ["ex.yaml"]
    assert (tmp_path / "ex.yaml").read_bytes() == expected


def test_fetch_takes_a_member_out_of_a_wheel_and_verifies_it(tmp_path: Path, monkeypatch):
    document = b'{"name": "container"}'
    wheel = io.BytesIO()
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("pkg/documents/container.v1.json", document)
        archive.writestr("pkg/other.json", b"{}")
    entry = up.UpstreamFile(
        "api/container.v1.json",
        "https://example.invalid/pkg-1.0-py3-none-any.whl",
        hashlib.sha256(document).hexdigest(),
        member="pkg/documents/container.v1.json",
    )
    monkeypatch.setattr(up, "manifest", lambda: [entry])
    assert up.fetch(tmp_path, lambda url: wheel.getvalue()) == ["api/container.v1.json"]
    assert (tmp_path / "api/container.v1.json").read_bytes() == document


def test_excerpt_entries_match_their_local_copies():
    """Each excerpt's verified copy is its prefix plus exactly the manifest's line range."""
    excerpts = [entry for entry in up.manifest() if entry.lines]
    assert len(excerpts) == 3
    for entry in excerpts:
        assert entry.url.endswith("/README.md")
        text = upstream(entry.path).read_text()
        first, last = entry.lines
        assert text.startswith(entry.prefix) and f"lines {first}-{last}" in entry.prefix
        assert len(text.removeprefix(entry.prefix).splitlines()) == last - first + 1


def test_the_committed_contract_data_matches_the_manifest():
    assert up.verify(up.UPSTREAM_ROOT) == []
    assert (up.UPSTREAM_ROOT / "LICENSE-Apache-2.0.txt").is_file()
