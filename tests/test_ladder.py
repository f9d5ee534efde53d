from __future__ import annotations

import warnings

import pytest

from trainer_core.config import ModelConfig, ParallelConfig, TrainModuleConfig
from trainer_core.configio import ConfigError, from_dict
from trainer_core.ladder import (
    BatchFormula,
    Beta2Formula,
    LadderConfig,
    LRFormula,
    batch_and_devices,
    beta2_for_batch,
    peak_lr,
    plan_ladder,
    plan_size,
    target_batch_tokens,
)
from trainer_core.memory import estimate_memory
from trainer_core.schedule import decay_windows


def test_olmo_default_formulas_at_reference_size():
    n = 108_000_000
    assert target_batch_tokens(n, BatchFormula()) == 2048 * 160
    assert peak_lr(n, LRFormula()) == pytest.approx(0.0047 / 2)
    # 8x the params -> 4x the batch (exponent 2/3), half the LR (exponent -1/3)
    assert target_batch_tokens(8 * n, BatchFormula()) == pytest.approx(4 * 2048 * 160, rel=1e-6)
    assert peak_lr(8 * n, LRFormula()) == pytest.approx(0.0047 / 4)
    assert beta2_for_batch(524_288, Beta2Formula()) == 0.95
    assert beta2_for_batch(524_287, Beta2Formula()) == 0.99


def test_batch_rounding_and_device_expansion():
    # micro-batch 8k tokens, 1 device minimum, 8 allowed: 100k target -> 12 micro-batches
    # -> 8 devices x 2 accumulation steps = 16 micro-batches (131072 tokens).
    batch, devices, dp = batch_and_devices(100_000, 8192, 1, 8)
    assert (batch, devices, dp) == (131072, 8, 8)
    # Fewer micro-batches than devices: only as many devices as there is work for.
    batch, devices, dp = batch_and_devices(20_000, 8192, 1, 8)
    assert (batch, devices) == (16384, 2)


def test_memory_estimate_grows_with_micro_batch_and_shrinks_with_sharding():
    m = ModelConfig(size="1B", vocab_size=50304)

    def total(micro=1, shard=1, ac="none"):
        parallel = ParallelConfig(activation_checkpointing=ac)
        return estimate_memory(
            m,
            parallel,
            TrainModuleConfig(),
            seq_len=4096,
            micro_seqs=micro,
            dp_shard=shard,
            grad_accum=1,
        ).total

    one = total()
    assert total(micro=2) > one
    assert total(shard=8) < one
    assert total(ac="full") < one


def gpu_ladder(**kw) -> LadderConfig:
    base = {
        "sizes": ["200M", "1B", "7B"],
        "max_devices": 64,
        "device_type": "H100",
        "seq_len": 4096,
        "vocab_size": 100352,
    }
    base.update(kw)
    return from_dict(LadderConfig, base)


def test_gpu_plan_is_consistent():
    ladder = gpu_ladder()
    for size in ladder.sizes:
        p = plan_size(size, ladder)
        assert p.batch_tokens == p.micro_batch_seqs * ladder.seq_len * p.dp_size * p.grad_accum
        assert p.devices <= 64 and p.batch_tokens % ladder.seq_len == 0
        assert abs(p.batch_tokens - p.target_batch_tokens) / p.target_batch_tokens < 0.5
        assert p.steps * p.batch_tokens >= 20 * 4 * p.num_params
        assert p.checkpoint_steps[-1] == p.steps
    big = plan_size("7B", ladder)
    assert big.devices > 1  # a 7B model does not fit one 80 GB device with AdamW state


def test_wsds_checkpoints_bracket_each_decay():
    ladder = gpu_ladder(sizes=["200M"])
    p = plan_size("200M", ladder)
    # four decays -> a checkpoint where each decay starts and where it ends
    assert len(p.checkpoint_steps) == 8
    ends = p.checkpoint_steps[1::2]
    assert ends[-1] == p.steps
    assert ends[0] == pytest.approx(p.steps / 8, abs=1)


def test_cosine_override_has_single_decay():
    ladder = gpu_ladder(sizes=["200M"], duration={"schedule": "cosine"})
    p = plan_size("200M", ladder)
    assert p.schedule.kind == "cosine" and p.checkpoint_steps == [p.steps]


def test_too_few_devices_is_an_error():
    ladder = gpu_ladder(sizes=["7B"], max_devices=1)
    with pytest.raises(ConfigError, match="'7B' needs at least .* devices .* max_devices is 1"):
        plan_size("7B", ladder)


def test_batch_drift_warns():
    ladder = from_dict(
        LadderConfig,
        {"sizes": ["1M"], "seq_len": 128, "max_micro_batch_seqs": 64, "batch": {"coef": 1000.0}},
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        plan_size("1M", ladder)
    assert any("differs from the target" in str(w.message) for w in caught)


def test_bad_size_name():
    with pytest.raises(ConfigError, match="sizes: '30M' is not in the size table"):
        from_dict(LadderConfig, {"sizes": ["1M", "30M"]})


def test_the_plan_fills_the_run_template(tmp_path):
    ladder = from_dict(
        LadderConfig,
        {
            "dir": str(tmp_path),
            "name": "t",
            "run": {
                "model": {"tie_embeddings": True},
                "optim": {"weight_decay": 0.05},
                "trainer": {"seed": 7},
                "tracking": {"tags": ["a"]},
            },
        },
    )
    (p,) = plan_ladder(ladder, ["3M"])
    cfg = p.config
    assert cfg.model.size == "3M" and cfg.model.d_model == 192 and cfg.model.tie_embeddings
    assert cfg.optim.lr == p.lr == pytest.approx(peak_lr(p.num_params, ladder.lr))
    assert cfg.optim.weight_decay == 0.05 and cfg.trainer.seed == 7
    assert cfg.trainer.global_batch_size == p.batch_tokens and cfg.total_steps == p.steps
    assert cfg.train_module.rank_microbatch_seqs == p.micro_batch_seqs
    assert cfg.checkpoint.keep_steps == p.checkpoint_steps
    assert cfg.trainer.run_dir == str(tmp_path / "runs" / "3M")
    assert cfg.tracking.group == "t" and cfg.tracking.name == "t-3M"
    assert cfg.tracking.tags == ["a", "lr_source=formula"]


@pytest.mark.parametrize(
    "data, keys",
    [
        ({"run": {"optim": {"lr": 0.01}}}, ("run.optim.lr", "lr")),
        ({"run": {"optim": {"beta2": 0.9}}}, ("run.optim.beta2", "beta2")),
        ({"run": {"model": {"size": "3M"}}}, ("run.model.size", "sizes")),
        ({"run": {"model": {"n_layers": 3}}}, ("run.model.n_layers", "sizes")),
        ({"run": {"model": {"vocab_size": 512}}}, ("run.model.vocab_size", "vocab_size")),
        ({"run": {"data": {"seq_len": 64}}}, ("run.data.seq_len", "seq_len")),
        ({"run": {"schedule": {"kind": "wsd"}}}, ("run.schedule", "duration")),
        ({"run": {"trainer": {"max_steps": 10}}}, ("run.trainer.max_steps", "duration")),
        (
            {"run": {"trainer": {"global_batch_size": 4096}}},
            ("run.trainer.global_batch_size", "batch"),
        ),
        ({"run": {"trainer": {"run_dir": "x"}}}, ("run.trainer.run_dir", "dir")),
        ({"run": {"tracking": {"name": "x"}}}, ("run.tracking.name", "name")),
        (
            {"run": {"train_module": {"rank_microbatch_seqs": 2}}},
            ("run.train_module.rank_microbatch_seqs", "max_micro_batch_seqs"),
        ),
        (
            {"eval_tokens": 4096, "run": {"trainer": {"eval_batches": 2}}},
            ("run.trainer.eval_batches", "eval_tokens"),
        ),
    ],
)
def test_a_planned_field_set_in_the_template_is_an_error_naming_both_keys(data, keys):
    template_key, ladder_key = keys
    with pytest.raises(ConfigError) as err:
        from_dict(LadderConfig, data)
    assert str(err.value) == (
        f"{template_key}: the ladder plans it from {ladder_key} for every size; "
        f"remove {template_key} (or set {ladder_key})"
    )


def test_a_planned_ray_setting_is_an_error_naming_both_keys():
    from trainer_core.ray.ladder_run import LadderJobConfig

    with pytest.raises(ConfigError, match=r"^ray.num_workers: .* from max_devices"):
        from_dict(LadderJobConfig, {"ray": {"num_workers": 2}})
    assert from_dict(LadderJobConfig, {"ray": {"cpus_per_worker": 0.5}}).ray.num_workers == 1


def test_one_home_per_fact_the_old_ladder_keys_name_their_new_home():
    homes = {"seed": "run.trainer.seed", "data": "run.data", "tracking": "run.tracking"}
    homes["optim"] = r"run.optim \(beta1, weight_decay\) and beta2"
    for key, home in homes.items():
        with pytest.raises(ConfigError, match=f"^{key}: this key moved; set {home}"):
            from_dict(LadderConfig, {key: {}})


def test_demo_ladder_is_designed_to_carry_a_scaling_law(repo_root):
    """Issue 11: >= 4 sizes, each >= 1x Chinchilla, one eval set size for all, and compute budgets
    that three sizes' annealed points cover (what an isoFLOP parabola needs)."""
    from trainer_core.configio import load_config
    from trainer_core.ray.ladder_run import LadderJobConfig

    job = load_config(LadderJobConfig, repo_root / "workflows" / "configs" / "ladder-demo.yaml")
    plans = plan_ladder(job)
    assert len(plans) >= 4
    eval_tokens = set()
    ranges = []
    for p in plans:
        assert p.tokens >= 20 * p.num_params, p.size
        assert p.num_params < 1_000_000
        eval_tokens.add(p.eval_batches * p.batch_tokens)
        assert p.config.trainer.eval_batches == p.eval_batches
        ends = [end for _, end in decay_windows(p.steps, p.schedule)]
        assert len(ends) >= 3 and ends[-1] == p.steps
        flops = [p.flops_per_token * e * p.batch_tokens for e in ends]
        ranges.append((min(flops), max(flops)))
    assert max(eval_tokens) / min(eval_tokens) < 1.1
    covered = [c for c, _ in ranges if sum(lo <= c <= hi for lo, hi in ranges) >= 3]
    assert covered, ranges


def test_multiple_by_size_overrides_the_duration_of_one_size():
    job = from_dict(
        LadderConfig,
        {
            "sizes": ["25K", "50K"],
            "duration": {"chinchilla_multiple": 1, "multiple_by_size": {"25K": 4}},
        },
    )
    small, large = plan_ladder(job)
    assert small.chinchilla_multiple == 4 and large.chinchilla_multiple == 1
    assert small.tokens == pytest.approx(4 * 20 * small.num_params, rel=0.01)
    assert large.tokens == pytest.approx(20 * large.num_params, rel=0.02)
    with pytest.raises(ConfigError, match="multiple_by_size.25K"):
        from_dict(LadderConfig, {"duration": {"multiple_by_size": {"25K": 3}}})
    with pytest.raises(ConfigError, match="multiple_by_size.*'9K'"):
        from_dict(LadderConfig, {"duration": {"multiple_by_size": {"9K": 2}}})
