from __future__ import annotations

import pytest

from trainer_core.config.cli import split_args
from trainer_core.config.loader import ConfigError


def test_cli_split_accepts_space_and_equals_forms():
    own, overrides = split_args(
        ["--config", "a.yaml", "--optim.lr", "1e-3", "--trainer.seed=3"], {"--config": True}
    )
    assert own == {"--config": "a.yaml"}
    assert overrides == ["--optim.lr=1e-3", "--trainer.seed=3"]
    with pytest.raises(ConfigError, match="unknown argument 'oops'"):
        split_args(["oops"], {"--config": True})
