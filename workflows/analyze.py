"""``python workflows/analyze.py <exp_dir> [--out DIR] [--target-params 1e9] [--target-flops 1e21]``

Analyses a ladder or LR-sweep experiment dir (or one run dir). A ladder: per-size losses; L(N, D)
(Chinchilla approach 3), the frontier L(C) and the isoFLOP line (approach 2) with bootstrap
intervals and degenerate-fit flags; the compute-optimal N, D and loss at --target-flops (default
10x the largest run's compute) by each approach; the largest size held out and predicted by both
laws. A sweep: every trial compared at a common step, the optimal LR per size and LR*(N). PNGs.
"""

from __future__ import annotations

import argparse

from trainer_core.analysis import report_experiment
from trainer_core.config.cli import exit_on_error
from trainer_core.io import storage
from trainer_core.io.output_dir import check_output_dir


def main() -> int:
    doc = __doc__.strip().splitlines()
    parser = argparse.ArgumentParser(description="\n".join(doc[2:]), usage=doc[0].strip("`"))
    parser.add_argument(
        "exp_dir", help="experiment dir (with runs/) or a single run dir; may be a URL (s3://...)"
    )
    parser.add_argument(
        "--out", help="where the PNGs go (default <exp_dir>/analysis); a URL is uploaded to"
    )
    parser.add_argument(
        "--target-params", type=float, help="predict the loss of a model this size (N)"
    )
    parser.add_argument(
        "--target-flops", type=float, help="predict the loss at this compute budget"
    )
    parser.add_argument(
        "--bootstrap", type=int, default=200, help="bootstrap resamples for the CIs"
    )
    args = parser.parse_args()
    out = check_output_dir(args.out or storage.join(args.exp_dir, "analysis"), "--out")
    report_experiment(args.exp_dir, out, args.target_params, args.target_flops, args.bootstrap)
    return 0


if __name__ == "__main__":
    exit_on_error(main)
