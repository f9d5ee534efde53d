"""LR-sweep analysis: the optimal peak LR per size and its power law LR*(N) = a * N^b.

Shared by ``workflows/analyze.py`` and the ladder's ``lr.from_sweep`` feedback, so the LR a ladder
trains with is exactly the one the sweep report prints.

Trials of a group (a size and run length) are compared at common tokens: the last eval every
finished trial reached, the end of the runs (a trial that failed short of it is not compared,
and does not pull the others back to where it stopped). A trial stopped before then counts as
worse than all of them, as early stopping judged it at the rung where it was stopped, and so
does one that diverged (:data:`~trainer_core.analysis.optimum.ENDED_WORSE`); its early,
un-annealed loss is never set beside the others' (it would read as "this LR is bad" whatever
the LR), nor are theirs read back to its rung (that discards the annealed losses the run is
for: LR* moves with the horizon).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd
from scipy.stats import t as student_t

from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.hparam_laws import SIGMA_FLOOR, CellOptimum, weighted_log_fit
from trainer_core.analysis.hparam_table import run_groups
from trainer_core.analysis.load import ExperimentResults, load
from trainer_core.analysis.optimum import N_BOOTSTRAP, grid_optimum, not_bracketed, pooled_noise
from trainer_core.ladder.formulas import LADDER_LR_EXPONENT

COMPARED = "compared_loss"
"""The loss column optima use: each trial's eval loss at its group's common tokens; inf for a
trial early stopping ended before them; NaN for a diverged one (it has no loss there), which
the optima and the grid's widening judge worse all the same (:func:`judged`)."""


def _eval_history(results: ExperimentResults) -> pd.DataFrame:
    """(name, step, tokens, eval_loss) of every eval a run logged, checkpoint evals included."""
    cols = ["name", "step", "tokens", "eval_loss"]
    evals = pd.concat([results.metrics[cols], results.points[cols]]).dropna(subset=["eval_loss"])
    return evals.drop_duplicates(["name", "step"], keep="last").sort_values(["name", "step"])


def _compare_at_common_tokens(table: pd.DataFrame, evals: pd.DataFrame) -> pd.DataFrame:
    """Add last_eval_step, compared_tokens (the most tokens every finished trial of the group
    reached at an eval), compared_step (each trial's step there; a diverged
    trial's, the step it would have reached them at; none for one stopped before) and
    compared_loss (inf for a trial stopped before: judged worse).

    Tokens, not steps: trials of one group may differ in batch. Where they do, a trial's eval
    counts as at the common tokens within two of the group's largest batch: each trial's eval
    steps are rounded to whole steps, the common tokens set by whichever trial reached the
    fewest. Where they don't, the evals fall on the same tokens, so a trial stopped even one
    eval short of the end is one stopped before it."""
    by_name = {name: g for name, g in evals.groupby("name")}
    last = {name: g.iloc[-1] for name, g in by_name.items()}
    table["last_eval_step"] = table["name"].map(lambda n: last[n]["step"] if n in last else None)
    table["last_eval_step"] = table["last_eval_step"].astype("Int64")
    reached = table["name"].map(lambda n: last[n]["tokens"] if n in last else math.nan)
    # A trial that failed or is still running short of the end leaves it as it is; a group none
    # finished yet (a sweep still running): as far as every trial went.
    common = reached[table["status"] == "finished"].groupby(table["group"]).min()
    fallback = reached[~table["diverged"]].groupby(table["group"]).min()
    table["compared_tokens"] = table["group"].map(common.combine_first(fallback))
    by_group = table.groupby("group")["batch"]
    slacks = table["group"].map(2 * by_group.max() * (by_group.nunique() > 1))
    steps, losses = [], []
    for row, slack in zip(table.itertuples(index=False), slacks, strict=True):
        g = by_name.get(row.name)
        upto = g[g["tokens"] <= row.compared_tokens + slack] if g is not None else []
        if pd.isna(row.compared_tokens):
            steps.append(None)
            losses.append(math.nan)
        elif row.diverged or not len(upto):
            steps.append(round(row.compared_tokens / row.batch))
            losses.append(math.nan)
        elif upto["tokens"].iloc[-1] < row.compared_tokens - slack:
            steps.append(None)
            losses.append(math.inf if row.stopped_early else math.nan)
        else:
            steps.append(int(upto["step"].iloc[-1]))
            losses.append(float(upto["eval_loss"].iloc[-1]))
    table["compared_step"] = pd.array(steps, dtype="Int64")
    table[COMPARED] = losses
    return table


def lr_sweep_table(results: ExperimentResults) -> pd.DataFrame:
    """One row per trial: size, N, lr, global batch (tokens), its early-stopping group (size and
    run length), final/best eval loss, steps run, early stop, divergence, and the loss the
    optimum compares (``compared_loss`` at the group's ``compared_tokens``)."""
    final = results.final().set_index("name")
    groups = run_groups(results.runs.set_index("name"))
    rows = []
    for run in results.runs.itertuples(index=False):
        f = final.loc[run.name]
        rows.append(
            {
                "size": run.size,
                "N": run.num_params,
                "lr": run.peak_lr,
                "batch": run.global_batch_tokens,
                "group": groups[run.name],
                "name": run.name,
                "final_eval_loss": f["final_eval_loss"],
                "best_eval_loss": f["best_eval_loss"],
                "steps_run": int(f["step"]),
                "total_steps": run.total_steps,
                "stopped_early": run.status == "stopped",
                "diverged": run.status == "diverged",
                "diverged_step": run.diverged_step if run.status == "diverged" else None,
                "status": run.status,
            }
        )
    table = pd.DataFrame(rows)
    table["diverged_step"] = table["diverged_step"].astype("Int64")
    table = _compare_at_common_tokens(table, _eval_history(results))
    return table.sort_values(["N", "lr", "batch"], kind="stable").reset_index(drop=True)


def batches_differ(table: pd.DataFrame) -> bool:
    """Whether some size of an :func:`lr_sweep_table` tried several batches: its trials are then
    compared in tokens, and shown per batch."""
    return bool(len(table)) and table.groupby("size")["batch"].nunique().max() > 1


@dataclass
class OptimalLR(ShownAsText):
    """The best peak LR of one size, with its 95% interval (:mod:`~trainer_core.analysis.optimum`)."""

    lr: float
    loss: float
    method: Literal["quadratic", "grid"]
    lr_low: float
    lr_high: float
    at_edge: bool
    """The best LR is the smallest or largest tried: the optimum may lie outside the grid."""
    n_trials: int
    step: int | None = None
    """The common step the trials were compared at (None: another loss column was used)."""
    tokens: float | None = None
    """The common tokens, named instead of the step where the trials' batches differ."""

    def __str__(self) -> str:
        edge = f"  {not_bracketed('lr', self.lr_low)}" if self.at_edge else ""
        at = f" at step {self.step}" if self.step is not None else ""
        if self.tokens is not None:
            at = f" at {self.tokens:.4g} tokens"
        return (
            f"lr* = {self.lr:.3e} (95% {self.lr_low:.3e} .. {self.lr_high:.3e}), loss "
            f"{self.loss:.4f}{at} ({self.method}, {self.n_trials} LRs){edge}"
        )


def judged(table: pd.DataFrame, loss: str = COMPARED) -> pd.DataFrame:
    """The trials an optimum is judged over, ``loss`` as it judges them: those with a loss or
    that ended worse (:data:`~trainer_core.analysis.optimum.ENDED_WORSE`). A diverged trial is
    inf whatever it logged: it never reached the common point, and its last loss, from before
    it blew up, is no loss there (it can be low), so above the best it brackets the optimum.
    One rule for the optimum and for the grid's widening (:mod:`~trainer_core.analysis.lr_grid`),
    so the sweep widens exactly where its report says the optimum is not bracketed."""
    losses = table[loss].astype(float).mask(table["diverged"].astype(bool), math.inf)
    return table.assign(**{loss: losses})[losses.notna()]


def lr_curve(table: pd.DataFrame, loss: str = COMPARED) -> tuple[np.ndarray, np.ndarray]:
    """log LR ascending and the lowest loss at each (inf: only trials judged worse), over the
    :func:`judged` trials: the curve :func:`optimal_lr` reads."""
    best = judged(table, loss).groupby("lr")[loss].min().sort_index()
    return np.log(best.index.to_numpy(float)), best.to_numpy(float)


def optimal_lr(
    table: pd.DataFrame,
    loss: str = COMPARED,
    noise: float = math.nan,
    n_bootstrap: int = N_BOOTSTRAP,
    seed: int = 0,
) -> OptimalLR:
    """One size's optimum: :func:`~trainer_core.analysis.optimum.grid_optimum` of its loss
    against log LR (a diverged trial judged worse, as a stopped one). ``noise``: the sweep's
    loss noise for the interval (:func:`optimal_lrs` pools it over the sizes); NaN: the
    neighbouring grid LRs."""
    if table["size"].nunique() > 1:
        raise AnalysisError(
            f"optimal_lr: pass one size's rows, got sizes {sorted(table['size'].unique())}"
        )
    x, y = lr_curve(table, loss)
    if not np.isfinite(y).any():
        raise AnalysisError(f"optimal_lr: no non-diverged trial with a finite {loss}")
    step = tokens = None
    if loss == COMPARED:
        compared = table[np.isfinite(table[loss].astype(float))]
        step = int(compared["compared_step"].max())
        if compared["batch"].nunique() > 1:
            tokens = float(compared["compared_tokens"].min())
    best = grid_optimum(x, y, noise, n_bootstrap, np.random.default_rng(seed))
    return OptimalLR(
        best.value, best.loss, best.method, best.low, best.high, best.at_edge, len(x), step, tokens
    )


def optimal_lrs(
    table: pd.DataFrame | ExperimentResults, loss: str = COMPARED
) -> dict[str, OptimalLR]:
    """optimal_lr of every size with a usable trial, smallest size first, their intervals
    under the loss noise pooled over the sizes (a sweep's trials share it). ``table``: an
    :func:`lr_sweep_table`, or the sweep's results it is made from (``load(dir)``, as
    :func:`fit_sweep_lr` takes them).

    A size whose trials all diverged (or have no eval yet) is left out, so one bad size doesn't
    block the LR fit of the others; callers see it missing from the result.
    """
    if isinstance(table, ExperimentResults):
        table = lr_sweep_table(table)
    order = table.groupby("size")["N"].first().sort_values().index
    rows = {size: table[table["size"] == size] for size in order}
    usable = {s: r for s, r in rows.items() if np.isfinite(lr_curve(r, loss)[1]).any()}
    noise = pooled_noise([lr_curve(r, loss) for r in usable.values()])
    return {size: optimal_lr(r, loss, noise) for size, r in usable.items()}


@dataclass
class LRPowerLawFit(ShownAsText):
    """lr*(N) = a * N^b, a log-log least-squares fit weighted by each size's own LR* interval,
    compared to the ladder's exponent.

    Its intervals are the wider of two, as a law of the cells' are
    (:attr:`~trainer_core.analysis.hparam_laws.WeightedLogFit.widening`): the sizes' own
    intervals carried through the fit (normal), and the scatter about the law (Student's t on
    its n - 2 degrees of freedom: a sweep has few sizes, and with 1 degree of freedom a
    "2 sigma" gap arises by chance 30% of the time, not 5%). Never narrower than the sizes' intervals allow: optima that lie exactly
    on a line (each the grid's centre) do not make the law exact, and two sizes still get one.
    """

    a: float
    b: float
    b_stderr: float
    log_a_stderr: float
    n_points: int
    cov: np.ndarray = field(repr=False)
    """Covariance of (log a, b), on the scale :attr:`t_dof` names."""
    n_range: tuple[float, float] = (math.nan, math.nan)
    """The smallest and largest N fitted: outside them a prediction extrapolates."""
    reference_exponent: float = LADDER_LR_EXPONENT
    left_out: tuple[str, ...] = ()
    """The sizes swept but not fitted: their best LR is at their grid's edge, a bound."""
    scatter: float = math.nan
    """The optima's spread about the law in units of their own intervals (chi^2 per degree of
    freedom, square-rooted; NaN with two sizes: none is spare)."""
    t_dof: float = math.inf
    """Degrees of freedom of the intervals' and the comparison's t: :attr:`dof` where the
    scatter sets the scale, inf (the normal) where the sizes' own intervals do."""
    grid_picks: bool = False
    """Every fitted optimum is a grid point, no parabola's vertex: the law then echoes how the
    grid was centred (on the ladder's rule, in a sweep planned from it)."""

    @property
    def dof(self) -> int:
        return self.n_points - 2

    @property
    def sigmas_from_reference(self) -> float:
        """(b - reference) in standard errors of b: a t statistic on :attr:`t_dof`."""
        return (self.b - self.reference_exponent) / self.b_stderr

    @property
    def p_from_reference(self) -> float:
        """Two-sided p of b equal to the reference, on t with :attr:`t_dof`."""
        return float(2 * student_t.sf(abs(self.sigmas_from_reference), self.t_dof))

    def predict(self, N: float | np.ndarray) -> float | np.ndarray:
        out = self.a * np.asarray(N, dtype=float) ** self.b
        return float(out) if out.ndim == 0 else out

    def interval(self, N: float) -> tuple[float, float]:
        """The fitted line's 95% interval at N (t with :attr:`t_dof`)."""
        row = np.array([1.0, math.log(N)])
        half = float(student_t.ppf(0.975, self.t_dof)) * math.sqrt(float(row @ self.cov @ row))
        centre = math.log(self.predict(N))
        return math.exp(centre - half), math.exp(centre + half)

    def outside(self, N: float) -> bool:
        """N lies outside the swept sizes: the law extrapolates there."""
        return not self.n_range[0] <= N <= self.n_range[1]

    @property
    def left_out_note(self) -> str:
        """Which sizes the fit leaves out and why ("" where none): the report says so."""
        if not self.left_out:
            return ""
        return f"lr*(N) leaves out {', '.join(self.left_out)}: {_at_edge(self.left_out)}"

    @property
    def scale(self) -> str:
        """What sets the intervals: the scatter about the law, or the sizes' own intervals."""
        if math.isfinite(self.t_dof):
            return f"scale: the scatter about the law, {self.scatter:.2f}x the sizes' intervals"
        if math.isfinite(self.scatter):
            return f"scale: the sizes' own intervals (scatter {self.scatter:.2f}x them)"
        return "scale: the sizes' own intervals (2 sizes: no scatter to check them)"

    def __str__(self) -> str:
        line = f"lr*(N) = {self.a:.4g} * N^{self.b:.4f}   "
        if math.isfinite(self.b_stderr):
            stat = "t" if math.isfinite(self.t_dof) else "z"
            line += (
                f"(b = {self.b:.3f} ± {self.b_stderr:.3f}, {self.dof} dof, {self.scale}; against "
                f"OLMo's {self.reference_exponent:.3f}, the ladder's default rule: {stat} = "
                f"{self.sigmas_from_reference:+.1f}, p = {self.p_from_reference:.2g})"
            )
        else:
            line += "(no interval: 2 sizes, no scatter to spare and no interval of their own)"
        line += f"   [{self.n_points} sizes]"
        if self.grid_picks:
            line += (
                "   GRID PICKS: every size's LR* is a grid point, no parabola's vertex, so the "
                "law echoes the grid's own centring: refine the grid around it (more LRs per size)"
            )
        return line


def fit_lr_power_law(
    N: np.ndarray | list[float],
    lr_opt: np.ndarray | list[float],
    log_sigma: np.ndarray | list[float] | None = None,
) -> LRPowerLawFit:
    """Weighted least squares of log lr* on log N, the fit a law of the cells makes
    (:func:`~trainer_core.analysis.hparam_laws.weighted_log_fit`). ``log_sigma``: each
    optimum's interval as a normal sigma in log units, floored at SIGMA_FLOOR as a law's cells
    are; None: unknown, so the intervals come from the scatter alone (t on n - 2 dof; none with
    two sizes), never from a precision nobody measured."""
    n, lr = np.asarray(N, dtype=float), np.asarray(lr_opt, dtype=float)
    if n.size != lr.size or np.unique(n).size < 2:
        raise AnalysisError(
            f"fit_lr_power_law needs optimal LRs for >= 2 sizes, got {np.unique(n).size}"
        )
    if np.any(n <= 0) or np.any(lr <= 0):
        raise AnalysisError("fit_lr_power_law: N and lr_opt must be positive")
    sigma = np.asarray(SIGMA_FLOOR if log_sigma is None else log_sigma, dtype=float)
    if sigma.shape not in ((), n.shape) or not np.all(np.isfinite(sigma)):
        raise AnalysisError(
            "fit_lr_power_law: log_sigma needs one finite value per size (an optimum with an "
            "open interval is a bound: leave it out)"
        )
    x = np.log(n)
    fit = weighted_log_fit(np.stack([np.ones_like(x), x], axis=1), np.log(lr), sigma)
    by_scatter = log_sigma is None or fit.widening > 1
    cov = fit.unscaled_cov * (fit.scatter**2 if by_scatter else 1.0)
    log_a_se, b_se = (float(v) for v in np.sqrt(np.diag(cov)))
    return LRPowerLawFit(
        math.exp(fit.beta[0]),
        float(fit.beta[1]),
        b_se,
        log_a_se,
        len(x),
        cov,
        (n.min(), n.max()),
        scatter=fit.scatter,
        t_dof=fit.dof if by_scatter else math.inf,
    )


def fit_lr_optima(n_of: dict[str, float], optima: dict[str, OptimalLR]) -> LRPowerLawFit:
    """lr*(N) through bracketed per-size optima, each weighted by its own interval (read as a
    law's cell reads its own), and saying when every one is a grid pick."""
    sigma = {size: _as_cell(n_of[size], o).log_sigma for size, o in optima.items()}
    if open_ := [size for size, s in sigma.items() if not math.isfinite(s)]:
        raise AnalysisError(f"fit_lr_optima: {_at_edge(open_)}, or leave them out")
    fit = fit_lr_power_law(
        [n_of[s] for s in optima], [o.lr for o in optima.values()], list(sigma.values())
    )
    return replace(fit, grid_picks=all(o.method == "grid" for o in optima.values()))


def _as_cell(N: float, o: OptimalLR) -> CellOptimum:
    """A size's optimum as a law's (N, D) cell at its one horizon (D unused here)."""
    return CellOptimum(
        N, math.nan, "lr", o.lr, o.lr_low, o.lr_high, o.loss, o.method, o.at_edge, o.n_trials
    )


def _at_edge(sizes: tuple[str, ...] | list[str]) -> str:
    return (
        f"the best LR of {', '.join(sizes) or 'no size'} is at its grid's edge (the optimum may "
        "lie beyond it); widen those sizes' LR grids"
    )


def fit_sweep_lr(
    sweep: str | Path | ExperimentResults,
    loss: str = COMPARED,
    optima: dict[str, OptimalLR] | None = None,
) -> LRPowerLawFit:
    """Fit lr*(N) to an LR sweep's per-size optima (its experiment dir, or its results already
    loaded), those its grids bracket: an optimum at a grid's edge is a bound, not a point. The
    one LR*(N) of a sweep: the ladder plans with it and the sweep's report prints it.

    ``optima``: the sweep's :func:`optimal_lrs` where the caller has them (the report), so they
    are not found twice; else found here under ``loss``."""
    results = sweep if isinstance(sweep, ExperimentResults) else load(sweep)
    if optima is None:
        optima = optimal_lrs(lr_sweep_table(results), loss)
    bracketed = {size: o for size, o in optima.items() if not o.at_edge}
    edge = tuple(size for size, o in optima.items() if o.at_edge)
    if len(bracketed) < 2:
        if not results.is_lr_sweep:
            raise AnalysisError(
                f"lr*(N): {results.path} is a ladder, not an LR sweep: each size trained at one "
                "LR (python workflows/lr_sweep.py writes a sweep, beside the ladder: "
                "<dir>-lr-sweep)"
            )
        raise AnalysisError(
            f"lr*(N) needs a bracketed optimum at >= 2 sizes, got {len(bracketed)}: "
            f"{_at_edge(edge)}"
        )
    sizes_n = results.runs.groupby("size")["num_params"].first()
    fit = fit_lr_optima({size: float(sizes_n[size]) for size in bracketed}, bracketed)
    return replace(fit, left_out=edge)
