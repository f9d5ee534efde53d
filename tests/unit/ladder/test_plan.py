from __future__ import annotations

import json
import math
import warnings
from dataclasses import replace

import pytest

from trainer_core.config.loader import ConfigError, from_dict, load_config
from trainer_core.config.sections import (
    ModelConfig,
    ParallelConfig,
    TrainConfig,
    TrainModuleConfig,
)
from trainer_core.ladder.batch import (
    batch_and_devices,
    min_mesh_and_micro,
    step_memory,
)
from trainer_core.ladder.config import LadderConfig, device_counts
from trainer_core.ladder.formulas import (
    BatchFormula,
    Beta2Formula,
    LRFormula,
    beta2_for_batch,
    peak_lr,
    target_batch_tokens,
)
from trainer_core.ladder.memory import estimate_memory
from trainer_core.ladder.plan import plan_ladder, plan_size
from trainer_core.model.counts import count_params
from trainer_core.train.build import build_trainer
from trainer_core.train.schedule import decay_windows


def test_olmo_default_formulas_at_reference_size():
    n = 108_000_000
    assert target_batch_tokens(n, BatchFormula()) == 2048 * 160
    assert peak_lr(n, LRFormula()) == pytest.approx(0.0047 / 2)
    # 8x the params -> 4x the batch (exponent 2/3), half the LR (exponent -1/3)
    assert target_batch_tokens(8 * n, BatchFormula()) == pytest.approx(4 * 2048 * 160, rel=1e-5)
    assert peak_lr(8 * n, LRFormula()) == pytest.approx(0.0047 / 4)
    assert beta2_for_batch(524_288, Beta2Formula()) == 0.95
    assert beta2_for_batch(524_287, Beta2Formula()) == 0.99


def test_batch_rounding_and_device_expansion():
    counts = [1, 2, 4, 8]
    tp1, tp2 = ParallelConfig(), ParallelConfig(tp=2)
    # 98 sequences, micro-batches of 4: 8 devices would need 96 or 128 (2% / 31% off): 96.
    assert batch_and_devices(98, 4, 1, counts, tp1) == (96, 8)
    # 12 sequences in micro-batches of 8 can't spread over 8 ranks within 10%; whole sequences
    # can (one and a half micro-batches' worth per rank is not whole: 8 x 2 = 16 is 33% off).
    assert batch_and_devices(12, 8, 1, counts, tp1) == (12, 4)
    # With tp=2 a device pair is one data-parallel rank: 8 devices = 4 ranks.
    assert batch_and_devices(98, 4, 2, counts, tp2) == (96, 8)
    assert batch_and_devices(100, 1, 2, counts, tp2) == (100, 8)  # 4 ranks of 25 sequences
    assert batch_and_devices(100, 1, 1, counts, tp1) == (96, 8)  # 8 ranks of 12 (4% off)
    # Nothing within 10%: the closest batch (3 sequences can't become 8 ranks' worth).
    assert batch_and_devices(3, 1, 8, [8], tp1) == (8, 8)


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


@pytest.mark.parametrize("tp", [1, 2, 4, 8])
def test_gpu_config_plans_its_mesh_and_the_worker_gets_it(repo_root, tp):
    """Every size of the GPU ladder config, for each tp: micro x seq x dp x accum = batch, a
    device count the mesh and whole nodes allow, and a worker-side config with that mesh."""
    from trainer_core.config.loader import load_config
    from trainer_core.ray.ladder_run import LadderJobConfig, on_ray

    job = load_config(
        LadderJobConfig,
        repo_root / "workflows" / "configs" / "ladder-gpu.yaml",
        [f"--run.parallel.tp={tp}"],
    )
    splittable = [s for s in job.sizes if ModelConfig(size=s).n_heads % tp == 0]
    # head dim 64 below 1B: 10, 14, 20 and 26 heads split 2 ways; 4 ways 400M and 1B; 8 ways 1B
    expected = {1: job.sizes, 2: job.sizes, 4: ["400M", "1B"], 8: ["1B"]}[tp]
    assert splittable == expected
    for size in set(job.sizes) - set(splittable):
        with pytest.raises(ConfigError, match=f"run.parallel.tp: {tp} does not divide"):
            plan_ladder(job, [size])
    for p in plan_ladder(job, splittable):
        assert p.target_batch_tokens >= job.min_rank_tokens * p.dp_size
        assert p.mesh == (1, p.devices // tp, tp)
        assert p.batch_tokens == p.micro_batch_seqs * job.seq_len * p.dp_size * p.grad_accum
        assert p.devices in (1, 2, 4, 8) or p.devices % job.devices_per_node == 0
        assert p.memory.total <= job.memory_bytes
        worker = on_ray(p.config, p, job)
        assert (worker.ray.num_workers, worker.parallel.tp) == (p.devices, tp)
        for rank in range(p.devices):
            layout = worker.layout(rank)
            assert (layout.replicate, layout.shard, layout.tp) == p.mesh
            assert layout.dp_rank == rank // tp
        assert worker.trainer.global_batch_size == p.batch_tokens
        assert worker.train_module.rank_microbatch_seqs == p.micro_batch_seqs


def test_mesh_the_ladder_cannot_build_fails_in_the_plan():
    with pytest.raises(ConfigError, match="run.parallel.tp: 3 .* must divide devices_per_node=8"):
        gpu_ladder(run={"parallel": {"tp": 3}})
    with pytest.raises(ConfigError, match="run.parallel.dp_shard: 2 .* leave it -1"):
        gpu_ladder(run={"parallel": {"dp_shard": 2}})
    with pytest.raises(ConfigError, match="max_devices: 1 .* multiple of dp_replicate x tp = 2"):
        gpu_ladder(max_devices=1, run={"parallel": {"tp": 2}})
    with pytest.raises(
        ConfigError,
        match=r"run.parallel.tp: 4 does not divide model.n_heads=10; .* \(or drop size '100M'\)",
    ):
        plan_size("100M", gpu_ladder(sizes=["100M"], run={"parallel": {"tp": 4}}))


def test_devices_are_a_power_of_two_in_a_node_or_whole_nodes():
    ladder = gpu_ladder(max_devices=40, run={"parallel": {"tp": 2}})
    assert device_counts(ladder) == [2, 4, 8, 16, 24, 32, 40]


def test_accumulation_that_would_not_fit_reduces_every_micro_batch():
    """FSDP keeps a full unsharded gradient copy while accumulating: a 7B on 4 devices with
    accumulation does not fit 80 GB with it, so the plan reduces after every micro-batch."""
    run = {
        "parallel": {"activation_checkpointing": "full"},
        "train_module": {"autocast_precision": "bf16"},
    }
    ladder = gpu_ladder(sizes=["7B"], max_devices=4, batch={"coef": 4 * 2048 * 160}, run=run)
    p = plan_size("7B", ladder)
    assert p.grad_accum > 1 and p.config.train_module.reduce_grads_every_micro_batch
    assert p.memory.unsharded_grads == 0 and p.memory.total <= ladder.memory_bytes
    assert p.table_row(ladder)["grad reduce"] == "every micro"


def test_the_micro_batch_is_the_largest_that_fits_the_final_mesh():
    """The fewest devices that hold a 200M (one) take micro-batches of 4 (powers of two); the
    final mesh (8 devices, FSDP-sharded states) takes the largest divisor of its 20 sequences per
    rank that fits there: 5, which would not fit on the one device; 10 and 20 fit nowhere."""
    base = gpu_ladder(sizes=["200M"], max_devices=8)
    model = plan_size("200M", base).model

    def need(ladder, devices: int, micro: int, rank_seqs: int = 20) -> float:
        return step_memory(model, ladder, devices, micro, rank_seqs // micro, False).total

    # a budget (GiB) between 5 sequences on 8 devices and 5 on one
    gib = (need(base, 8, 5) + need(base, 1, 5)) / 2 / 2**30
    ladder = gpu_ladder(sizes=["200M"], max_devices=8, device_memory_gb=gib, memory_fraction=1.0)
    p = plan_size("200M", ladder)
    rank_seqs = p.batch_seqs // p.dp_size
    assert min_mesh_and_micro(model, ladder) == (1, 4)
    assert (p.devices, rank_seqs, p.micro_batch_seqs, p.grad_accum) == (8, 20, 5, 4)
    assert need(ladder, 8, 5) <= ladder.memory_bytes < need(ladder, 1, 5)
    for micro in range(6, min(rank_seqs, ladder.max_micro_batch_seqs) + 1):
        assert rank_seqs % micro or need(ladder, 8, micro) > ladder.memory_bytes, micro
    assert p.memory == step_memory(model, ladder, 8, 5, 4, False)
    assert not p.config.train_module.reduce_grads_every_micro_batch


def test_a_rank_batch_with_few_divisors_gives_way_to_one_with_a_larger_micro_batch(repo_root):
    """The GPU config's 1B at tp=4: the batch nearest its target is 25 sequences per rank, whose
    micro-batches are 25 (too big), 5 and 1. Another batch within the 10% drift, 26 per rank,
    takes micro-batches of 13: the planner uses it rather than run 5 small micro-batches."""
    from trainer_core.config.loader import load_config
    from trainer_core.ray.ladder_run import LadderJobConfig

    job = load_config(
        LadderJobConfig,
        repo_root / "workflows" / "configs" / "ladder-gpu.yaml",
        ["--run.parallel.tp=4"],
    )
    (p,) = plan_ladder(job, ["1B"])
    target_seqs = round(p.target_batch_tokens / job.seq_len)
    nearest = round(target_seqs / p.dp_size)
    assert (nearest, p.dp_size) == (25, 16)
    assert step_memory(p.model, job, p.devices, 25, 1, False).total > job.memory_bytes
    assert (p.batch_seqs // p.dp_size, p.micro_batch_seqs, p.grad_accum) == (26, 13, 2)
    assert abs(p.batch_tokens - p.target_batch_tokens) / p.target_batch_tokens <= 0.1
    assert p.memory.total <= job.memory_bytes


def test_dry_run_table_shows_memory_headroom_and_the_warmup_cap():
    ladder = gpu_ladder(sizes=["200M"], duration={"chinchilla_multiple": 0.25})
    p = plan_size("200M", ladder)
    row = p.table_row(ladder)
    assert row["mem GiB"] == round(p.memory.total / 2**30, 2)
    assert row["headroom"] == f"{100 * (1 - p.memory.total / ladder.memory_bytes):.0f}%"
    assert p.warmup_steps == p.steps // 10 < p.uncapped_warmup
    assert row["warmup steps"] == f"{p.warmup_steps} (cap; formula {p.uncapped_warmup})"


def test_dry_run_row_has_the_shape_beta2_and_wall_clock_hours():
    """The beta2 the batch picked (it changes within a ladder), the KV heads and MLP width of
    the shape, and hours on the size's own devices."""
    ladder = gpu_ladder(sizes=["7B"])
    p = plan_size("7B", ladder)
    row = p.table_row(ladder)
    assert row["layers/d/heads/kv/mlp"] == "32/4096/32/8/14336"
    assert row["beta2"] == p.config.optim.beta2 == 0.95
    assert row["wall h"] == pytest.approx(row["device-h"] / p.devices, rel=1e-4)
    small = gpu_ladder(sizes=["200M"], batch={"coef": 2048 * 100})
    assert plan_size("200M", small).table_row(small)["beta2"] == 0.99


def test_one_peak_flops_table_for_mfu_and_device_hours():
    from trainer_core.devices import device_peak_flops

    assert device_peak_flops("NVIDIA H100 80GB HBM3") == 989e12
    assert device_peak_flops("NVIDIA H100 PCIe") == 756e12
    assert device_peak_flops("NVIDIA H100 NVL") == 835e12
    assert device_peak_flops("NVIDIA B200") == 2250e12
    assert device_peak_flops("NVIDIA L4") == 121e12 and device_peak_flops("NVIDIA A10G") == 70e12
    ladder = gpu_ladder(device_type="H100 PCIe")
    assert ladder.peak_flops == device_peak_flops("H100 PCIe")
    p = plan_size("200M", ladder)
    assert p.device_hours(ladder) == pytest.approx(p.total_flops / (756e12 * 0.4) / 3600)
    with pytest.raises(ConfigError, match="device_type: 'TPU' is not allowed"):
        gpu_ladder(device_type="TPU")


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


def test_too_few_devices_names_the_fewest_that_hold_the_size():
    """Said 'needs more than 1 devices' and never how many: it names the fewest device count
    (of those a run may use) that holds the size, past max_devices."""
    with pytest.raises(ConfigError) as err:
        plan_size("7B", gpu_ladder(sizes=["7B"], max_devices=1))
    assert str(err.value) == (
        "sizes: '7B' needs 24 devices of H100 (memory estimate, one sequence per micro-batch), "
        "more than max_devices=1; raise max_devices to 24, set "
        "run.parallel.activation_checkpointing: full, or drop this size"
    )
    assert plan_size("7B", gpu_ladder(sizes=["7B"], max_devices=24)).devices >= 24
    with pytest.raises(ConfigError, match="'7B' needs 24 devices"):
        plan_size("7B", gpu_ladder(sizes=["7B"], max_devices=16))


def test_a_sequence_no_mesh_holds_is_said_with_its_bytes_and_what_shrinks_them():
    """1B at seq_len 32768, vocab 100352, z-loss, full activation checkpointing: one sequence's
    fp32 logits alone are 61 GiB (20 bytes an entry) on every device, which more devices never
    shrink; the error said to raise max_devices and turn on the checkpointing already on."""
    run = {
        "parallel": {"activation_checkpointing": "full"},
        "train_module": {"z_loss_multiplier": 1e-5},
    }
    ladder = gpu_ladder(sizes=["1B"], seq_len=32768, max_devices=1024, run=run)
    with pytest.raises(ConfigError) as err:
        plan_size("1B", ladder)
    message = str(err.value)
    logits = 32768 * 100352 * 20 / 2**30
    assert message.startswith(
        "sizes: '1B' fits no number of H100: one sequence of 32,768 tokens takes "
    )
    assert f"logits {logits:.1f} GiB" in message and "over the 64.0 GiB usable" in message
    assert message.endswith(
        "shorten seq_len, set run.parallel.compile: true (a fused loss), use a smaller "
        "vocab_size, or drop this size"
    )
    assert "max_devices" not in message and "activation_checkpointing" not in message
    compiled = {**run, "parallel": {**run["parallel"], "compile": True}}  # the advice holds
    assert plan_size("1B", gpu_ladder(sizes=["1B"], seq_len=32768, run=compiled)).devices >= 1


def test_small_sizes_keep_min_rank_tokens_per_rank_rather_than_spread_thin():
    """A target batch of 64 sequences of 128 tokens, micro-batches that fit whole: 8 devices
    would give each rank 1,024 tokens; the floor of 2,048 allows 4. A floor above the whole
    batch leaves the fewest devices that hold the model; 0 turns it off."""

    def devices(floor: int) -> int:
        ladder = from_dict(
            LadderConfig,
            {
                "sizes": ["1M"],
                "max_devices": 8,
                "batch": {"coef": 64 * 128, "exponent": 0},
                "min_rank_tokens": floor,
            },
        )
        p = plan_size("1M", ladder)
        assert p.batch_tokens == 64 * 128
        return p.devices

    assert (devices(0), devices(2048), devices(1024), devices(10**6)) == (8, 4, 8, 1)
    with pytest.raises(ConfigError, match="min_rank_tokens: -1 is not allowed; must be >= 0"):
        from_dict(LadderConfig, {"min_rank_tokens": -1})


def test_a_gpu_ladders_small_sizes_stay_on_few_devices():
    """At seq 4096 and vocab 100352, compiled, 50M went on 40 H100s (8,192 tokens each) and 100M
    on 56: FSDP's traffic outlasted their compute. Now each rank keeps 32,768 tokens."""
    run = {"parallel": {"param_dtype": "bfloat16", "reduce_dtype": "float32", "compile": True}}
    ladder = gpu_ladder(sizes=["50M", "100M"], run=run)
    plans = plan_ladder(ladder)
    assert [p.devices for p in plans] == [8, 8]
    for p in plans:
        assert p.batch_tokens // p.dp_size >= ladder.min_rank_tokens
        assert abs(p.batch_tokens - p.target_batch_tokens) / p.target_batch_tokens <= 0.1
    spread = plan_ladder(gpu_ladder(sizes=["50M", "100M"], run=run, min_rank_tokens=0))
    assert [p.devices for p in spread] == [40, 56]


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


GQA_FAMILY = {
    "30Kgqa": {"d_model": 32, "n_layers": 3, "n_heads": 4, "n_kv_heads": 2, "mlp_hidden": 96},
    "60Kgqa": {"d_model": 48, "n_layers": 3, "n_heads": 6, "n_kv_heads": 2, "mlp_hidden": 128},
}
"""A shape family the built-in table lacks: three layers, grouped-query attention."""


def test_a_ladder_of_its_own_sizes_plans_runs_that_train_without_it(tmp_path):
    """Only the built-in table's names could be planned: a family of one's own shapes (OLMo's
    ladder sizes, grouped-query attention) meant editing the package. A ladder's size_table
    adds them; each run's config holds the dims, so the run trains and resumes on its own."""
    ladder = from_dict(
        LadderConfig,
        {
            "dir": str(tmp_path / "exp"),
            "sizes": ["15K", "30Kgqa", "60Kgqa"],
            "size_table": GQA_FAMILY,
            "duration": {"chinchilla_multiple": 0.0078125, "multiple_by_size": {"30Kgqa": 0.25}},
        },
    )
    plans = {p.size: p for p in plan_ladder(ladder)}
    builtin = plans["15K"].config.model
    assert builtin.size == "15K" and builtin.d_model == 24
    for name, dims in GQA_FAMILY.items():
        model = plans[name].config.model
        assert model.size == "" and {k: getattr(model, k) for k in dims} == dims
        assert plans[name].num_params == count_params(model)["non_embedding"]
    assert plans["30Kgqa"].chinchilla_multiple == 0.25
    assert plans["60Kgqa"].chinchilla_multiple == 0.0078125
    assert plans["15K"].num_params < plans["30Kgqa"].num_params < plans["60Kgqa"].num_params

    run = plans["60Kgqa"].config  # 5 steps
    cfg = replace(
        run,
        trainer=replace(run.trainer, run_dir=str(tmp_path / "alone")),
        checkpoint=replace(run.checkpoint, enabled=False),
    )
    summary = build_trainer(cfg, tags={"size": "60Kgqa"}).fit()
    assert math.isfinite(summary["train/loss_last"])
    record = json.loads((tmp_path / "alone" / "run.json").read_text())
    assert (record["status"], record["last_step"]) == ("finished", 5)
    assert record["size"] == "60Kgqa" and record["num_params"] == plans["60Kgqa"].num_params
    reread = load_config(TrainConfig, str(tmp_path / "alone" / "config.yaml"), [])
    assert reread.model == cfg.model


@pytest.mark.parametrize(
    "data, message",
    [
        (
            {"sizes": ["1M"], "size_table": {"1M": GQA_FAMILY["30Kgqa"]}},
            "size_table.1M: '1M' is a built-in size (SizeSpec(d_model=128, n_layers=4, n_heads=4,"
            " n_kv_heads=4, mlp_hidden=384)); give yours another name, so that one name means "
            "one shape",
        ),
        (
            {"sizes": ["x"], "size_table": {"x": {**GQA_FAMILY["30Kgqa"], "n_kv_heads": 3}}},
            "size_table.x.n_kv_heads: 3 is not allowed; must divide n_heads=4",
        ),
        (
            {"sizes": ["30Kgqa"], "size_table": {"30kgqa": GQA_FAMILY["30Kgqa"]}},
            "sizes: '30Kgqa' is not in the size table (did you mean '30kgqa'?); known sizes: ",
        ),
        (
            {"sizes": ["15K"], "duration": {"multiple_by_size": {"60Kgqa": 2.0}}},
            "duration.multiple_by_size: '60Kgqa' is not in the size table",
        ),
    ],
)
def test_a_size_table_entry_is_checked_naming_its_key(data, message):
    with pytest.raises(ConfigError) as err:
        from_dict(LadderConfig, data)
    assert str(err.value).startswith(message), str(err.value)


@pytest.mark.parametrize(
    "data, message",
    [
        ({"seq_len": 0}, "seq_len: 0 is not allowed; must be in 2 .. 2^31"),
        # 1e30 was planned, then refused as a size needing more devices
        ({"seq_len": 10**30}, "seq_len: 10000000000000000000000000000"),
        ({"vocab_size": 0}, "vocab_size: 0 is not allowed; must be in 1 .. 2^31"),
        # an empty name made the plot '-lr_schedule.png'; 'a/b' made a dir ./a for it
        ({"name": ""}, "name: '' is not allowed; must be one word of letters, digits and"),
        ({"name": "a/b"}, "name: 'a/b' is not allowed; must be one word of letters, digits"),
        ({"name": "a b"}, "name: 'a b' is not allowed; must be one word of letters, digits"),
        ({"eval_tokens": -1}, "eval_tokens: -1 is not allowed; must be >= 0"),
        ({"max_micro_batch_seqs": 0}, "max_micro_batch_seqs: 0 is not allowed; must be >= 1"),
        ({"assumed_mfu": 0.0}, "assumed_mfu: 0.0 is not allowed; must be in (0, 1]"),
        ({"device_memory_gb": 0.0}, "device_memory_gb: 0.0 is not allowed; must be > 0"),
        ({"batch": {"coef": 0.0}}, "batch.coef: 0.0 is not allowed; must be > 0"),
        ({"lr": {"coef": -1.0}}, "lr.coef: -1.0 is not allowed; must be > 0"),
        ({"lr": {"ref_params": 0.0}}, "lr.ref_params: 0.0 is not allowed; must be > 0"),
        (
            {"duration": {"tokens_per_param": 0.0}},
            "duration.tokens_per_param: 0.0 is not allowed; must be > 0",
        ),
        (
            {"duration": {"warmup_tokens_per_param": -1.0}},
            "duration.warmup_tokens_per_param: -1.0 is not allowed; must be >= 0",
        ),
        (
            {"duration": {"min_lr_ratio": 2.0}},
            "duration.min_lr_ratio: 2.0 is not allowed; must be in [0, 1]",
        ),
        ({"beta2": {"large_batch": 1.0}}, "beta2.large_batch: 1.0 is not allowed; must be in"),
        (
            {"beta2": {"large_batch_tokens": 0}},
            "beta2.large_batch_tokens: 0 is not allowed; must be >= 1",
        ),
    ],
)
def test_a_ladder_number_out_of_range_is_an_error_naming_its_key(data, message):
    """Each of these once planned on: a zero seq_len, batch coefficient or MFU divided by zero
    deep in the planner, a negative LR coefficient was reported as the LR it produced, and the
    rest were taken silently."""
    with pytest.raises(ConfigError) as err:
        from_dict(LadderConfig, data)
    assert str(err.value).startswith(message)


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


@pytest.mark.parametrize(
    "override, keys",
    [
        ("--run.optim.beta2=0.95", ("run.optim.beta2", "beta2")),
        ("--run.model.n_kv_heads=4", ("run.model.n_kv_heads", "sizes")),
        ("--run.schedule.kind=cosine", ("run.schedule", "duration")),
        ("--ray.num_workers=1", ("ray.num_workers", "max_devices")),
    ],
)
def test_a_planned_field_given_at_its_default_value_is_an_error_too(override, keys):
    """Equal to the template's default, each passed the value check and the plan replaced it
    without a word (small sizes trained with beta2 0.99 against the 0.95 given)."""
    from trainer_core.ray.ladder_run import LadderJobConfig

    template_key, ladder_key = keys
    with pytest.raises(ConfigError) as err:
        load_config(LadderJobConfig, None, [override])
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
    from trainer_core.config.loader import load_config
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


def test_gpu_ladder_says_its_shapes_as_the_size_table_has_them(repo_root):
    """The config said only the width grows from 100M to the held-out 1B, whose heads are twice
    as wide (128 dims, OLMo-core's 1B, against 64 below it)."""
    from trainer_core.ray.ladder_run import LadderJobConfig

    path = repo_root / "workflows" / "configs" / "ladder-gpu.yaml"
    job = load_config(LadderJobConfig, path)
    head_dims = {p.size: p.model.head_dim for p in plan_ladder(job)}
    assert head_dims == {"100M": 64, "200M": 64, "400M": 64, "700M": 64, "1B": 128}
    comment = " ".join(line.lstrip("# ") for line in path.read_text().splitlines())
    assert "heads of 64 dims up to 700M; the 1B is OLMo-core's, 16 heads of 128 dims" in comment
    assert "only the width grows" not in comment


def test_gpu_ladder_gives_approach_2_budgets_with_three_sizes(repo_root):
    """With every size at 4x Chinchilla no compute budget had three sizes' annealed points, so
    approach 2 could never be fitted on the shipped GPU ladder. Its planned points, scored by
    Chinchilla's law, now give isoFLOP parabolas with their minimum inside the sizes."""
    import pandas as pd

    from trainer_core.analysis.isoflop import isoflop_parabolas
    from trainer_core.analysis.load import analysis_flops
    from trainer_core.analysis.synthetic import CHINCHILLA
    from trainer_core.config.loader import load_config
    from trainer_core.ray.ladder_run import LadderJobConfig

    job = load_config(LadderJobConfig, repo_root / "workflows" / "configs" / "ladder-gpu.yaml")
    rows = []
    for p in plan_ladder(job):
        for _, end in decay_windows(p.steps, p.schedule):
            n, d = p.num_params, end * p.batch_tokens
            loss = float(CHINCHILLA.predict(n, d))
            rows.append({"size": p.size, "N": n, "flops": analysis_flops(n, d), "eval_loss": loss})
    valid = [b for b in isoflop_parabolas(pd.DataFrame(rows)) if b.valid]
    assert len(valid) >= 5


def test_plans_that_cannot_run_name_the_ladder_keys_to_change():
    """A batch above the whole run planned a 2-step run, or (1e12) searched meshes for minutes;
    a run too short for its warmup and decays named schedule.* keys a ladder can't set; equal
    decay points and an LR growing as N^5 passed."""
    with pytest.raises(
        ConfigError, match=r"^15K: a batch of [0-9,]+ tokens is more than its whole run"
    ):
        plan_size("15K", from_dict(LadderConfig, {"batch": {"coef": 1e12}}))
    short = {"chinchilla_multiple": 0.25, "decay_points": [0.0625, 0.125, 0.25, 0.5, 1.0]}
    with pytest.raises(ConfigError) as err:
        plan_size(
            "15K",
            from_dict(LadderConfig, {"batch": {"coef": 2048, "exponent": 0}, "duration": short}),
        )
    assert str(err.value).startswith("15K: its 53 steps of ") and str(err.value).endswith(
        "raise duration.chinchilla_multiple (multiple_by_size.15K), drop early "
        "duration.decay_points or lower duration.warmup_tokens_per_param; in an LR sweep, "
        "raise sweep.horizons or lower sweep.batch_factors"
    )
    with pytest.raises(ConfigError, match=r"decay_points: \[0.5, 0.5, 1.0\] .* strictly"):
        from_dict(LadderConfig, {"duration": {"decay_points": [0.5, 0.5, 1.0]}})
    with pytest.raises(ConfigError, match=r"lr.exponent: 5.0 .* must be in \[-2, 0\]"):
        from_dict(LadderConfig, {"lr": {"exponent": 5}})
    with pytest.raises(ConfigError, match=r"batch.exponent: -1.0 .* must be in \[0, 2\]"):
        from_dict(LadderConfig, {"batch": {"exponent": -1}})


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


def test_a_planned_wsds_run_gives_an_annealed_point_at_each_decay_end(tmp_path):
    """A ladder-planned WSD-S run, trained for real: a permanent eval at every decay start (peak
    LR, not annealed) and end (annealed), and the analysis fits exactly the ends."""
    from trainer_core.analysis import load
    from trainer_core.train.build import build_trainer

    ladder = from_dict(
        LadderConfig,
        {
            "dir": str(tmp_path),
            "sizes": ["15K"],
            "seq_len": 64,
            "batch": {"coef": 20480.0},
            "duration": {"chinchilla_multiple": 0.0625},
            "run": {
                "trainer": {"eval_batches": 1, "progress": False},
                "checkpoint": {"save_interval_minutes": None},
            },
        },
    )
    plan = plan_size("15K", ladder)
    windows = decay_windows(plan.steps, plan.schedule)
    assert len(windows) == 4 and windows[-1][1] == plan.steps
    build_trainer(plan.config).fit()
    points = load(tmp_path).points.set_index("step")
    starts, ends = {s for s, _ in windows}, {e for _, e in windows}
    assert set(points.index) == starts | ends
    assert set(points.index[points["annealed"]]) == ends
    assert points.loc[sorted(starts), "lr_at_step"].tolist() == pytest.approx([plan.lr] * 4)
    fitted = load(tmp_path).fit_points()
    assert sorted(fitted["step"]) == sorted(ends)
