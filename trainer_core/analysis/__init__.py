"""Experiment analysis: load run dirs into DataFrames, fit scaling laws and LR optima, plot.

``load(<exp dir>)`` needs only the files the trainer writes (docs/run_layout.md); Ray is imported only
by ``ExperimentResults.result_grid()``.
"""

from __future__ import annotations

from trainer_core.analysis.checks import (
    fit_flags,
    isoflop_flags,
    isoflop_unresolved,
    unresolved,
)
from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.fits import (
    ChinchillaFit,
    PowerLawFit,
    fit_chinchilla,
    fit_loss_vs_compute,
)
from trainer_core.analysis.frontier import fit_frontier, frontier_points
from trainer_core.analysis.hparam_heldout import HparamHeldOut, held_out_check, leave_one_out
from trainer_core.analysis.hparam_laws import (
    CellOptimum,
    HparamLawFit,
    HparamLaws,
    HparamPrediction,
    cell_optima,
    fit_hparam_law,
    fit_hparam_laws,
    horizons_per_size,
)
from trainer_core.analysis.hparam_table import hparam_table
from trainer_core.analysis.isoflop import IsoFLOPFit, fit_isoflop
from trainer_core.analysis.ladder_table import read_ladder_table, task_columns, task_names
from trainer_core.analysis.load import ExperimentResults, load
from trainer_core.analysis.lr import (
    LADDER_LR_EXPONENT,
    LRPowerLawFit,
    OptimalLR,
    fit_lr_power_law,
    fit_sweep_lr,
    lr_sweep_table,
    optimal_lr,
    optimal_lrs,
)
from trainer_core.analysis.lr_grid import widen_horizons, widen_lrs, widen_sweep
from trainer_core.analysis.plots import (
    loss_curves_figure,
    lr_sweep_figure,
    lr_vs_size_figure,
    plot_loss_curves,
    plot_lr_sweep,
    plot_lr_vs_size,
)
from trainer_core.analysis.plots_hparams import (
    hparam_law_figure,
    plot_cell_sweeps,
    plot_hparam_law,
    plot_hparam_laws,
)
from trainer_core.analysis.plots_scaling import (
    loss_vs_compute_figure,
    plot_isoflops,
    plot_loss_vs_compute,
)
from trainer_core.analysis.plots_tasks import plot_task_prediction
from trainer_core.analysis.predict import (
    ExtrapolationCheck,
    HeldOutPrediction,
    LossPrediction,
    chinchilla_from_points,
    extrapolation_check,
    predict_loss,
)
from trainer_core.analysis.report import report_experiment
from trainer_core.analysis.report_data import Report
from trainer_core.analysis.target import (
    DeviceCost,
    FlopsPerToken,
    TargetAnswer,
    TargetColumn,
    TargetSettings,
    device_cost,
    sweep_laws,
    target_answer,
)
from trainer_core.analysis.task_sigmoid import SigmoidFit, fit_sigmoid
from trainer_core.analysis.tasks import (
    TaskLaw,
    TaskPrediction,
    TaskReport,
    fit_task,
    predict_tasks,
    task_holdout_check,
)

__all__ = [
    "AnalysisError",
    "DeviceCost",
    "FlopsPerToken",
    "TargetAnswer",
    "TargetColumn",
    "TargetSettings",
    "device_cost",
    "sweep_laws",
    "target_answer",
    "CellOptimum",
    "ChinchillaFit",
    "ExperimentResults",
    "ExtrapolationCheck",
    "HeldOutPrediction",
    "HparamHeldOut",
    "HparamLawFit",
    "HparamLaws",
    "HparamPrediction",
    "IsoFLOPFit",
    "LADDER_LR_EXPONENT",
    "LRPowerLawFit",
    "LossPrediction",
    "OptimalLR",
    "PowerLawFit",
    "Report",
    "SigmoidFit",
    "TaskLaw",
    "TaskPrediction",
    "TaskReport",
    "cell_optima",
    "chinchilla_from_points",
    "extrapolation_check",
    "fit_chinchilla",
    "fit_flags",
    "fit_frontier",
    "fit_hparam_law",
    "fit_hparam_laws",
    "fit_isoflop",
    "fit_loss_vs_compute",
    "fit_lr_power_law",
    "fit_sigmoid",
    "fit_sweep_lr",
    "fit_task",
    "frontier_points",
    "held_out_check",
    "horizons_per_size",
    "hparam_law_figure",
    "hparam_table",
    "isoflop_flags",
    "isoflop_unresolved",
    "leave_one_out",
    "load",
    "loss_curves_figure",
    "loss_vs_compute_figure",
    "lr_sweep_figure",
    "lr_sweep_table",
    "lr_vs_size_figure",
    "optimal_lr",
    "optimal_lrs",
    "plot_cell_sweeps",
    "plot_hparam_law",
    "plot_hparam_laws",
    "plot_isoflops",
    "plot_loss_curves",
    "plot_loss_vs_compute",
    "plot_lr_sweep",
    "plot_lr_vs_size",
    "plot_task_prediction",
    "predict_loss",
    "predict_tasks",
    "read_ladder_table",
    "report_experiment",
    "task_columns",
    "task_holdout_check",
    "task_names",
    "unresolved",
    "widen_lrs",
    "widen_horizons",
    "widen_sweep",
]
