"""A relaunch into a run dir whose records are damaged (a hand edit, a bad copy) is refused in one
line naming the file, before anything in the dir changes: with the record unreadable there is
nothing to check the new settings or data against."""

from __future__ import annotations

import pytest

from trainer_core.io.records import RecordError
from trainer_core.train.same_run import check_same_data, check_same_run

FIX = "restore it from a copy, or use a new dir"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"model: [x\n", ":2: not valid YAML (expected ',' or ']', but got '<stream end>')"),
        # Read as "nothing recorded", so the run resumed from its checkpoint unchecked.
        (b"- 1\n", ": holds a list, not a mapping"),
    ],
)
def test_a_damaged_config_yaml_is_refused(tmp_path, tiny_config, content, why):
    path = tmp_path / "config.yaml"
    path.write_bytes(content)
    with pytest.raises(RecordError) as err:
        check_same_run(tiny_config(tmp_path), tmp_path)
    assert str(err.value) == f"{path}{why}; {FIX}"
    assert path.read_bytes() == content


def test_a_run_json_cut_short_is_refused(tmp_path):
    path = tmp_path / "run.json"
    path.write_text('{"name": "1M", "data_id": "ab')
    with pytest.raises(RecordError) as err:
        check_same_data("abc", tmp_path)
    assert str(err.value) == f"{path}:1: not valid JSON (Unterminated string starting at); {FIX}"
