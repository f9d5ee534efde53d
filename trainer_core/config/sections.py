"""The typed configuration of one training run.

Each section is a dataclass that validates itself in ``__post_init__`` and raises
:class:`ConfigError` naming the field; :class:`TrainConfig` checks the rules that span sections
(batch divisible by micro-batch, warmup shorter than the run). Load with
:func:`trainer_core.config.loader.load_config`; dump with :func:`trainer_core.config.loader.to_yaml`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

from trainer_core.config.loader import ConfigError
from trainer_core.config.sizes import MODEL_SIZES, check_size
from trainer_core.io import storage
from trainer_core.io.output_dir import canonical_output


def require(ok: bool, name: str, value: object, allowed: str) -> None:
    """Raise a ConfigError ``"<name>: <value> is not allowed; <allowed>"`` unless ``ok``."""
    if not ok:
        raise ConfigError(f"{name}: {value!r} is not allowed; {allowed}")


SIZE_DIMS = ("d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden")
"""The dims a ``size`` sets."""


@dataclass
class ModelConfig:
    """Decoder-only transformer (Llama / OLMo-2 family).

    ``size`` picks dims from the size table; any dim set explicitly wins over the table.
    """

    size: str = "1M"
    """A size-table name that sets every dim left 0; "" = no table (set the dims yourself)."""
    d_model: int = 0
    """Residual stream width; 0 = the size table's."""
    n_layers: int = 0
    """Transformer blocks; 0 = the size table's."""
    n_heads: int = 0
    """Query heads (head dim d_model / n_heads, even for RoPE); 0 = the size table's."""
    n_kv_heads: int = 0
    """Key/value heads, dividing n_heads (fewer: grouped-query attention); 0 = the size
    table's, or n_heads without a size."""
    mlp_hidden: int = 0
    """SwiGLU MLP hidden width; 0 = the size table's."""
    vocab_size: int = 320
    """Embedding rows: at least the tokenizer's vocabulary (the byte tokenizer's is 259)."""
    qk_norm: bool = True
    """RMSNorm each head's queries and keys before attention (OLMo-2)."""
    tie_embeddings: bool = False
    """Share one matrix between the input embedding and the output head."""
    rope_theta: float = 10_000.0
    """RoPE base frequency; larger suits longer sequences."""
    norm_eps: float = 1e-6
    """Epsilon of every RMSNorm."""
    init_std: float = 0.02
    """Std of the truncated-normal init; residual output layers are scaled by 1/sqrt(2 n_layers)."""
    attention_backend: Literal["auto", "flash", "cudnn", "efficient", "math"] = "auto"
    """The ``scaled_dot_product_attention`` kernel. "auto" lets torch choose; naming one forces
    it, so a run that cannot use it fails at start instead of quietly falling back to a slower
    kernel. CPU has "flash" and "math"; "flash" and "cudnn" on a GPU need 16-bit compute."""

    def __post_init__(self) -> None:
        if self.size:
            check_size(self.size, "size")
            spec = MODEL_SIZES[self.size]
            for name in SIZE_DIMS:
                if getattr(self, name) == 0:
                    setattr(self, name, getattr(spec, name))
        for name in ("d_model", "n_layers", "n_heads", "mlp_hidden"):
            require(getattr(self, name) > 0, name, getattr(self, name), "must be > 0 (or set size)")
        require(self.vocab_size > 0, "vocab_size", self.vocab_size, "must be > 0")
        require(self.n_kv_heads >= 0, "n_kv_heads", self.n_kv_heads, "must be >= 0 (0 = n_heads)")
        for name in ("rope_theta", "init_std"):
            require(getattr(self, name) > 0, name, getattr(self, name), "must be > 0")
        require(self.norm_eps >= 0, "norm_eps", self.norm_eps, "must be >= 0")
        if self.n_kv_heads == 0:
            self.n_kv_heads = self.n_heads
        require(
            self.d_model % self.n_heads == 0,
            "n_heads",
            self.n_heads,
            f"must divide d_model={self.d_model}",
        )
        require(
            self.n_heads % self.n_kv_heads == 0,
            "n_kv_heads",
            self.n_kv_heads,
            f"must divide n_heads={self.n_heads}",
        )
        require(
            (self.d_model // self.n_heads) % 2 == 0,
            "n_heads",
            self.n_heads,
            "head dim must be even for RoPE",
        )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def check_tensor_parallel(self, tp: int) -> None:
        """TP splits attention by heads and the MLP by hidden units; each rank needs whole ones."""
        for name in ("n_heads", "n_kv_heads", "mlp_hidden"):
            count = getattr(self, name)
            if count % tp:
                raise ConfigError(
                    f"parallel.tp: {tp} does not divide model.{name}={count}; pick a tp that does"
                )


@dataclass
class OptimConfig:
    """AdamW. ``lr`` is the peak learning rate the schedule scales."""

    lr: float = 3e-3
    """Peak learning rate (the schedule multiplies it)."""
    beta1: float = 0.9
    """AdamW's first-moment decay."""
    beta2: float = 0.95
    """AdamW's second-moment decay."""
    eps: float = 1e-8
    """AdamW's denominator epsilon."""
    weight_decay: float = 0.1
    """Decoupled weight decay on the weight matrices (0 = none)."""
    decay_norms_and_biases: bool = False
    """Also decay norm gains and biases (1-D parameters)."""
    decay_embeddings: bool = False
    """Also decay the input embedding."""
    fused: bool | None = None
    """Fused AdamW kernel; null = on CUDA (unless TP mixes plain and sharded tensors), else off."""

    def __post_init__(self) -> None:
        require(self.lr > 0, "lr", self.lr, "must be > 0")
        require(0 <= self.beta1 < 1, "beta1", self.beta1, "must be in [0, 1)")
        require(0 <= self.beta2 < 1, "beta2", self.beta2, "must be in [0, 1)")
        require(self.eps > 0, "eps", self.eps, "must be > 0")
        require(self.weight_decay >= 0, "weight_decay", self.weight_decay, "must be >= 0")


ScheduleKind = Literal["constant", "linear", "cosine", "inv_sqrt", "inv", "wsd"]


@dataclass
class ScheduleConfig:
    """Learning-rate schedule with Levanter's semantics.

    Lengths (``warmup``, ``decay``, ``rewarmup``) are a fraction of the cycle when < 1, else steps.
    ``cycles`` (a count, or the list of steps where cycles end) and ``cycle_length`` (steps,
    a fraction, or a list of lengths) split the run into repeated warmup-stable-decay cycles.
    """

    kind: ScheduleKind = "cosine"
    """Decay shape; "wsd" decays linearly over the last fifth of each cycle (or decay),
    "constant" not at all."""
    warmup: float = 0.01
    """Linear warmup from 0 to the peak: a fraction of the first cycle if < 1, else steps."""
    decay: float | None = None
    """Decay length (fraction if < 1, else steps); null = all of the cycle after warmup (wsd:
    its last fifth)."""
    min_lr_ratio: float = 0.1
    """Where each decay ends, as a fraction of the peak LR."""
    rewarmup: float = 0.0
    """Warmup of every cycle after the first (fraction if < 1, else steps); 0 = jump back to the
    peak (WSD-S)."""
    cycles: int | list[int] | None = None
    """A count of equal cycles, or the steps where cycles end; null = one cycle (or cycle_length)."""
    cycle_length: int | float | list[int] | None = None
    """Cycle length in steps (a fraction of the run if < 1), or a list of lengths; null = cycles."""

    def __post_init__(self) -> None:
        require(self.warmup >= 0, "warmup", self.warmup, "must be >= 0 (fraction < 1 or steps)")
        require(self.decay is None or self.decay >= 0, "decay", self.decay, "must be >= 0 or null")
        require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio", self.min_lr_ratio, "must be in [0, 1]")
        require(self.rewarmup >= 0, "rewarmup", self.rewarmup, "must be >= 0")
        require(
            self.cycles is None or self.cycle_length is None,
            "cycle_length",
            self.cycle_length,
            "set either cycles or cycle_length, not both",
        )


@dataclass
class TrainModuleConfig:
    """How one batch becomes gradients: micro-batching, precision, loss extras, clipping."""

    rank_microbatch_seqs: int = 0
    """Sequences per rank per forward/backward; 0 = the whole rank batch at once. Sequences,
    not tokens, everywhere (the ladder plans them): a micro-batch is whole rows of the batch."""
    max_grad_norm: float | None = 1.0
    """Clip the global gradient L2 norm to this; null = no clipping (the norm is still logged)."""
    z_loss_multiplier: float | None = None
    """Weight of the z-loss (logsumexp of the logits, squared) added to the loss; null = none."""
    autocast_precision: Literal["bf16"] | None = None
    """bf16 autocast whatever the layout (None: as ``parallel.param_dtype`` says). No fp16: the
    loss is divided by the global batch's tokens before backward, so without loss scaling the
    logits' gradients (~1e-11 at a 1M-token batch) fall below fp16's range and vanish."""
    label_ignore_index: int = -100
    """Label id left out of the loss and token counts."""
    reduce_grads_every_micro_batch: bool = False
    """Reduce-scatter gradients after every micro-batch instead of only the last: more traffic,
    but FSDP never holds a full unsharded copy of the gradients (the planner turns it on where
    that copy would not fit)."""

    def __post_init__(self) -> None:
        require(
            self.rank_microbatch_seqs >= 0,
            "rank_microbatch_seqs",
            self.rank_microbatch_seqs,
            "must be >= 0",
        )
        require(
            self.max_grad_norm is None or self.max_grad_norm > 0,
            "max_grad_norm",
            self.max_grad_norm,
            "must be > 0 or null",
        )
        require(
            self.z_loss_multiplier is None or self.z_loss_multiplier >= 0,
            "z_loss_multiplier",
            self.z_loss_multiplier,
            "must be >= 0 or null",
        )


@dataclass
class ParallelConfig:
    """Device mesh (data-parallel replicate x shard x tensor-parallel) and model wrapping."""

    dp_replicate: int = 1
    """Data-parallel replica groups (HSDP: sharded within a group, replicated across groups);
    1 = plain FSDP."""
    dp_shard: int = -1
    """-1: every rank not used by dp_replicate and tp."""
    tp: int = 1
    """Tensor-parallel degree: devices that split each layer by heads and hidden units."""
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    """Compute dtype: "bfloat16" = bf16 compute over fp32 master weights (FSDP's policy, or
    autocast where nothing shards)."""
    reduce_dtype: Literal["float32", "bfloat16"] = "float32"
    """Dtype FSDP reduces gradients in across data-parallel ranks."""
    activation_checkpointing: Literal["none", "full", "every_k"] = "none"
    """Recompute block activations in backward to save memory: every block ("full") or every
    ac_every_k-th ("every_k")."""
    ac_every_k: int = 2
    """With activation_checkpointing "every_k": checkpoint every k-th block."""
    compile: bool = False
    """torch.compile each block and the LM head with its loss."""
    float8: Literal["none", "tensorwise", "rowwise"] = "none"
    """torchao float8 training of the blocks' linear layers (embedding and LM head stay bf16):
    a GPU of compute capability 8.9+ (9.0+ for rowwise) and ``pip install -e '.[gpu]'``."""
    float8_emulate: bool = False
    """Run float8 casts with fp32 matmuls instead of float8 kernels: no GPU needed, no speed-up
    (tests and debugging)."""

    def __post_init__(self) -> None:
        require(self.dp_replicate >= 1, "dp_replicate", self.dp_replicate, "must be >= 1")
        require(
            self.dp_shard == -1 or self.dp_shard >= 1,
            "dp_shard",
            self.dp_shard,
            "must be >= 1 or -1",
        )
        require(self.tp >= 1, "tp", self.tp, "must be >= 1")
        require(self.ac_every_k >= 1, "ac_every_k", self.ac_every_k, "must be >= 1")
        if self.float8 != "none":
            require(
                self.param_dtype == "bfloat16",
                "float8",
                self.float8,
                "float8 matmuls run inside bf16 training: set parallel.param_dtype=bfloat16",
            )
            require(
                self.tp == 1,
                "float8",
                self.float8,
                "float8 with tensor parallel is not supported: set parallel.tp=1 or "
                "parallel.float8=none",
            )


@dataclass
class DataConfig:
    """Token shards to train on and how they are cut into sequences."""

    shards: str = ""
    """A directory holding manifest.json; empty = the built-in demo corpus (Python stdlib)."""
    mix: str = ""
    """A YAML file of {shard dir: weight}; overrides ``shards``."""
    seq_len: int = 128
    """Tokens per training sequence."""
    tokenizer: str = "byte"
    """Tokenizer for the demo corpus: 'byte', a local tokenizer.json or a dir holding one. With
    shards/mix, a non-default value must be the tokenizer the shards were made with."""
    verify_checksums: bool = False
    """Also check every shard's whole-file sha256 when opening (reads all data once). Sizes are
    always checked, and so is each parquet page's checksum as it is read."""

    def __post_init__(self) -> None:
        require(self.seq_len >= 2, "seq_len", self.seq_len, "must be >= 2")


@dataclass
class KeepRule:
    """Keep a permanent checkpoint every ``every`` steps, up to ``until`` (null = forever)."""

    every: int
    """Steps between permanent checkpoints."""
    until: int | None = None
    """Last step this rule covers; null = to the end (the first matching rule decides)."""

    def __post_init__(self) -> None:
        require(self.every >= 1, "every", self.every, "must be >= 1")


@dataclass
class CheckpointConfig:
    """Levanter-style policy: temporary checkpoints by time/steps + permanent ones by rules."""

    enabled: bool = True
    """False: no checkpoints at all (a rerun starts over)."""
    save_interval_steps: int | None = None
    """A temporary checkpoint (deleted at the next save) every N steps; null = by minutes alone."""
    save_interval_minutes: float | None = 15.0
    """Checked on log steps (trainer.log_interval), where the ranks meet anyway: a save comes at
    the first log step past the interval."""
    keep: list[KeepRule] = field(default_factory=list)
    """Permanent-checkpoint rules ({every: N, until: STEP}), the first matching one deciding."""
    keep_steps: list[int] = field(default_factory=list)
    """Steps that always save a permanent checkpoint."""
    save_final: bool = True
    """Save a permanent checkpoint at the last step."""
    async_save: bool = False
    """Write checkpoints in the background once staged in CPU memory (training goes on)."""
    resume_from: str = ""
    """A checkpoint dir to start from; empty = the latest complete one in the run dir, if any."""
    on_corrupt: Literal["fallback", "fail"] = "fallback"
    """A latest checkpoint whose files fail their checksums: set it aside and resume from the one
    before ("fallback"), or stop naming the file and change nothing ("fail")."""

    def __post_init__(self) -> None:
        require(
            self.save_interval_steps is None or self.save_interval_steps >= 1,
            "save_interval_steps",
            self.save_interval_steps,
            "must be >= 1 or null",
        )
        require(
            self.save_interval_minutes is None or self.save_interval_minutes > 0,
            "save_interval_minutes",
            self.save_interval_minutes,
            "must be > 0 or null",
        )


@dataclass
class TrackingConfig:
    """W&B tracking (offline by default: files in the run dir, ``wandb sync`` later)."""

    wandb: bool = False
    """Log to Weights & Biases (needs the wandb package)."""
    project: str = "rayladder"
    """W&B project."""
    group: str = ""
    """W&B group; empty = none."""
    name: str = ""
    """W&B run name; empty = the run dir's name."""
    entity: str = ""
    """W&B team or user; empty = your default entity."""
    tags: list[str] = field(default_factory=list)
    """W&B tags."""
    mode: Literal["offline", "online", "disabled"] = "offline"
    """W&B mode: "offline" writes files to sync later (wandb sync); "online" needs an API key
    (else offline); "disabled" logs nothing."""


@dataclass
class TrainerConfig:
    """The loop: duration, batch, logging, evaluation, where outputs go."""

    run_dir: str = "runs/demo"
    """Where this run writes its checkpoints, metrics and logs: a local path or a URL. Made
    absolute (``~`` expanded) once, so every process reads the same location."""
    seed: int = 0
    """Seeds the model's init and the data order."""
    global_batch_size: int = 2048
    """Tokens per optimizer step across all data-parallel ranks."""
    max_steps: int | None = 200
    """Duration in optimizer steps; set it null to use max_tokens."""
    max_tokens: int | None = None
    """Duration in tokens; converted to steps (rounded up). Use instead of max_steps."""
    log_interval: int = 10
    """Steps between metric lines (console, metrics.jsonl, W&B)."""
    eval_interval: int = 50
    """Steps between evaluations (also the last step)."""
    eval_batches: int = 4
    """Validation batches per evaluation, the same ones each time; 0 = no validation loss."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to train: "auto" = CUDA if present, else CPU."""
    peak_flops_per_device: float | None = None
    """For MFU; null = a GPU's table figure, or a CPU's matmul speed measured once a process
    (raised by a faster logging window, so MFU stays at most 1)."""
    progress: bool = True
    """Print a line per log interval to the console (losses, LR, throughput, ETA)."""

    def __post_init__(self) -> None:
        require(bool(self.run_dir), "run_dir", self.run_dir, "give a local path or a URL")
        self.run_dir = canonical_output(self.run_dir)
        require(
            self.global_batch_size >= 1, "global_batch_size", self.global_batch_size, "must be >= 1"
        )
        require(
            (self.max_steps is None) != (self.max_tokens is None),
            "max_steps",
            self.max_steps,
            "set exactly one of max_steps and max_tokens"
            + (
                f"; max_steps defaults to {TrainerConfig.max_steps}: add "
                "--trainer.max_steps=null (max_steps: null in a file)"
                if self.max_tokens is not None
                else ""
            ),
        )
        for name in ("max_steps", "max_tokens"):
            value = getattr(self, name)
            require(value is None or value >= 1, name, value, "must be >= 1")
        for name in ("log_interval", "eval_interval"):
            require(getattr(self, name) >= 1, name, getattr(self, name), "must be >= 1")
        require(
            self.eval_batches >= 0, "eval_batches", self.eval_batches, "must be >= 0 (0 = no evals)"
        )
        require(
            self.peak_flops_per_device is None or self.peak_flops_per_device > 0,
            "peak_flops_per_device",
            self.peak_flops_per_device,
            "must be > 0 or null (null: the device table's figure)",
        )

    @property
    def run_location(self) -> storage.Location:
        return storage.as_location(self.run_dir)


@dataclass
class EvalConfig:
    """Downstream multiple-choice tasks scored at every eval (docs/tasks.md has the format)."""

    tasks: list[str] = field(default_factory=list)
    """JSONL task files, or built-in names ('demo_next_line': built beside the demo shards)."""
    max_examples: int = 0
    """Score only the first N examples of each task; 0 = all of them."""

    def __post_init__(self) -> None:
        require(self.max_examples >= 0, "max_examples", self.max_examples, "must be >= 0 (0 = all)")
        for task in self.tasks:
            require(
                isinstance(task, str) and bool(task), "evals.tasks", task, "list non-empty strings"
            )


@dataclass
class TrainConfig:
    """Everything one training run needs."""

    FOREIGN_KEYS: ClassVar[dict[str, str]] = {
        "ray": "this entry point trains without Ray; the ray section is read by "
        "workflows/train.py: run that, or delete the section from the file"
    }
    """Sections of another entry point's config (train-tiny.yaml, a ladder run's config.yaml)
    and what to do, named in the error instead of the allowed keys."""

    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train_module: TrainModuleConfig = field(default_factory=TrainModuleConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    tracking: TrackingConfig = field(default_factory=TrackingConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    evals: EvalConfig = field(default_factory=EvalConfig)

    def __post_init__(self) -> None:
        seq_len = self.data.seq_len
        batch = self.trainer.global_batch_size
        require(
            batch % seq_len == 0,
            "trainer.global_batch_size",
            batch,
            f"must be a multiple of data.seq_len={seq_len} (it counts tokens)",
        )
        self.check_dp_split(1)
        steps = self.total_steps
        warmup = self.schedule.warmup
        require(
            warmup < 1 or warmup < steps,
            "schedule.warmup",
            warmup,
            f"warmup must be shorter than the run ({steps} steps)",
        )

    def check_dp_split(self, dp_size: int) -> None:
        """The batch splits into whole micro-batches on each of ``dp_size`` data-parallel ranks
        (checked where the world size is known: a Ray config, or the trainer at start)."""
        batch = self.trainer.global_batch_size
        seqs = self.batch_seqs
        require(
            seqs % dp_size == 0,
            "trainer.global_batch_size",
            batch,
            f"its {seqs} sequences can't be split evenly over {dp_size} data-parallel ranks",
        )
        micro = self.train_module.rank_microbatch_seqs
        ranks = f"each of the {dp_size} data-parallel ranks gets" if dp_size > 1 else "it has"
        require(
            not micro or seqs // dp_size % micro == 0,
            "trainer.global_batch_size",
            batch,
            f"{ranks} {seqs // dp_size} sequences, not a multiple of "
            f"train_module.rank_microbatch_seqs={micro}",
        )
        # The weight gradient's float8 matmul runs over the micro-batch's tokens, which
        # _scaled_mm needs in multiples of 16. Emulated float8 (CPU) takes any count but is
        # refused alike, so a config checked on CPU runs on the GPU it stands in for.
        seq_len, micro_seqs = self.data.seq_len, micro or seqs // dp_size
        require(
            self.parallel.float8 == "none" or micro_seqs * seq_len % 16 == 0,
            "parallel.float8",
            self.parallel.float8,
            "a float8 backward needs each micro-batch's tokens in multiples of 16, not "
            f"{micro_seqs} x data.seq_len={seq_len} = {micro_seqs * seq_len}: make data.seq_len "
            "a multiple of 16",
        )

    @property
    def windows_read(self) -> tuple[int, int]:
        """The sequences the run reads: over its training, and at each evaluation."""
        return self.total_steps * self.batch_seqs, self.trainer.eval_batches * self.batch_seqs

    @property
    def run_name(self) -> str:
        """What the run is called in its record, its lines and W&B: the tracking name, else its
        dir's."""
        return self.tracking.name or storage.name(self.trainer.run_dir)

    @property
    def batch_seqs(self) -> int:
        """Sequences per optimizer step: the global batch counts tokens, the data yields rows."""
        return self.trainer.global_batch_size // self.data.seq_len

    @property
    def total_steps(self) -> int:
        if self.trainer.max_steps is not None:
            return self.trainer.max_steps
        return -(-self.trainer.max_tokens // self.trainer.global_batch_size)
