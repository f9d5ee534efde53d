"""cluster.yaml validated offline against the schema Ray ships (no credentials, no network)."""

from __future__ import annotations

import copy

import pytest
import yaml
from jsonschema.exceptions import ValidationError
from ray.autoscaler._private.util import prepare_config, validate_config


@pytest.fixture()
def cluster(repo_root) -> dict:
    return yaml.safe_load((repo_root / "cluster.yaml").read_text())


def check(cfg: dict) -> None:
    validate_config(prepare_config(copy.deepcopy(cfg)))


def test_cluster_yaml_is_valid_and_shaped_for_gpu_training(cluster):
    check(cluster)
    types = cluster["available_node_types"]
    head = types[cluster["head_node_type"]]
    assert head["resources"].get("GPU", 0) == 0
    gpu = types["gpu_worker"]
    assert gpu["resources"]["GPU"] == 8 and gpu["node_config"]["InstanceType"] == "p5.48xlarge"
    assert gpu["min_workers"] <= gpu["max_workers"] <= cluster["max_workers"]
    setup = "\n".join(cluster["setup_commands"])
    assert (
        "pip install" in setup and "-c constraints.txt -e ." in setup and "torch==2.13.0" in setup
    )
    assert cluster["file_mounts"]["/home/ubuntu/rayladder"] == "."
    assert {"**/.git", "**/.venv", "**/runs"} <= set(cluster["rsync_exclude"])


def test_typo_in_a_top_level_key_is_rejected(cluster):
    cluster["max_worker"] = cluster.pop("max_workers")
    with pytest.raises(ValidationError, match="'max_worker' was unexpected"):
        check(cluster)


def test_min_workers_above_max_is_rejected(cluster):
    cluster["available_node_types"]["gpu_worker"]["min_workers"] = 9
    with pytest.raises(ValueError, match="smaller than the sum of `min_workers`"):
        check(cluster)
