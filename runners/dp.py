"""(skeleton: being written for issue 14)"""

from __future__ import annotations

from runners import harness


def apply_dp(model, ctx: harness.Context) -> harness.Parallel:
    raise NotImplementedError("dp: not written yet (issue 14)")


if __name__ == "__main__":
    harness.main(apply_dp)
