"""The whole answer at a target compute C: per approach, N*, D* and the loss with intervals; the
LR* and B* the sweep laws give at that (N*, D*); and the run's cost in device-hours.

One table, printed by ``workflows/analyze.py`` and returned by :func:`target_answer`. C and the
laws count 6 N D; the cost counts FLOPs as the planner and the trainer's MFU do, attention
included (:class:`FlopsPerToken`, from the runs' own counts), over the device's peak FLOP/s
times an assumed MFU, both stated in the table: pricing 6 N D at an MFU measured on the larger
count came out 20-40% cheap at seq 4096. The device and MFU default to the experiment's
``device_type`` and ``assumed_mfu``; LR*'s law to the sweep its ladder took ``lr.from_sweep``
from, B*'s to its ``batch.from_sweep`` (each key to the other where the ladder set one alone).

LR* and B* are the plan's own: the laws :mod:`trainer_core.ladder.lr_feedback` fits (its cells,
seed, refusals, LR*(N) for a one-horizon sweep), B* with the ``batch.sweep_law`` the plan used:
the ladder's where its ``batch.from_sweep`` is that sweep, else the sweep's own record's, as the
sweep's report fits it (:func:`sweep_laws` gives both their laws). Where the plan would stop,
the row says so instead of giving numbers, so the table never answers with a law the ladder
refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
import pandas as pd

from trainer_core.analysis.display import ShownAsText
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.fits import ChinchillaFit, PowerLawFit, require_positive
from trainer_core.analysis.hparam_laws import SYMBOL
from trainer_core.analysis.hparam_table import SweepCells
from trainer_core.analysis.isoflop import IsoFLOPFit
from trainer_core.analysis.load import load
from trainer_core.analysis.lr import LRPowerLawFit
from trainer_core.config.loader import ConfigError
from trainer_core.devices import (
    CPU_NOMINAL_FLOPS,
    PEAK_BF16_FLOPS,
    device_hours,
    device_peak_flops,
)
from trainer_core.io import storage
from trainer_core.io.records import read_yaml_record
from trainer_core.io.run_dir import EXPERIMENT, recorded_experiment_kind
from trainer_core.io.storage import Location
from trainer_core.ladder.formulas import BATCH_SWEEP_LAWS, BatchFormula
from trainer_core.ladder.lr_feedback import (
    BATCH_KEY,
    LR_KEY,
    ONE_HORIZON,
    SweepChoice,
    SweepRules,
    batch_law,
    horizons_swept,
    lr_laws,
)

DEFAULT_MFU = 0.4
"""The ladder's own default ``assumed_mfu``."""
Estimate = tuple[float, float, float]
"""(value, 95% low, 95% high); NaN bounds where there is no interval."""
NO_CI = (math.nan, math.nan)
T = TypeVar("T")
REFUSED = "refused (see below)"
"""An LR* or B* cell whose law a ladder's plan refuses: the footer gives the plan's line."""


@dataclass(frozen=True)
class FlopsPerToken(ShownAsText):
    """A token's training FLOPs at N parameters: 6 N plus attention, whose FLOPs per parameter
    ``coef * N^-power`` fall as the ladder's shapes widen (fitted over its runs' counts)."""

    coef: float = 0.0
    power: float = 0.0

    def __call__(self, N: float) -> float:
        return 6.0 * N + self.coef * N ** (1.0 - self.power)

    def __str__(self) -> str:
        if not self.coef:
            return "6 N D"
        return (
            f"6 N D + attention ({self.coef:.3g} N^{-self.power:.2f} per parameter-token, "
            "from the runs' counts)"
        )

    @classmethod
    def of_runs(cls, runs: pd.DataFrame) -> FlopsPerToken:
        """Fitted to the runs' ``flops_per_token`` beyond 6 N: a line in log-log over their
        sizes, a constant with one size, none when they count 6 N alone."""
        if "flops_per_token" not in runs:
            return cls()
        sizes = runs.groupby("num_params")["flops_per_token"].first()
        n = sizes.index.to_numpy(float)
        extra = sizes.to_numpy(float) / n - 6.0
        keep = np.isfinite(extra) & (extra > 0)
        if not keep.any():
            return cls()
        if keep.sum() == 1:
            return cls(float(extra[keep][0]), 0.0)
        slope, log_coef = np.polyfit(np.log(n[keep]), np.log(extra[keep]), 1)
        return cls(math.exp(log_coef), float(-slope))


@dataclass(frozen=True)
class DeviceCost(ShownAsText):
    """What one device delivers: its peak FLOP/s times the MFU a run is assumed to reach."""

    device: str
    peak_flops: float
    mfu: float = DEFAULT_MFU
    per_token: FlopsPerToken = FlopsPerToken()

    def flops(self, N: float, D: float) -> float:
        return self.per_token(N) * D

    def hours(self, N: float, D: float) -> float:
        return device_hours(self.flops(N, D), self.peak_flops, self.mfu)

    def __str__(self) -> str:
        return (
            f"{self.device}, {self.peak_flops:.3g} FLOP/s peak, {100 * self.mfu:.0f}% MFU "
            f"(assumed), FLOPs = {self.per_token}"
        )


def device_cost(device: str, mfu: float = DEFAULT_MFU) -> DeviceCost:
    """The cost model of a device type as ladders name it ('H100', 'cpu')."""
    if not 0 < mfu <= 1:
        raise AnalysisError(f"MFU {mfu}: must be in (0, 1]")
    if device.lower() == "cpu":
        return DeviceCost("cpu (nominal)", CPU_NOMINAL_FLOPS, mfu)
    peak = device_peak_flops(device)
    if peak is None:
        known = ", ".join(PEAK_BF16_FLOPS)
        raise AnalysisError(f"device {device!r}: no peak FLOP/s known; use cpu or one of {known}")
    return DeviceCost(device, peak, mfu)


@dataclass
class TargetSettings:
    """What the target table is priced and tuned with; empty fields come from the experiment."""

    device: str = ""
    mfu: float | None = None
    hparam_sweep: Location = ""
    """A sweep dir whose LR*(N, D) and B* laws fill the LR* and B* rows."""

    def __post_init__(self) -> None:
        """A device, MFU or sweep dir given is checked now, before any fit runs, not when the
        table is priced."""
        if self.device or self.mfu is not None:
            device_cost(self.device or "cpu", DEFAULT_MFU if self.mfu is None else self.mfu)
        if self.hparam_sweep:
            _require_lr_sweep(self.hparam_sweep, "--hparam-sweep")

    def resolve(self, exp_dir: Location) -> tuple[DeviceCost, LawSources]:
        """(the cost model, the sweeps LR* and B* are read from) with the experiment's record
        filling the gaps: B* is then fitted as its plan did."""
        record = _experiment_record(exp_dir)
        device = self.device or str(record.get("device_type") or "cpu")
        mfu = self.mfu if self.mfu is not None else record.get("assumed_mfu", DEFAULT_MFU)
        lr, batch = (self.hparam_sweep,) * 2 if self.hparam_sweep else _from_sweeps(record)
        law = _ladder_batch_law(record, storage.join(exp_dir, EXPERIMENT), batch)
        return device_cost(device, float(mfu)), LawSources(lr, batch, law)


def _require_lr_sweep(where: Location, label: str) -> None:
    """Refuse a dir that is no LR sweep's: a ladder's cells (one LR per size) gave a sweep's
    advice, to widen a grid (sweep.factors) it does not have."""
    kind = recorded_experiment_kind(where)
    if kind != "LR sweep":
        what = f"holds no {EXPERIMENT}" if kind is None else "is a ladder, not an LR sweep"
        raise AnalysisError(
            f"{label}: {where} {what}: give an LR sweep's dir "
            "(python workflows/lr_sweep.py writes <dir>-lr-sweep)"
        )


@dataclass(frozen=True)
class LawSources(ShownAsText):
    """The sweep dirs the LR* and B* rows read ("" for none), and the ``batch.sweep_law`` B* is
    fitted with ("": the batch sweep's own)."""

    lr: Location = ""
    batch: Location = ""
    batch_law: str = ""

    def __bool__(self) -> bool:
        return bool(self.lr or self.batch)

    def __str__(self) -> str:
        return " and ".join(dict.fromkeys(str(s) for s in (self.lr, self.batch) if s))


def _experiment_record(exp_dir: Location) -> dict:
    path = storage.join(exp_dir, EXPERIMENT)
    return read_yaml_record(path) if storage.is_file(path) else {}


def _from_sweeps(record: dict) -> tuple[str, str]:
    """The sweep dirs the experiment's ladder took its LR and its batch from; a key that names
    none takes the other's, so a ladder fed one law also shows what that sweep says of the
    other."""
    lr, batch = (
        str(section.get("from_sweep") or "") if isinstance(section, dict) else ""
        for section in (record.get("lr"), record.get("batch"))
    )
    return lr or batch, batch or lr


def _ladder_batch_law(record: dict, path: Location, sweep: Location) -> str:
    """The ladder's ``batch.sweep_law`` where its ``batch.from_sweep`` is ``sweep``, else "":
    every ladder records a law (the default where it sets none), but its plan fitted B* with
    it only from its own ``batch.from_sweep``."""
    section = record.get("batch")
    if not (sweep and isinstance(section, dict) and section.get("from_sweep")):
        return ""
    if storage.canonical(str(section["from_sweep"])) != storage.canonical(sweep):
        return ""
    return _checked_batch_law(str(section.get("sweep_law") or ""), str(path))


def _recorded_batch_law(exp_dir: Location) -> str:
    """The ``batch.sweep_law`` ``exp_dir``'s record names, "" where it names none."""
    path = storage.join(exp_dir, EXPERIMENT)
    section = _experiment_record(exp_dir).get("batch")
    law = str(section.get("sweep_law") or "") if isinstance(section, dict) else ""
    return _checked_batch_law(law, str(path))


def _checked_batch_law(law: str, where: str) -> str:
    """``law`` if a ladder takes it ("" too: none named), by the ladder's own check
    (:class:`BatchFormula`); else its refusal as a one-line AnalysisError naming ``where``."""
    if law:
        try:
            BatchFormula(sweep_law=law)
        except ConfigError as e:
            raise AnalysisError(f"{where}: batch.{e}") from None
    return law


@dataclass
class SweepLaws:
    """The LR* and B* laws a ladder fed from a sweep plans with, and in place of each law the
    plan refuses, the line that stops it."""

    rules: SweepRules
    batch_law: str = BatchFormula.sweep_law
    """The ``batch.sweep_law`` B* was fitted with."""
    refused: dict[str, str] = field(default_factory=dict)
    """"lr" or "batch": the plan's refusal of that law."""

    def attempt(self, param: str, fit: Callable[[], T]) -> T | None:
        """``fit()``, or None with the plan's refusal kept under ``param``."""
        try:
            return fit()
        except ConfigError as e:
            self.refused[param] = str(e)
            return None

    def refusal(self, param: str) -> str:
        """The line giving the plan's refusal of ``param``'s law: one wording in the sweep's
        report and the target table's footer."""
        return f"{SYMBOL[param]}: a ladder's plan stops here: {self.refused[param]}"

    def choices(self, N: float, D: float) -> dict[str, SweepChoice | None]:
        """The plan's LR* and B* at (N, D), None where it has no law."""
        return {"lr": self.rules.lr(N, D), "batch": self.rules.batch(N, D)}

    @property
    def notes(self) -> list[str]:
        """The refusals, then what the laws that stand rest on: MISFIT, CONDITIONAL, LR*(N)."""
        lines = [self.refusal(param) for param in self.refused]
        for law in (self.rules.lr_law, self.rules.batch_law):
            if law is not None:
                lines += [f"{law.name}: {flag}" for flag in law.flags]
        if self.rules.lr_of_n is not None:
            lines.append(f"lr*: from LR*(N), {ONE_HORIZON}")
        return lines


def sweep_laws(
    sweep: Location | SweepCells,
    sweep_law: str = "",
    lr_of_n: LRPowerLawFit | None = None,
    batch_sweep: Location = "",
) -> SweepLaws:
    """The laws a ladder fed from ``sweep`` (its dir, or its cells as the sweep's report holds
    them) plans with, found by the plan's own calls: the sweep's report, the target table and
    the plan give one LR* and B*; a law the plan refuses is kept as its refusal. B* from
    ``batch_sweep`` where given (a ladder's ``batch.from_sweep`` naming another sweep), by
    ``sweep_law`` (a ladder's ``batch.sweep_law`` for that sweep); "": the one the batch sweep's
    own record names, else the default. ``lr_of_n``: the sweep's LR*(N) already fitted by
    :func:`fit_sweep_lr` (the report's), taken on a one-horizon sweep, not refitted. A dir
    that is no LR sweep's (a ladder's: one LR per size) is refused."""
    cells = sweep if isinstance(sweep, SweepCells) else SweepCells(load(sweep))
    where = str(cells.results.path)
    _require_lr_sweep(where, "sweep_laws")
    other = batch_sweep and storage.canonical(batch_sweep) != storage.canonical(where)
    batch_cells = SweepCells(load(batch_sweep)) if other else cells
    batch_where = str(batch_cells.results.path)
    if other:
        _require_lr_sweep(batch_where, "sweep_laws: batch_sweep")
    law = _checked_batch_law(sweep_law, f"B* of {batch_where}")
    law = law or _recorded_batch_law(batch_cells.results.path) or BatchFormula.sweep_law
    laws = SweepLaws(SweepRules(lr_dir=where, batch_dir=batch_where), law)
    if lr_of_n is not None and horizons_swept(cells.table) < 2:
        laws.rules.lr_of_n = lr_of_n
    elif (lr := laws.attempt("lr", lambda: lr_laws(cells, where))) is not None:
        laws.rules.lr_law, laws.rules.lr_of_n = lr
    if batch_cells.cells("batch"):
        terms = BATCH_SWEEP_LAWS[law]
        laws.rules.batch_law = laws.attempt(
            "batch", lambda: batch_law(batch_cells, batch_where, terms)
        )
    return laws


@dataclass
class TargetColumn:
    """One approach's answer at the target compute."""

    approach: str
    a: Estimate | None = None
    b: Estimate | None = None
    N: Estimate | None = None
    D: Estimate | None = None
    loss: Estimate | None = None
    lr: Estimate | str | None = None
    """LR* from the sweep's law, or :data:`REFUSED` where a ladder's plan refuses the law."""
    batch: Estimate | str | None = None
    flops: float | None = None
    device_hours: float | None = None

    @property
    def has_intervals(self) -> bool:
        """Some value of its own fit (not the sweep's LR*, B*) has a bootstrap interval."""
        estimates = (self.a, self.b, self.N, self.D, self.loss)
        return any(e is not None and math.isfinite(e[1]) for e in estimates)


ROWS = (
    ("a: N_opt ~ C^a", "a", ".3f"),
    ("b: D_opt ~ C^b", "b", ".3f"),
    ("N_opt", "N", ".3g"),
    ("D_opt (tokens)", "D", ".3g"),
    ("loss", "loss", ".4f"),
    ("lr*", "lr", ".3g"),
    ("B* (tokens)", "batch", ",.0f"),
    ("FLOPs priced", "flops", ".3g"),
    ("device-hours", "device_hours", ",.3g"),
)


@dataclass
class TargetAnswer(ShownAsText):
    """The table at compute C: a column per approach, and how LR*, B* and the cost were had."""

    C: float
    columns: list[TargetColumn]
    cost: DeviceCost
    hparam_source: str = ""
    """Where the LR* and B* laws came from (a sweep dir), as the footer names it."""
    batch_source: str = ""
    """Where B*'s law came from where that is another sweep than LR*'s; else ""."""
    laws_read: bool = False
    """A :class:`SweepLaws` was had (each of its laws fitted or refused); with a source but
    none, reading the sweep failed."""
    batch_law: str = ""
    """The ``batch.sweep_law`` B* was fitted with."""
    notes: list[str] = field(default_factory=list)

    @property
    def title(self) -> str:
        """Claims 95% intervals only for the columns that have them."""
        bare = [col.approach for col in self.columns if not col.has_intervals]
        if len(bare) == len(self.columns):
            intervals = "no bootstrap intervals"
        elif not bare:
            intervals = "95% bootstrap intervals"
        else:
            intervals = f"95% bootstrap intervals, none for {', '.join(bare)}"
        return f"compute-optimal at C = {self.C:.3g} FLOPs ({intervals})"

    def rows(self) -> list[tuple[str, list[str]]]:
        """(row label, one formatted cell per column); "-" where an approach has no value."""
        return [
            (label, [_cell(getattr(col, attr), fmt) for col in self.columns])
            for label, attr, fmt in ROWS
        ]

    def to_frame(self) -> pd.DataFrame:
        """The table as numbers, one row per approach: each value with its interval's ends
        (``N``, ``N_lo``, ``N_hi``; NaN where an approach has none) and ``flops`` and
        ``device_hours``; an LR* or B* that a ladder's plan refuses is NaN, with its reason
        in ``lr_note`` / ``batch_note``."""
        rows = []
        for col in self.columns:
            row: dict[str, object] = {"approach": col.approach}
            for _, attr, _ in ROWS:
                value = getattr(col, attr)
                if attr in ("flops", "device_hours"):
                    row[attr] = math.nan if value is None else float(value)
                    continue
                v, lo, hi = value if isinstance(value, tuple) else (math.nan,) * 3
                row.update({attr: v, f"{attr}_lo": lo, f"{attr}_hi": hi})
                if attr in ("lr", "batch"):
                    row[f"{attr}_note"] = value if isinstance(value, str) else ""
            rows.append(row)
        return pd.DataFrame(rows).set_index("approach")

    def footer(self) -> list[str]:
        """What the table assumes: the device and MFU, where LR* and B* come from."""
        return [f"device-hours: {self.cost}", self._laws_line(), *self.notes]

    def _laws_line(self) -> str:
        """Where LR* and B* come from: the laws are said to be read only where a column got a
        value from one, and a ``batch.sweep_law`` named only where one gave a B*."""
        source = self.hparam_source or "the sweep"
        read = [
            (symbol, key, self.batch_source if attr == "batch" else "")
            for attr, symbol, key in (
                ("lr", "lr*", LR_KEY),
                ("batch", "B*", f"{BATCH_KEY} with batch.sweep_law: {self.batch_law}"),
            )
            if any(isinstance(getattr(c, attr), tuple) for c in self.columns)
        ]
        how = "their intervals: the laws' bootstrap there; N_opt's own spread not carried"
        if any(other for *_, other in read):
            whose = ", ".join(f"{s}: the law of {other or source} ({k})" for s, k, other in read)
            where = "each read at each column's N_opt, D_opt, as a ladder's plan fits it"
            return f"{whose}; {where} ({how})"
        if read:
            symbols, keys = ", ".join(s for s, *_ in read), ", ".join(k for _, k, _ in read)
            return (
                f"{symbols}: the laws of {source}, read at each column's N_opt, D_opt, as a "
                f"ladder's plan fits them ({keys}; {how})"
            )
        if not self.laws_read:
            if self.hparam_source:
                return f"lr*, B*: no laws from {source} (why: the skipped line below)"
            return (
                "lr*, B*: no sweep laws (--hparam-sweep DIR, or a ladder with lr.from_sweep or "
                "batch.from_sweep)"
            )
        if self.batch_source:
            source = f"{source} and {self.batch_source}"
        if any(c.N is not None and c.D is not None for c in self.columns):
            return f"lr*, B*: no law of {source} that a ladder's plan takes (why: the lines below)"
        return (
            f"lr*, B*: the laws of {source}, but no column has the N_opt and D_opt to read them at"
        )

    def __str__(self) -> str:
        width = max(len(label) for label, *_ in ROWS)
        cells = self.rows()
        widths = [
            max(len(col.approach), *(len(row[i]) for _, row in cells))
            for i, col in enumerate(self.columns)
        ]
        header = " " * width + "".join(
            f"  {c.approach:>{w}}" for c, w in zip(self.columns, widths, strict=True)
        )
        lines = [self.title, header]
        for label, row in cells:
            lines.append(
                f"{label:<{width}}"
                + "".join(f"  {v:>{w}}" for v, w in zip(row, widths, strict=True))
            )
        return "\n".join(lines + self.footer())


def _cell(value: Estimate | float | str | None, fmt: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if not isinstance(value, tuple):
        return format(value, fmt) if math.isfinite(value) else "-"
    v, lo, hi = value
    if not math.isfinite(v):
        return "-"
    return format(v, fmt) + (f" [{lo:{fmt}} .. {hi:{fmt}}]" if math.isfinite(lo) else "")


def _estimate(value: float, ci: tuple[float, float]) -> Estimate:
    return (float(value), float(ci[0]), float(ci[1]))


def _isoflop_column(fit: IsoFLOPFit, C: float) -> TargetColumn:
    """a, b, N_opt and D_opt at C; only a and b when the line splits no compute (a degenerate
    slope carried to C gave the demo an N_opt 20x approach 3's, in the answer's own table)."""
    column = TargetColumn(
        "approach 2 (isoFLOP)",
        a=_estimate(fit.a, fit.ci.get("a", NO_CI)),
        b=_estimate(fit.b, fit.ci.get("b", NO_CI)),
    )
    if fit.splits_compute:
        ci = fit.optimal_intervals(C)
        n_opt, d_opt = fit.compute_optimal(C)
        column.N = _estimate(n_opt, ci["N"])
        column.D = _estimate(d_opt, ci["D"])
    return column


def _chinchilla_column(fit: ChinchillaFit, C: float) -> TargetColumn:
    """a, b, N_opt, D_opt and loss on the fit's own frontier; only a, b when it has none."""
    ci = fit.optimal_intervals(C)
    column = TargetColumn(
        "approach 3 (L(N, D))", a=_estimate(fit.a, ci["a"]), b=_estimate(fit.b, ci["b"])
    )
    try:
        n_opt, d_opt = fit.compute_optimal(C)
    except AnalysisError:
        return column
    column.N = _estimate(n_opt, ci["N"])
    column.D = _estimate(d_opt, ci["D"])
    column.loss = _estimate(fit.predict(n_opt, d_opt), ci["loss"])
    return column


def _frontier_column(fit: PowerLawFit, C: float) -> TargetColumn:
    return TargetColumn("frontier L(C)", loss=_estimate(fit.predict(C), fit.predict_interval(C)))


def target_answer(
    C: float,
    cost: DeviceCost,
    isoflop: IsoFLOPFit | None = None,
    chinchilla: ChinchillaFit | None = None,
    frontier: PowerLawFit | None = None,
    laws: SweepLaws | None = None,
    hparam_source: str = "",
) -> TargetAnswer:
    """The table at C from whichever fits there are; each column with an N_opt and D_opt gets
    LR* and B* from ``laws`` there (:func:`sweep_laws`) and its cost on ``cost``'s device.
    ``hparam_source``: how the footer names the sweep (default: the dir ``laws`` came from)."""
    C = require_positive("target compute C", C)
    _require_type("cost", cost, DeviceCost, optional=False)
    for name, value, expected in (
        ("isoflop", isoflop, IsoFLOPFit),
        ("chinchilla", chinchilla, ChinchillaFit),
        ("frontier", frontier, PowerLawFit),
        ("laws", laws, SweepLaws),
    ):
        _require_type(name, value, expected)
    built = [
        (fit, build(fit, C))
        for fit, build in (
            (isoflop, _isoflop_column),
            (chinchilla, _chinchilla_column),
            (frontier, _frontier_column),
        )
        if fit is not None
    ]
    columns = [col for _, col in built]
    batch = laws.batch_law if laws is not None else ""
    source = hparam_source or (laws.rules.lr_dir if laws is not None else "")
    other = laws is not None and laws.rules.batch_dir != laws.rules.lr_dir
    batch_source = laws.rules.batch_dir if other else ""
    answer = TargetAnswer(C, columns, cost, source, batch_source, laws is not None, batch)
    answer.notes += [
        f"{col.approach}: no 95% intervals (why: the UNRESOLVED line of its fit above)"
        for fit, col in built
        if isinstance(fit, ChinchillaFit | PowerLawFit)
        and not col.has_intervals
        and fit.no_intervals
    ]
    if isoflop is not None and not isoflop.splits_compute:
        answer.notes.append(
            f"approach 2: no N_opt, D_opt: its a = {isoflop.a:.3g} splits no compute between N "
            "and D (the isoFLOP fit's DEGENERATE line)"
        )
    if laws is not None:
        answer.notes += laws.notes
    for col in columns:
        if col.N is not None and col.D is not None:
            _price_and_tune(col, cost, laws, answer.notes)
    return answer


def _require_type(name: str, value: object, expected: type, optional: bool = True) -> None:
    """Refuse an argument of another type: fits given in the wrong order (isoflop comes before
    chinchilla) failed deep inside, on an attribute the other fit lacks ('splits_compute')."""
    if (optional and value is None) or isinstance(value, expected):
        return
    what = expected.__name__ + (" or None" if optional else "")
    raise AnalysisError(
        f"target_answer: {name} is a {type(value).__name__}, expected {what}; the order is "
        "(C, cost, isoflop, chinchilla, frontier, laws): give the fits by name"
    )


def _price_and_tune(
    col: TargetColumn, cost: DeviceCost, laws: SweepLaws | None, notes: list[str]
) -> None:
    N, D = col.N[0], col.D[0]
    col.flops = cost.flops(N, D)
    col.device_hours = cost.hours(N, D)
    if laws is None:
        return
    choices = laws.choices(N, D)
    col.lr, col.batch = (_tuned(choices[p], p in laws.refused) for p in ("lr", "batch"))
    outside = dict.fromkeys(t for c in choices.values() if c is not None for t in c.extrapolated)
    if outside:
        notes.append(
            f"{col.approach}: lr*, B* extrapolated ({', '.join(outside)} outside the sweep's cells)"
        )


def _tuned(choice: SweepChoice | None, refused: bool) -> Estimate | str | None:
    """A cell's LR* or B*: the plan's value and interval, its refusal, or none (no law)."""
    if choice is None:
        return REFUSED if refused else None
    return (choice.value, choice.low, choice.high)
