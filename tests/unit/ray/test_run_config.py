from __future__ import annotations

import pytest

from trainer_core.config.loader import ConfigError


def test_a_ray_config_checks_the_batch_splits_over_its_data_parallel_ranks(tiny_config, tmp_path):
    from trainer_core.ray.run_config import RayTrainConfig

    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, "--ray.num_workers=3", cls=RayTrainConfig)
    assert str(e.value) == (
        "trainer.global_batch_size: 512 is not allowed; its 8 sequences can't be split evenly "
        "over 3 data-parallel ranks"
    )
    # 8 workers in TP pairs are 4 data-parallel ranks: 12 sequences are 3 per rank, and a
    # micro-batch of 2 divides the 12 but not the 3.
    args = ("--ray.num_workers=8", "--parallel.tp=2", "--train_module.rank_microbatch_seqs=2")
    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, *args, "--trainer.global_batch_size=768", cls=RayTrainConfig)
    assert str(e.value) == (
        "trainer.global_batch_size: 768 is not allowed; each of the 4 data-parallel ranks gets 3 "
        "sequences, not a multiple of train_module.rank_microbatch_seqs=2"
    )


def test_an_unknown_reader_is_named_with_the_choices(tiny_config, tmp_path):
    from trainer_core.ray.run_config import RayTrainConfig

    with pytest.raises(ConfigError) as e:
        tiny_config(tmp_path, "--ray.reader=disk", cls=RayTrainConfig)
    assert str(e.value) == "ray.reader: 'disk' is not allowed; must be one of ray_data, worker"
    assert tiny_config(tmp_path, "--ray.reader=worker", cls=RayTrainConfig).ray.reader == "worker"
