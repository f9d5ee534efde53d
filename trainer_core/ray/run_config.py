"""Config for runs that go through Ray: the library's TrainConfig plus a ``ray`` section."""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace

from trainer_core.config.sections import TrainConfig, require
from trainer_core.parallel.mesh import DPLayout, dp_layout

READERS = ("ray_data", "worker")
RUNNERS = ("auto", "train", "trial")


@dataclass
class RayConfig:
    """Where and how wide a run goes on Ray."""

    address: str = ""
    """Ray cluster address; empty = the cluster this job was submitted to (or one found on this
    machine), else a new local Ray; "local" = always a new local Ray."""
    num_workers: int = 1
    """Ray Train workers, one rank (and device) each."""
    use_gpu: bool = False
    """Give each worker ``gpus_per_worker`` GPUs (off: CPU workers)."""
    cpus_per_worker: float = 1.0
    """On a small CPU machine leave room for Ray Data's read tasks (e.g. 0.5 with 2 workers)."""
    gpus_per_worker: float = 1.0
    """GPUs each worker reserves with use_gpu; a fraction shares a GPU between workers."""
    max_failures: int = 3
    """Restarts (from the latest checkpoint) before the run fails: of its worker group, or, with
    the "trial" runner, of its Tune trial. A ladder's or sweep's Ray Train run has both: a lost
    worker costs one of its worker group's restarts, a lost trial process (its driver or Ray
    Train controller) one of its Tune trial's, and each retried trial's worker group has them
    all again. So with N here it fails at the (N+1)th lost trial process, or at the (N+1)th lost
    worker between two of them: Tune does not retry a worker group out of restarts (nor bad
    input), which would only repeat them."""
    report_on_log: bool = False
    """Also report every log interval to Ray (a cross-worker barrier; eval and checkpoint steps always report)."""
    reader: str = "ray_data"
    """Who reads each rank's batches: "ray_data" (Ray Data read tasks stream them to the worker,
    reading off the training process) or "worker" (each worker reads its rank's rows from the
    shards itself, as the plain loop does: the same batches, no Ray Data processes, so a short
    trial starts sooner; see benchmarks/RESULTS.md, "Trial start-up"). Ray Train runs only."""
    runner: str = "auto"
    """How a ladder's or sweep's Tune trial trains its run. "train": on a Ray Train worker group
    (any width, Ray Data, restarts of the worker group inside the trial). "trial": the trial's
    own process is the run's one worker, reading its own rows, and goes on to the next trial; no
    Ray Train processes, so a trial takes its first step 10-25 s sooner on 2 cores (1-2 s after
    the trial before, in a reused process), and Tune restarts a failed trial, which resumes
    from the run's latest complete checkpoint. "auto": "trial" for a sweep's one-device trials
    (many short runs: start-up dominates), "train" for everything else."""

    max_concurrent_trials: int = 0
    """A ladder's or sweep's trials at once. 0: as many as the cluster's CPUs and GPUs hold when
    it launches, sized once (kept by --resume): an autoscaling cluster that starts without GPU
    nodes (cluster.yaml's min_workers: 0) holds one, so its trials would run one after another:
    set it to what the cluster scales to."""

    def __post_init__(self) -> None:
        require(self.num_workers >= 1, "num_workers", self.num_workers, "must be >= 1")
        require(
            self.max_concurrent_trials >= 0,
            "max_concurrent_trials",
            self.max_concurrent_trials,
            "must be >= 0 (0 = as many as the cluster holds at launch)",
        )
        require(self.cpus_per_worker > 0, "cpus_per_worker", self.cpus_per_worker, "must be > 0")
        require(self.gpus_per_worker > 0, "gpus_per_worker", self.gpus_per_worker, "must be > 0")
        require(
            self.reader in READERS, "reader", self.reader, f"must be one of {', '.join(READERS)}"
        )
        require(
            self.runner in RUNNERS, "runner", self.runner, f"must be one of {', '.join(RUNNERS)}"
        )
        require(
            self.runner != "trial" or self.num_workers == 1,
            "runner",
            self.runner,
            f"'trial' trains a run's one worker in its Tune trial's process, and this run has "
            f"{self.num_workers} workers: use 'train' (or 'auto')",
        )
        require(
            self.max_failures >= -1,
            "max_failures",
            self.max_failures,
            "must be >= -1 (-1 = forever)",
        )

    def for_trials(self, sweep: bool) -> RayConfig:
        """This config with ``runner`` decided for one run of a ladder or sweep (``auto``
        resolved by what the trials are: :attr:`runner`)."""
        if self.runner != "auto":
            return self
        one_device = self.num_workers == 1
        return replace(self, runner="trial" if sweep and one_device else "train")


@dataclass
class RayTrainConfig(TrainConfig):
    ray: RayConfig = field(default_factory=RayConfig)

    def __post_init__(self) -> None:
        super().__post_init__()
        self.check_dp_split(self.layout().dp_size)
        # here, not only where the workers build the model: that was 35 s into a Ray run
        self.model.check_tensor_parallel(self.parallel.tp)

    def layout(self, rank: int = 0) -> DPLayout:
        """World rank ``rank``'s place among ``ray.num_workers`` workers (the one DP rule)."""
        return dp_layout(self.parallel, self.ray.num_workers, rank)

    @classmethod
    def of(cls, cfg: TrainConfig, ray: RayConfig) -> RayTrainConfig:
        """``cfg``'s sections (shared, not copied) with ``ray``."""
        return cls(**{f.name: getattr(cfg, f.name) for f in fields(TrainConfig)}, ray=ray)
