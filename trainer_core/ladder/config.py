"""A ladder's config: the sizes, the formulas, the devices, and the ``run:`` template.

A template field the plan fills in (:data:`PLANNED`) is an error to set, so no setting is
silently replaced.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from operator import attrgetter
from typing import ClassVar

from trainer_core.config.loader import ConfigError
from trainer_core.config.sections import (
    SIZE_DIMS,
    ModelConfig,
    TrainConfig,
    require,
)
from trainer_core.config.sizes import MODEL_SIZES, SizeSpec, check_size, check_sizes
from trainer_core.devices import (
    CPU_NOMINAL_FLOPS,
    DEVICE_MEMORY_GB,
    PEAK_BF16_FLOPS,
    device_peak_flops,
    match_device,
)
from trainer_core.io import storage
from trainer_core.io.output_dir import canonical_output
from trainer_core.io.storage import Location
from trainer_core.ladder.formulas import BatchFormula, Beta2Formula, DurationFormula, LRFormula


@dataclass
class LadderConfig:
    """A model ladder: named sizes, the formulas that size everything, and the run template.

    What planning reads (sizes, sequence length, vocabulary, devices, formulas) is set here;
    every other setting of the runs is set in ``run``.
    """

    MOVED_KEYS: ClassVar[dict[str, str]] = {
        "seed": "run.trainer.seed",
        "data": "run.data",
        "tracking": "run.tracking",
        "optim": "run.optim (beta1, weight_decay) and beta2 (the batch-size rule for beta2)",
    }
    """Keys of older ladder files and where each fact lives now (named in the error)."""
    IGNORED_KEYS: ClassVar[frozenset[str]] = frozenset({"sweep"})
    """Top-level sections read past: the LR sweep's (``workflows/lr_sweep.py``, whose config is
    this one plus ``sweep:``), so one file serves the sweep and then the ladder, which plans no
    sweep. A class with a field of that name (the sweep's own) decodes it."""

    name: str = "demo"
    """Names the experiment: its W&B group, each run's W&B name (<name>-<size>), plot titles."""
    dir: str = "runs/ladder-demo"
    """Where the experiment writes (a local path or a URL): each size's run in ``<dir>/runs/``, the
    analysis in ``<dir>/analysis/``. Made absolute (``~`` expanded) once."""
    sizes: list[str] = field(default_factory=lambda: ["1M", "3M", "5M"])
    """Size-table names to train, one run each (trainer_core/config/sizes.py lists them, and
    ``size_table`` adds the ladder's own)."""
    size_table: dict[str, SizeSpec] = field(default_factory=dict)
    """Sizes of this ladder's own, beside the built-in table: name -> ``d_model``, ``n_layers``,
    ``n_heads``, ``n_kv_heads``, ``mlp_hidden`` (e.g. ``{60M: {d_model: 512, n_layers: 16,
    n_heads: 8, n_kv_heads: 8, mlp_hidden: 1408}}``), for a shape family the table lacks. Each
    run's config then holds the dims themselves, so it trains and resumes without the ladder."""
    max_devices: int = 1
    """The most devices one size's run may use (GPUs, or CPU workers); the plan picks each
    size's count up to it."""
    device_type: str = "cpu"
    """'cpu' or a GPU model (H100, A100, ...: trainer_core/devices.py): sets the peak FLOPs and
    memory the plan assumes, and whether runs take GPUs."""
    devices_per_node: int = 8
    """A run's devices are a power of two within one node, or whole nodes (the mesh keeps a TP
    group inside a node; partial nodes strand the rest)."""
    device_memory_gb: float | None = None
    """Memory per device in GiB; null = the device table's figure for device_type (80 for a GPU
    not in it)."""
    memory_fraction: float = 0.8
    """Share of each device's memory the plan may fill; the rest is headroom for what the estimate
    misses."""
    max_micro_batch_seqs: int = 64
    """Cap on the micro-batch (sequences per device per forward/backward); the plan picks the
    largest that fits in memory, up to this."""
    min_rank_tokens: int = 32768
    """Fewest tokens of the target batch each data-parallel rank gets per step: a size uses no
    more devices than that allows (the fewest that hold the model, where even they give their
    ranks fewer). FSDP's all-gathers and reduce-scatters move the whole model every step however
    few tokens a rank computes, so a small size spread thin waits on them (a 100M on 56 H100s:
    ~31 ms of compute at 40% MFU against ~37 ms of traffic at ~50 GB/s) while its device-hours
    assume ``assumed_mfu``; as OLMo-core's ladder, devices are added to remove accumulation, not
    to thin the micro-batch. 0 turns it off: the most devices that keep the batch near its
    target."""
    assumed_mfu: float = 0.4
    """For the device-hours estimate (measure it with ``--benchmark SIZE``)."""
    seq_len: int = 128
    """Tokens per training sequence, for every size."""
    vocab_size: int = 320
    """Embedding rows, at least the tokenizer's vocabulary (datasets/tokenize_corpus.py prints it)."""
    eval_tokens: int = 0
    """Tokens per evaluation, the same for every size (rounded to whole batches); 0 = the run
    template's ``trainer.eval_batches``. Equal eval sets keep the sizes' losses comparable."""
    batch: BatchFormula = field(default_factory=BatchFormula)
    lr: LRFormula = field(default_factory=LRFormula)
    duration: DurationFormula = field(default_factory=DurationFormula)
    beta2: Beta2Formula = field(default_factory=Beta2Formula)
    run: TrainConfig = field(default_factory=TrainConfig)
    """Template for every run (data, seed, optimizer, logging, eval, precision, parallelism,
    tracking...); the plan fills in the fields it sets per size, so they are left unset here."""

    @property
    def exp_dir(self) -> Location:
        return storage.as_location(self.dir)

    def _check_size_table(self) -> None:
        """Each size of ``size_table`` a new name and a model that builds, named by its key."""
        for name, spec in self.size_table.items():
            key = f"size_table.{name}"
            if name in MODEL_SIZES:
                raise ConfigError(
                    f"{key}: {name!r} is a built-in size ({MODEL_SIZES[name]}); give yours "
                    "another name, so that one name means one shape"
                )
            try:
                ModelConfig(size="", vocab_size=self.vocab_size, **asdict(spec))
            except ConfigError as e:
                raise ConfigError(f"{key}.{e}") from None

    def __post_init__(self) -> None:
        require(bool(self.dir), "dir", self.dir, "give a local path or a URL")
        self.dir = canonical_output(self.dir)
        require(bool(self.sizes), "sizes", self.sizes, "list at least one size")
        self._check_size_table()
        check_sizes(self.sizes, "sizes", self.size_table)
        for size in self.duration.multiple_by_size:
            check_size(size, "duration.multiple_by_size", self.size_table)
        require(self.max_devices >= 1, "max_devices", self.max_devices, "must be >= 1")
        require(
            self.devices_per_node >= 1, "devices_per_node", self.devices_per_node, "must be >= 1"
        )
        parallel = self.run.parallel
        require(
            parallel.dp_shard == -1,
            "run.parallel.dp_shard",
            parallel.dp_shard,
            "the ladder sizes the mesh per size: leave it -1 (every device not used by "
            "dp_replicate and tp)",
        )
        group = parallel.tp * parallel.dp_replicate
        require(
            self.devices_per_node % parallel.tp == 0,
            "run.parallel.tp",
            parallel.tp,
            f"a TP group stays inside a node: must divide devices_per_node={self.devices_per_node}",
        )
        require(
            bool(device_counts(self)),
            "max_devices",
            self.max_devices,
            f"no run fits: devices must be a multiple of dp_replicate x tp = {group} and a power "
            f"of two within a node or whole nodes of {self.devices_per_node}",
        )
        require(
            not self.uses_gpu or device_peak_flops(self.device_type) is not None,
            "device_type",
            self.device_type,
            f"use 'cpu' or a GPU of trainer_core.devices.PEAK_BF16_FLOPS ({', '.join(PEAK_BF16_FLOPS)})",
        )
        require(
            0 < self.memory_fraction <= 1,
            "memory_fraction",
            self.memory_fraction,
            "must be in (0, 1]",
        )
        require(
            self.device_memory_gb is None or self.device_memory_gb > 0,
            "device_memory_gb",
            self.device_memory_gb,
            "must be > 0 (or left unset: the device table's size)",
        )
        require(self.min_rank_tokens >= 0, "min_rank_tokens", self.min_rank_tokens, "must be >= 0")
        require(0 < self.assumed_mfu <= 1, "assumed_mfu", self.assumed_mfu, "must be in (0, 1]")
        require(
            self.max_micro_batch_seqs >= 1,
            "max_micro_batch_seqs",
            self.max_micro_batch_seqs,
            "must be >= 1",
        )
        require(
            re.fullmatch(r"[\w.+-]+", self.name) is not None,
            "name",
            self.name,
            "must be one word of letters, digits and . _ + - (it names the runs and files)",
        )
        require(2 <= self.seq_len <= MAX_COUNT, "seq_len", self.seq_len, "must be in 2 .. 2^31")
        require(
            1 <= self.vocab_size <= MAX_COUNT, "vocab_size", self.vocab_size, "must be in 1 .. 2^31"
        )
        require(
            self.eval_tokens >= 0,
            "eval_tokens",
            self.eval_tokens,
            "must be >= 0 (0: the run template's trainer.eval_batches)",
        )
        check_unplanned(self.run, TrainConfig(), self.planned(), "run.")

    def check_given(self, data: dict) -> None:
        """Refuse a planned run field the file or command line gives (``data``, as given),
        whatever its value: one equal to the template's default (``optim.beta2: 0.95``,
        ``model.n_kv_heads: 4``, a cosine schedule) passed :func:`check_unplanned` and was
        replaced by the plan without a word."""
        check_not_given(data.get("run"), self.planned(), "run.")

    def planned(self) -> dict[str, str]:
        """Every run-template field the plan fills in (dotted) -> the ladder key it comes from:
        :data:`PLANNED`, and ``trainer.eval_batches`` where ``eval_tokens`` sets it."""
        planned = dict(PLANNED)
        if self.eval_tokens:
            planned[EVAL_BATCHES] = "eval_tokens"
        return planned

    @property
    def device_gib(self) -> float:
        """Memory per device: ``device_memory_gb``, else the device table's figure."""
        return self.device_memory_gb or _lookup(DEVICE_MEMORY_GB, self.device_type, 80)

    @property
    def memory_bytes(self) -> float:
        """The usable part of it: ``memory_fraction`` of the device's memory, in bytes."""
        return self.device_gib * 2**30 * self.memory_fraction

    @property
    def peak_flops(self) -> float:
        """Per device, from the one table MFU uses too (:mod:`trainer_core.devices`)."""
        if not self.uses_gpu:
            return CPU_NOMINAL_FLOPS
        return device_peak_flops(self.device_type)

    @property
    def uses_gpu(self) -> bool:
        return self.device_type.lower() != "cpu"


MAX_COUNT = 2**31
"""A sequence length or vocabulary past this is a typo (1e30 planned as 'needs more devices')."""

EVAL_BATCHES = "trainer.eval_batches"
PLANNED = {
    **{f"model.{key}": "sizes" for key in ("size", *SIZE_DIMS)},
    "model.vocab_size": "vocab_size",
    "data.seq_len": "seq_len",
    "optim.lr": "lr",
    "optim.beta2": "beta2",
    "schedule": "duration",
    "train_module.rank_microbatch_seqs": "max_micro_batch_seqs",
    "train_module.reduce_grads_every_micro_batch": "memory_fraction",
    "trainer.run_dir": "dir",
    "trainer.global_batch_size": "batch",
    "trainer.max_steps": "duration",
    "trainer.max_tokens": "duration",
    "trainer.device": "device_type",
    "checkpoint.keep_steps": "duration.decay_points",
    "tracking.group": "name",
    "tracking.name": "name",
}
"""Each run-template field the plan fills in -> the ladder key it is planned from."""


def check_unplanned(
    template: object, default: object, planned: dict[str, str], prefix: str
) -> None:
    """Fail, naming both keys, when ``template`` sets (differs from ``default`` in) a field the
    plan fills in: the plan would replace the value without a word."""
    for key, owner in planned.items():
        if attrgetter(key)(template) != attrgetter(key)(default):
            raise unplanned_error(key, owner, prefix)


def check_not_given(given: object, planned: dict[str, str], prefix: str) -> None:
    """Fail, naming both keys, when ``given`` (a section's data as the user wrote it) holds a
    field the plan fills in, whatever its value."""
    for key, owner in planned.items():
        node = given
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            raise unplanned_error(key, owner, prefix)


def unplanned_error(key: str, owner: str, prefix: str) -> ConfigError:
    """The refusal of a planned field ``prefix + key``, naming the ladder key ``owner``."""
    return ConfigError(
        f"{prefix}{key}: the ladder plans it from {owner} for every size; "
        f"remove {prefix}{key} (or set {owner})"
    )


def _lookup(table: dict[str, float], device_type: str, default: float) -> float:
    """The entry of the model named in ``device_type`` (:func:`match_device`), else ``default``."""
    key = match_device(device_type, table)
    return default if key is None else table[key]


def device_counts(ladder: LadderConfig, up_to: int | None = None) -> list[int]:
    """Device counts a run may use, ascending: multiples of dp_replicate x tp that are a power of
    two within one node or whole nodes, up to ``max_devices`` (or ``up_to``: how many a size
    would need)."""
    most = ladder.max_devices if up_to is None else up_to
    group = ladder.run.parallel.tp * ladder.run.parallel.dp_replicate
    node = ladder.devices_per_node
    within = [2**k for k in range(node.bit_length()) if 2**k <= node and node % 2**k == 0]
    counts = set(within) | set(range(node, most + 1, node))
    return sorted(d for d in counts if d <= most and d % group == 0)
