"""``make gpu-check`` on a machine without CUDA, its parts that run anywhere, the ``cuda``
marker that keeps the GPU tests out of a CPU run (collected there, not skipped), and the check
on a bare GPU machine's Python, which lacks Ray, torchao, zstandard and draccus."""

from __future__ import annotations

import importlib.metadata
import json
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
import torch
from scripts import load_script

from trainer_core.config.loader import load_config
from trainer_core.ladder.plan import plan_ladder
from trainer_core.ray.ladder_run import LadderJobConfig, ladder_trials

GPU_TESTS = {
    "test_bf16_tracks_fp32_over_50_steps",
    "test_compile_matches_eager[fp32-0.001]",
    "test_compile_matches_eager[bf16-0.05]",
    "test_float8_tracks_bf16_over_50_steps[tensorwise]",
    "test_float8_tracks_bf16_over_50_steps[rowwise]",
    *(
        f"test_the_attention_backend_that_ran[{b}-{kv}]"
        for b in ("flash", "cudnn", "efficient", "math", "auto")
        for kv in (4, 2)  # key/value heads of 4: plain and grouped-query attention
    ),
    "test_checkpoint_save_and_resume_on_gpu",
    "test_a_gpu_runs_checkpoint_keeps_its_devices_cuda_generator",
    "test_steps_between_log_steps_make_no_host_sync_on_cuda",
    "test_the_cuda_group_takes_device_tensors_and_objects",
}
"""What the issue asks of the GPU tests, by name."""


@pytest.fixture
def gpu_check():
    """benchmarks/gpu_check.py as a module."""
    return load_script("benchmarks/gpu_check.py")


def test_without_cuda_it_says_so_in_one_line_and_fails(run_script, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, out, err = run_script("benchmarks/gpu_check.py")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); "
        "run make gpu-check on a GPU machine"
    ]


FAKE_CUDA = """import torch

torch.cuda.is_available = lambda: True


def pytest_collection_finish(session):
    unmarked = [i.nodeid for i in session.items if i.get_closest_marker("cuda") is None]
    print("not marked cuda:", unmarked)
"""
"""A plugin, loaded before any conftest: ``torch.cuda`` claims a GPU, and the collection ends
with the tests not marked ``cuda``."""


def collected(processes, tmp_path, fake_cuda: bool) -> tuple[int, set[str], str]:
    """``pytest --collect-only`` of tests/cuda in a fresh process, with :data:`FAKE_CUDA` when
    ``fake_cuda`` (else ``-m cuda``): its exit code, test ids and output."""
    (tmp_path / "fake_cuda.py").write_text(FAKE_CUDA)
    plugin = ("-p", "fake_cuda") if fake_cuda else ("-m", "cuda")
    out = processes.python(
        *("-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *plugin),
        "tests/cuda",
        env={"PYTHONPATH": str(tmp_path)},
    )
    ids = set(re.findall(r"^tests/cuda/test_gpu_training\.py::(\S+)$", out.stdout, re.M))
    return out.returncode, ids, out.stdout


@pytest.mark.slow
def test_cuda_tests_are_collected_only_where_cuda_is(processes, tmp_path):
    """Without CUDA nothing in tests/cuda is collected (pytest's exit code 5: no tests), so
    nothing is skipped; with CUDA every test the issue names is there, all marked cuda."""
    code, ids, _ = collected(processes, tmp_path, fake_cuda=False)
    assert (code, ids) == (5, set())
    code, ids, out = collected(processes, tmp_path, fake_cuda=True)
    assert code == 0 and ids == GPU_TESTS
    assert "not marked cuda: []" in out.splitlines(), out[-2000:]


@pytest.mark.slow
def test_a_benchmark_check_reads_the_train_step_figures(gpu_check, tmp_path):
    """The benchmark part on CPU with a 1M model and emulated float8: the figures come through
    and the target (76.8k tokens/s) is judged, beside the Trainer loop's figures and the step's
    time by kernel family; a setting the device can't run fails naming why."""
    small = ("--size", "1M", "--seq-len", "32", "--batch-seqs", "2", "--steps", "1")
    args = (*small, "--warmup", "1", "--precision", "bf16", "--device", "cpu", "--profile")
    env = {**gpu_check.os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    check = gpu_check.benchmark("tensorwise", env, (*args, "--float8-emulate"))
    assert check.name == "train step bf16 + float8 tensorwise" and not check.passed
    assert re.fullmatch(
        r"[\d,]+ tokens/s per GPU \(target 76,800\), MFU [\d.]+%, peak memory n/a \(estimate "
        r"[\d.]+ GiB\), attention flash, cpu; Trainer loop [\d,]+ tokens/s, MFU [\d.]+%; "
        r"step time ([a-z ()]+ \d+%, )*matmuls \d+%(, [a-z ()]+ \d+%)*",
        check.detail,
    ), check.detail
    refused = gpu_check.benchmark("rowwise", env, args)
    assert not refused.passed
    assert refused.detail.startswith("error: parallel.float8: 'rowwise' needs a CUDA GPU")
    table = gpu_check.summary([check, refused]).splitlines()
    assert table[0].split() == ["check", "result", "detail"]
    assert [re.search(r" (PASS|FAIL) ", row)[1] for row in table[1:]] == ["FAIL", "FAIL"]


def test_a_tuning_run_can_skip_the_trainer_loop(processes):
    """``--bare-only``: the bare step's figures alone, in half the time (a GPU tuning sweep),
    here of a step with activation checkpointing (the H200's AC rows in RESULTS.md), and where
    its time went (``--profile``)."""
    small = ("--size", "1M", "--seq-len", "32", "--batch-seqs", "2", "--steps", "1")
    ac = ("--activation-checkpointing", "every_k")
    out = processes.python(
        "benchmarks/train_step.py", *small, *ac, "--bare-only", "--profile", "--json"
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["tokens_per_s"] > 0 and result["batch"] == "2x32 (micro 2)"
    assert result["activation_checkpointing"] == "every_k"
    assert "loop_tokens_per_s" not in result
    families, wall = result["profile"]["families_ms"], result["profile"]["wall_ms"]
    assert families["matmuls"] > 0 and families["attention"] > 0 and families["optimizer"] > 0
    assert sum(families.values()) <= 1.05 * wall, (families, wall)


@pytest.mark.parametrize(
    "kernel, family",
    [  # names from the H200's profile of the 1B step (RESULTS.md, stop 53)
        ("nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_NTN", "matmuls"),
        (
            "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x4x1",
            "attention",
        ),
        ("triton_poi_fused__unsafe_view_mul_silu_silu_backward_view_2", "fused (compiled)"),
        (
            "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedOpti",
            "optimizer",
        ),
        ("void at::native::vectorized_elementwise_kernel<4, CUDAFunctor_add<float>>", "other"),
        ("aten::addmm", "matmuls"),
        ("## Call CompiledFxGraph fwl5b6fds4itwvfzlnbwewyvigbqd2uwlzfs ##", "fused (compiled)"),
    ],
)
def test_a_kernel_is_counted_in_its_family(kernel, family):
    """cuDNN's attention kernels name a matmul instruction (wgmma) and must count as
    attention; the accumulation adds stay "other"."""
    assert load_script("benchmarks/train_step.py").kernel_family(kernel) == family


def test_one_device_can_take_bf16_from_fsdp2_instead_of_autocast(processes):
    """``--one-rank-fsdp``: the step FSDP2 runs on a one-rank mesh, bf16 from its mixed-precision
    policy (the H200 comparison in RESULTS.md), as the built module shows."""
    small = ("--size", "1M", "--seq-len", "32", "--batch-seqs", "2", "--steps", "1")
    out = processes.python(
        "benchmarks/train_step.py", *small, "--precision", "bf16", "--one-rank-fsdp", "--json"
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["bf16_from"] == "FSDP2 policy" and result["tokens_per_s"] > 0
    assert "loop_tokens_per_s" not in result


def test_the_tiny_gpu_ladder_plans_one_gpu_per_run(gpu_check, tmp_path):
    path = tmp_path / "ladder.yaml"
    path.write_text(gpu_check.yaml.safe_dump(gpu_check.ladder_config(tmp_path / "exp", "H100")))
    job = load_config(LadderJobConfig, path)
    trials = ladder_trials(job, plan_ladder(job))
    assert sorted(t.name for t in trials) == ["1M", "3M"]
    for trial in trials:
        assert (trial.config.ray.use_gpu, trial.config.ray.num_workers) == (True, 1)
        assert trial.config.trainer.device == "cuda"
        assert trial.config.trainer.run_dir.startswith(str(tmp_path / "exp"))


ABSENT = (
    *("ray", "torchao", "zstandard", "draccus", "mergedeep", "toml", "wandb", "s3fs"),
    "pytest_timeout",
)
BARE_PYTHON = f"""
import runpy, sys
from pathlib import Path

class Absent:
    \"\"\"A bare GPU machine's python3: these packages are not installed, unless a copy was
    carried to a site folder (gpu_check's ``--wheels DIR/site``).\"\"\"

    def find_spec(self, name, path=None, target=None):
        top = name.split(".")[0]
        carried = any(
            Path(p, top).exists() or Path(p, top + ".py").exists()
            for p in sys.path
            if p.endswith("site")
        )
        if top in {ABSENT!r} and not carried:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)

sys.meta_path.insert(0, Absent())
sys.argv = ["benchmarks/gpu_check.py", *sys.argv[1:]]
runpy.run_path("benchmarks/gpu_check.py", run_name="__main__")
"""
"""``python -c BARE_PYTHON ARGS``: gpu_check.py with the packages a bare GPU machine lacks
hidden from this venv."""
CARRIED = ("draccus", "mergedeep", "toml", "zstandard", "torchao", "pytest-timeout")
"""What ``make gpu-wheels`` carries (its ``GPU_WHEELS``)."""

NO_CUDA = (
    "gpu-check: no CUDA device on this machine (torch.cuda.is_available() is False); "
    "run make gpu-check on a GPU machine"
)


@pytest.mark.slow
@pytest.mark.parametrize(
    "part, why",
    [
        (
            "tests",
            "pytest_timeout is not installed (carry its wheel: make gpu-wheels, then --wheels)",
        ),
        ("bench", "zstandard is not installed (carry its wheel: make gpu-wheels, then --wheels)"),
        (
            "ladder",
            "ray is not installed (carry it: make gpu-wheels packs a trimmed Ray, ray-*.tar.xz",
        ),
    ],
)
def test_on_a_bare_python_each_part_says_what_it_lacks_in_one_line(processes, tmp_path, part, why):
    """No ImportError: the part that can't run names the package and why, then the machine's
    lack of CUDA is the one other line (the wheels' installation is checked by hand with a
    venv of the GPU machine's packages: README's "GPU" section)."""
    env = {"PYTHONPATH": ".", "CUDA_VISIBLE_DEVICES": ""}
    out = processes.python("-c", BARE_PYTHON, "--parts", part, "--wheels", str(tmp_path), env=env)
    lines = [line for line in out.stderr.splitlines() if line.startswith("gpu-check:")]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert len(lines) == 2 and lines[0].startswith(f"gpu-check: {part}: not run, {why}")
    assert lines[1] == NO_CUDA


def test_the_wheels_carried_are_what_the_check_advises_carrying(repo_root):
    """Every package a part needs that the GPU image may lack is one ``make gpu-wheels``
    carries: the refusal says "carry its wheel: make gpu-wheels", which once left out
    pytest-timeout (the tests part's --timeout needs it)."""
    gpu_check = load_script("benchmarks/gpu_check.py")
    (line,) = re.findall(r"^GPU_WHEELS := (.+)$", (repo_root / "Makefile").read_text(), re.M)
    assert sorted(line.split()) == sorted(CARRIED)
    needed = {m for part in gpu_check.NEEDS.values() for m in part}
    lacking = needed & set(ABSENT) - set(gpu_check.WHY_MISSING)
    assert lacking <= {name.replace("-", "_") for name in CARRIED}


def wheel_of_installed(name: str, folder) -> None:
    """A wheel of the installed distribution ``name``, as ``pip download`` would fetch it."""
    dist = importlib.metadata.distribution(name)
    tag = "py3-none-any"
    path = folder / f"{dist.metadata['Name'].replace('-', '_')}-{dist.version}-{tag}.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for file in dist.files:
            if not str(file).startswith("..") and "__pycache__" not in str(file):
                whl.write(file.locate(), str(file))


@pytest.mark.slow
def test_on_a_bare_python_the_carried_wheels_are_installed_before_our_code_is_imported(
    processes, tmp_path
):
    """The bench part with the wheels ``make gpu-wheels`` carries: they install offline into
    ``--wheels``' site folder, every import check passes, and the one line left is the lack of
    CUDA (run first on the GPU machine, our config code was imported before the wheels that it
    needs, and the check died with draccus missing)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in CARRIED:
        wheel_of_installed(name, wheels)
    env = {"PYTHONPATH": ".", "CUDA_VISIBLE_DEVICES": ""}
    out = processes.python("-c", BARE_PYTHON, "--parts", "bench", "--wheels", str(wheels), env=env)
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert [line for line in out.stderr.splitlines() if line.startswith("gpu-check:")] == [NO_CUDA]
    site = wheels / "site"
    modules = [name.replace("-", "_") for name in CARRIED]
    assert all((site / m).is_dir() or (site / f"{m}.py").is_file() for m in modules)


RAY_WHEEL = {
    "ray/__init__.py": ("", 0o644),
    "ray/core/src/ray/raylet/raylet": ("binary", 0o755),
    "ray/dashboard/client/build/static/js/main.js": ("js", 0o644),
    "ray/dashboard/client/build/static/js/main.js.map": ("map", 0o644),
    "ray/jars/ray_dist.jar": ("java", 0o644),
    "ray/rllib/__init__.py": ("", 0o644),
    "ray/serve/__init__.py": ("", 0o644),
    "ray/llm/__init__.py": ("", 0o644),
    "ray-9.9.9.dist-info/METADATA": ("Name: ray", 0o644),
}
"""Ray's wheel in miniature: what a ladder runs, and what pack_ray.py leaves behind."""


def ray_wheel(folder: Path) -> Path:
    path = folder / "ray-9.9.9-cp312-cp312-manylinux2014_x86_64.whl"
    with zipfile.ZipFile(path, "w") as whl:
        for name, (text, mode) in RAY_WHEEL.items():
            info = zipfile.ZipInfo(name)
            info.external_attr = (0o100000 | mode) << 16
            whl.writestr(info, text)
    return path


def test_ray_travels_trimmed_and_is_unpacked_where_ray_is_missing(
    run_script, gpu_check, tmp_path, monkeypatch
):
    """pack_ray.py drops the folders a ladder never imports and keeps the binaries executable;
    gpu_check unpacks the archive into the carried site folder on a Python without Ray (on the
    H200, the first GPU ladder through Ray ran this way: RESULTS.md)."""
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    code, out, _ = run_script(
        "benchmarks/pack_ray.py", str(ray_wheel(tmp_path)), "--out", str(wheels)
    )
    archive = wheels / "ray-9.9.9-cp312.tar.xz"
    assert code == 0 and out.startswith(f"{archive}: ")
    with tarfile.open(archive) as tar:
        members = {m.name: m.mode for m in tar.getmembers()}
    assert members == {
        "ray/__init__.py": 0o644,
        "ray/core/src/ray/raylet/raylet": 0o755,
        "ray/dashboard/client/build/static/js/main.js": 0o644,
        "ray-9.9.9.dist-info/METADATA": 0o644,
    }
    monkeypatch.setattr(gpu_check.sys, "path", list(gpu_check.sys.path))
    monkeypatch.setenv("PYTHONPATH", "")
    monkeypatch.setattr(gpu_check, "_importable", lambda name: name != "ray")
    gpu_check.use_carried_wheels(wheels)
    site = wheels / "site"
    assert (site / "ray-9.9.9.dist-info" / "METADATA").read_text() == "Name: ray"
    assert (site / "ray/core/src/ray/raylet/raylet").stat().st_mode & 0o777 == 0o755
    assert gpu_check.sys.path[0] == str(site) and gpu_check.os.environ["PYTHONPATH"] == str(site)


def test_an_archive_over_what_a_gpu_machine_is_sent_fails_naming_it(run_script, tmp_path):
    pack_ray = load_script("benchmarks/pack_ray.py")
    wheel = ray_wheel(tmp_path)
    archive = tmp_path / "ray-9.9.9-cp312.tar.xz"
    limit = pack_ray.pack(wheel, tmp_path).stat().st_size - 1
    code, _, err = run_script("benchmarks/pack_ray.py", str(wheel), "--limit-bytes", str(limit))
    assert code == 1
    assert err.strip() == f"pack_ray: {archive} is over the {limit:,} bytes a GPU machine is sent"
    code, _, err = run_script("benchmarks/pack_ray.py", str(tmp_path / "absent.whl"))
    assert code == 2 and "absent.whl: no such wheel; make gpu-wheels downloads it first" in err
    cut = tmp_path / "ray-9.9.9-cp312-cp312-manylinux2014_x86_64.whl"
    cut.write_bytes(wheel.read_bytes()[:100])  # a download broken off
    code, _, err = run_script("benchmarks/pack_ray.py", str(cut))
    assert code == 2 and f"{cut}: not a wheel (a zip named NAME-VERSION-PYTHON-ABI-PLATFORM" in err


def test_a_broken_ray_archive_is_named_and_the_ladder_part_refused(processes, tmp_path):
    """A carried archive that does not unpack (cut short on its way): one line naming it, then
    the ladder part's refusal, no traceback."""
    (tmp_path / "ray-9.9.9-cp312.tar.xz").write_bytes(b"\xfd7zXZ\x00 cut short")
    env = {"PYTHONPATH": ".", "CUDA_VISIBLE_DEVICES": ""}
    out = processes.python(
        "-c", BARE_PYTHON, "--parts", "ladder", "--wheels", str(tmp_path), env=env
    )
    lines = [line for line in out.stderr.splitlines() if line.startswith("gpu-check:")]
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"gpu-check: {tmp_path / 'ray-9.9.9-cp312.tar.xz'} does not unpack")
    assert lines[1].startswith("gpu-check: ladder: not run, ray is not installed")
    assert lines[2:] == [NO_CUDA]


def test_a_wheel_is_installed_when_its_package_is_missing_even_under_another_name(
    gpu_check, tmp_path
):
    """rpds-py installs ``rpds``, tensorboardX's wheel file is lower case: read off the wheel,
    not its file name (which made a present package look missing, reinstalled every time)."""
    for wheel, package in [
        ("rpds_py-1.0-cp312-cp312-manylinux2014_x86_64.whl", "rpds"),
        ("tensorboardx-2.6-py3-none-any.whl", "tensorboardX"),
        ("pytest_timeout-2.4.0-py3-none-any.whl", "pytest_timeout"),
    ]:
        with zipfile.ZipFile(tmp_path / wheel, "w") as whl:
            top = f"{package}.py" if package == "pytest_timeout" else f"{package}/__init__.py"
            whl.writestr(top, "")
            whl.writestr(f"{wheel.split('-')[0]}-1.0.dist-info/METADATA", "")
        assert gpu_check._package(tmp_path / wheel) == package
