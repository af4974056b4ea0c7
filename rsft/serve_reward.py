"""`python -m rsft.serve_reward <spec>`: serve a reward source over HTTP (reward.server; docs/reward-server.md),
a user's mistake ending as one line as every rsft command's does (rsft.errors.main_guard)."""

from reward.server import main
from rsft.errors import main_guard

if __name__ == "__main__":
    raise SystemExit(main_guard(main)())
