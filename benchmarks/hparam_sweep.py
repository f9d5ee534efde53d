"""Fit LR*(N, D) and B* to a real sweep's dir, and check held-out cells against the prediction.

    python benchmarks/hparam_sweep.py SWEEP_DIR [--plots DIR] [--predict N,D ...]
                                      [--held-out DIR] [--batch TOKENS] [--bootstrap 1000]

SWEEP_DIR: a ``workflows/lr_sweep.py`` dir whose trials vary LR and batch (``sweep.batch_factors``)
at several horizons (``sweep.horizons``; under WSD-S each trial's decays give them all). Its
annealed points become the (N, D, lr, batch, loss) table (``hparam_table``), whose cells and laws
``fit_hparam_laws`` fits. ``--predict``: LR* and B* with intervals at (N, D), e.g. to centre a
held-out grid. ``--held-out``: a second sweep dir at (N, D) cells the fit never saw; each such
cell's measured LR* is set against the law's interval there (widened by the cell's own error).
``--batch``: fit only the trials at one batch, to check a held-out grid run at that batch (the
joint law's LR* is the LR of the best batch, which may not be the held-out grid's).
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pandas as pd

from trainer_core.analysis import (
    cell_optima,
    fit_hparam_laws,
    held_out_check,
    hparam_table,
    load,
    plot_cell_sweeps,
    plot_hparam_laws,
)
from trainer_core.config.arg_types import positive_number
from trainer_core.config.cli import exit_on_error


def cells_table(table: pd.DataFrame) -> str:
    """Trials per (N, D) cell and the LRs and batches each tried."""
    rows = table.groupby(["N", "D"]).agg(
        points=("loss", "size"), lrs=("lr", "nunique"), batches=("batch", "nunique")
    )
    return rows.to_string()


def held_out(laws, sweep: pd.DataFrame, held: pd.DataFrame, n_bootstrap: int) -> list[str]:
    """One line per held-out cell the fit never saw: the law's prediction against its optimum."""
    seen = {(n, d) for n, d in zip(sweep["N"], sweep["D"], strict=True)}
    lines = []
    for cell in cell_optima(held, "lr", n_bootstrap):
        if any(math.isclose(cell.N, n) and math.isclose(cell.D, d, rel_tol=0.05) for n, d in seen):
            continue
        if cell.at_edge:
            lines.append(f"held out {cell}: not bracketed, no check")
            continue
        cells = [*laws.lr.cells, cell]
        lines.append(str(held_out_check(cells, cell.N, cell.D, laws.lr.terms, n_bootstrap)))
    return lines


def n_and_d(text: str) -> tuple[float, float]:
    """``--predict``'s "N,D" (e.g. 1e8,2e9), refused in one line when it is anything else."""
    parts = text.split(",")
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"{text!r} is not N,D (e.g. 1e8,2e9)")
    n, d = (positive_number(v) for v in parts)
    return n, d


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sweep_dir")
    parser.add_argument("--plots", type=Path)
    parser.add_argument("--predict", nargs="*", default=[], metavar="N,D", type=n_and_d)
    parser.add_argument("--held-out")
    parser.add_argument("--bootstrap", type=int, default=1000)
    parser.add_argument(
        "--batch", type=int, help="fit only this batch's trials (a held-out grid run at it)"
    )
    args = parser.parse_args()

    table = hparam_table(load(args.sweep_dir))
    if args.batch:
        table = table[table["batch"] == args.batch]
    print(f"{len(table)} annealed points from {args.sweep_dir}; per (N, D) cell:")
    print(cells_table(table))
    laws = fit_hparam_laws(table, n_bootstrap=args.bootstrap)
    print(laws)
    for n, d in args.predict:
        print(laws.predict(n, d))
    if args.plots:
        paths = plot_hparam_laws(table, laws.lr, laws.batch, args.plots)
        if laws.batch is None and laws.batch_cells:
            out = args.plots / "hparam_batch_cells.png"
            paths.append(plot_cell_sweeps(table, laws.batch_cells, out, "batch"))
        for path in paths:
            print(f"plot: {path}")
    if args.held_out:
        held = hparam_table(load(args.held_out))
        print(f"held-out sweep {args.held_out}, per (N, D) cell:")
        print(cells_table(held))
        for line in held_out(laws, table, held, args.bootstrap):
            print(line)


if __name__ == "__main__":
    exit_on_error(main)
