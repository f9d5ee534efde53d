"""Reading a ladder table: the fit-points shape, D from FLOPs, one clear line per bad input."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from trainer_core.analysis.errors import AnalysisError
from trainer_core.analysis.ladder_table import accuracy_metric, read_ladder_table, task_names


def table(**changes) -> pd.DataFrame:
    df = pd.DataFrame(
        {
            "run": ["a-1x", "a-2x", "b-1x"],
            "N": [1.9e8, 1.9e8, 3.7e8],
            "D": [3.8e9, 7.6e9, 7.4e9],
            "loss": [3.1, 3.0, 2.9],
            "arc/bpb": [1.2, 1.1, 1.0],
            "arc/acc": [0.4, 0.45, 0.5],
        }
    )
    for name, value in changes.items():
        if value is None:
            df = df.drop(columns=name)
        else:
            df[name] = value
    return df


def test_csv_gives_the_fit_points_columns(tmp_path):
    path = tmp_path / "ladder.csv"
    table().to_csv(path, index=False)
    pts = read_ladder_table(path)
    assert list(pts.columns[:6]) == ["size", "name", "N", "tokens", "flops", "eval_loss"]
    assert list(pts["size"]) == ["190M", "190M", "370M"]
    assert pts["flops"].iloc[0] == pytest.approx(6 * 1.9e8 * 3.8e9)
    assert task_names(pts) == ["arc"]


def test_parquet_with_flops_only(tmp_path):
    path = tmp_path / "ladder.parquet"
    df = table(D=None)
    df["FLOPs"] = [6 * 1.9e8 * 3.8e9] * 3
    df.to_parquet(path)
    pts = read_ladder_table(path)
    assert pts["tokens"].iloc[0] == pytest.approx(3.8e9)
    assert pts["tokens"].iloc[2] == pytest.approx(3.8e9 * 1.9 / 3.7)


def test_missing_column_names_the_file_and_column(tmp_path):
    path = tmp_path / "ladder.csv"
    table(N=None).to_csv(path, index=False)
    with pytest.raises(AnalysisError, match=r"ladder\.csv: missing column N") as err:
        read_ladder_table(path)
    assert "\n" not in str(err.value)


def test_missing_tokens_asks_for_d_or_flops(tmp_path):
    path = tmp_path / "ladder.csv"
    table(D=None).to_csv(path, index=False)
    with pytest.raises(AnalysisError, match=r"D \(or FLOPs\)"):
        read_ladder_table(path)


@pytest.mark.parametrize(
    ("column", "values", "line"),
    [
        ("N", [1.9e8, 0.0, 3.7e8], "line 3"),
        ("loss", [3.1, 3.0, math.nan], "line 4"),
        ("arc/acc", [0.4, 1.5, 0.5], "line 3"),
        ("arc/acc_pmi", [0.4, 0.5, -0.1], "line 4"),
    ],
)
def test_bad_value_names_the_file_line_and_column(tmp_path, column, values, line):
    path = tmp_path / "ladder.csv"
    table(**{column: values}).to_csv(path, index=False)
    with pytest.raises(AnalysisError) as err:
        read_ladder_table(path)
    message = str(err.value)
    assert str(path) in message and line in message and f"column {column}" in message


def test_any_accuracy_makes_a_task_and_auto_prefers_the_calibrated_one(tmp_path):
    path = tmp_path / "ladder.csv"
    table(**{"arc/acc": None, "arc/acc_norm": [0.3, 0.3, 0.4]}).to_csv(path, index=False)
    pts = read_ladder_table(path)
    assert task_names(pts) == ["arc"]
    assert accuracy_metric(pts, "arc") == "acc_norm"  # the only one there
    pts["arc/acc"] = [0.4, 0.45, 0.5]
    assert accuracy_metric(pts, "arc") == "acc"
    pts["arc/acc_pmi"] = [0.5, 0.55, 0.6]
    assert accuracy_metric(pts, "arc") == "acc_pmi"
    assert accuracy_metric(pts, "arc", "acc_norm") == "acc_norm"
    pts["arc/acc_pmi"] = math.nan  # logged by no run: not measured
    assert accuracy_metric(pts, "arc") == "acc"
    with pytest.raises(AnalysisError) as err:
        accuracy_metric(pts, "arc", "acc_pmi")
    assert str(err.value) == "task 'arc' has no arc/acc_pmi values (it has: acc, acc_norm)"
    with pytest.raises(AnalysisError, match="'acc_raw': use auto or one of acc, acc_norm"):
        accuracy_metric(pts, "arc", "acc_raw")
    with pytest.raises(AnalysisError) as err:
        accuracy_metric(pts.drop(columns=["arc/acc", "arc/acc_norm"]), "arc")
    assert str(err.value) == "task 'arc' has no accuracy column (it has: no accuracy)"


def test_parquet_errors_name_the_row(tmp_path):
    path = tmp_path / "ladder.parquet"
    table(N=[1.9e8, -1.0, 3.7e8]).to_parquet(path)
    with pytest.raises(AnalysisError, match="row 1: column N"):
        read_ladder_table(path)


def test_other_formats_and_absent_files_are_refused(tmp_path):
    with pytest.raises(AnalysisError, match="no such file"):
        read_ladder_table(tmp_path / "nope.csv")
    path = tmp_path / "ladder.json"
    path.write_text("{}")
    with pytest.raises(AnalysisError, match=r"\.csv or \.parquet"):
        read_ladder_table(path)


def test_sizes_are_named_as_a_ladder_names_them():
    """One rule for tables and plots; 999,999 rounds up to the next unit, not to '1e+03K'."""
    from trainer_core.analysis.labels import compact

    assert [compact(n) for n in (512, 21_672, 999_999, 190_354_176, 7e9)] == [
        "512",
        "21.7K",
        "1M",
        "190M",
        "7B",
    ]
