"""``python workflows/analyze.py <exp_dir> [--out DIR] [--target-params 1e9] [--target-flops 1e21] [--hparam-sweep DIR] [--device H100] [--mfu 0.4] [--task-accuracy auto] [--bootstrap 200]``

Analyses a ladder or LR-sweep experiment dir (or one run dir). A ladder: per-size losses; L(N, D)
(Chinchilla approach 3), the frontier L(C) and the isoFLOP line (approach 2) with bootstrap
intervals and degenerate-fit flags; the compute-optimal N, D and loss at --target-flops (default
10x the largest run's compute) by each approach, with LR* and B* from a sweep's laws and the cost
in device-hours; the largest size held out and predicted by both laws; with task evals, each
size's task loss and accuracy and the held-out size's two-step task prediction. A sweep: every trial compared at a common step, the optimal LR per size and LR*(N). PNGs.
"""

from __future__ import annotations

import argparse

from trainer_core.analysis import TargetSettings, report_experiment
from trainer_core.analysis.ladder_table import ACCURACIES, AUTO
from trainer_core.config.arg_types import fraction, non_negative_int, positive_number
from trainer_core.config.cli import exit_on_error
from trainer_core.io import storage
from trainer_core.io.output_dir import check_output_dir
from trainer_core.io.run_dir import ANALYSIS


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
        "--target-params",
        type=positive_number,
        help="predict the loss of a model this size (N), trained on --target-flops when given "
        "(D = C / 6N), else on its compute-optimal D",
    )
    parser.add_argument(
        "--target-flops", type=positive_number, help="predict the loss at this compute budget"
    )
    parser.add_argument(
        "--bootstrap",
        type=non_negative_int,
        default=200,
        help="bootstrap resamples for the CIs (default: %(default)s; 0: no intervals)",
    )
    parser.add_argument(
        "--hparam-sweep",
        default="",
        help="sweep dir whose LR*(N, D) and B* laws fill the target table (default: the "
        "ladder's lr.from_sweep for LR*, its batch.from_sweep for B*)",
    )
    parser.add_argument(
        "--device",
        default="",
        help="price the target in hours of this device (default: the experiment's device_type)",
    )
    parser.add_argument(
        "--mfu", type=fraction, help="assumed MFU for the device-hours (default: assumed_mfu, 0.4)"
    )
    parser.add_argument(
        "--task-accuracy",
        default=AUTO,
        choices=(AUTO, *ACCURACIES),
        help="the accuracy the two-step task prediction fits (default auto: acc_pmi where a "
        "task was scored with uncond contexts, else acc)",
    )
    args = parser.parse_args()
    out = check_output_dir(args.out or storage.join(args.exp_dir, ANALYSIS), "--out")
    target = TargetSettings(args.device, args.mfu, args.hparam_sweep)
    report_experiment(
        args.exp_dir,
        out,
        args.target_params,
        args.target_flops,
        args.bootstrap,
        target=target,
        task_accuracy=args.task_accuracy,
    )
    return 0


if __name__ == "__main__":
    exit_on_error(main)
