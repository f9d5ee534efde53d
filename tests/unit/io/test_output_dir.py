from __future__ import annotations

import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import pytest

from trainer_core.config.loader import ConfigError
from trainer_core.io.output_dir import check_output_dir


@contextmanager
def unprivileged():
    """Run the block as user 'nobody' when the tests run as root, whom no permission bit stops."""
    if os.geteuid() != 0:
        yield
        return
    os.seteuid(65534)
    try:
        yield
    finally:
        os.seteuid(0)


def test_output_dir_check_names_the_key_and_creates_nothing(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    fix = "choose another trainer.run_dir"
    with pytest.raises(ConfigError) as err:
        check_output_dir(regular / "a" / "run", "trainer.run_dir")
    assert str(err.value) == (
        f"trainer.run_dir: {regular / 'a' / 'run'} can't be created, {regular} is a file; {fix}"
    )
    with pytest.raises(
        ConfigError, match=f"^trainer.run_dir: {regular} is a file, not a directory"
    ):
        check_output_dir(regular, "trainer.run_dir")
    assert check_output_dir(tmp_path / "new" / "run", "k") == tmp_path / "new" / "run"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]


def test_unwritable_output_dir_is_named():
    base = Path(tempfile.mkdtemp())  # pytest's tmp_path sits in a dir only its owner may enter
    base.chmod(0o755)
    locked = base / "locked"
    locked.mkdir(mode=0o555)
    try:
        with unprivileged(), pytest.raises(ConfigError) as err:
            check_output_dir(locked / "run", "dir")
        assert str(err.value) == (
            f"dir: {locked / 'run'} can't be created, {locked} is not writable; choose another dir"
        )
        with unprivileged(), pytest.raises(ConfigError, match=f"^dir: {locked} is not writable"):
            check_output_dir(locked, "dir")
        assert check_output_dir(base / "fine", "dir") == base / "fine"
    finally:
        shutil.rmtree(base)
