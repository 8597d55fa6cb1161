"""Where the checkout's files are (tests read the repository, not an installed package)."""

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
# The stacks the tests plan: frozen copies, so that a user editing `stacks/` (their own configuration) never
# breaks the project's tests. `make snapshots` refreshes both the copies' plans and `stacks/plans`.
FIXTURE_STACKS = REPO_ROOT / "tests" / "fixtures" / "stacks"
FIXTURE_PLANS = FIXTURE_STACKS / "plans"
