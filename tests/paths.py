"""Where the checkout's files are (tests read the repository, not an installed package)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
