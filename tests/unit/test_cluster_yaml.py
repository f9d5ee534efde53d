"""cluster.yaml validated offline against the schema Ray ships (no credentials, no network),
and its setup commands run in a scratch home with stand-ins for the node's tools."""

from __future__ import annotations

import copy
import re
import subprocess
from importlib.metadata import version
from pathlib import Path

import pytest
import yaml
from jsonschema.exceptions import ValidationError
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from ray.autoscaler._private.util import prepare_config, validate_config

from trainer_core.io import storage

# What Ray pickles between nodes: a node that installs another release than the head's is refused
# (Ray) or unpickles another class layout (the others).
PICKLED_ACROSS_NODES = ("ray", "numpy", "pandas", "pyarrow")
# Where the Deep Learning AMI mounts a p5's instance-store NVMe.
NVME = "/opt/dlami/nvme"


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
    assert "pip install" in setup and "-c constraints.txt -e" in setup and "torch==2.13.0" in setup
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


def test_what_ray_pickles_across_nodes_is_pinned_to_the_installed_release(repo_root):
    """Autoscaled GPU nodes install from constraints.txt when they launch, maybe weeks after the
    head: each package Ray pickles between nodes is pinned to one release, the one tested here."""
    pins = {}
    for line in (repo_root / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            req = Requirement(line)
            pins[req.name] = str(req.specifier)
    wanted = {name: f"=={version(name)}" for name in PICKLED_ACROSS_NODES}
    assert {name: pins.get(name) for name in PICKLED_ACROSS_NODES} == wanted
    assert all(re.fullmatch(r"==\d+\.\d+\.\d+", pin) for pin in wanted.values()), wanted


def setup_command(cluster: dict, part: str) -> str:
    """The one setup command containing ``part``."""
    found = [c for c in cluster["setup_commands"] if part in c]
    assert len(found) == 1, found
    return found[0]


def tool(bindir: Path, name: str, body: str) -> None:
    """A stand-in for a node's program: a shell script named ``name``."""
    bindir.mkdir(parents=True, exist_ok=True)
    path = bindir / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def run_on_node(command: str, home: Path, bindir: Path) -> None:
    """``command`` as Ray's launcher runs it: bash in the home dir, ``~`` being ``home``; the
    stand-ins in ``bindir`` come first on PATH, and nothing of this machine's own tools but
    /usr/bin and /bin."""
    env = {"HOME": str(home), "PATH": f"{bindir}:/usr/bin:/bin"}
    out = subprocess.run(["bash", "-c", command], cwd=home, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr


def recorder(bindir: Path, name: str, log: Path, then: str = "") -> None:
    """A stand-in that appends its arguments to ``log``, one call a line, then runs ``then``
    (its exit status is the stand-in's)."""
    tool(bindir, name, f'echo "$*" >> {log}\n{then}')


@pytest.mark.parametrize("has_venv", [True, False], ids=["python3-venv", "no-python3-venv"])
def test_uv_is_installed_whether_or_not_the_ami_has_python3_venv(cluster, tmp_path, has_venv):
    """Ubuntu's python3 makes a venv only with its python3-venv package (ensurepip), which a Deep
    Learning AMI may lack: the setup installs it then, and only then, before making ~/uv."""
    home, bindir, installed = tmp_path / "home", tmp_path / "bin", tmp_path / "python3-venv"
    (home / "rayladder").mkdir(parents=True)
    if has_venv:
        installed.touch()
    # python3 as on Ubuntu: `import ensurepip` and `-m venv` fail without python3-venv.
    recorder(bindir, "python3", tmp_path / "python3-calls", then=f"test -e {installed}")
    recorder(
        bindir,
        "sudo",
        tmp_path / "sudo-calls",
        then=f'case "$*" in *"install "*python3-venv*) touch {installed};; esac',
    )
    recorder(home / "uv" / "bin", "pip", tmp_path / "pip-calls")
    for part in ("import ensurepip", "python3 -m venv ~/uv"):
        run_on_node(setup_command(cluster, part), home, bindir)
    assert (tmp_path / "python3-calls").read_text().splitlines() == [
        "-c import ensurepip",
        f"-m venv {home}/uv",
    ]
    assert (tmp_path / "pip-calls").read_text().splitlines() == [
        "install --quiet -c constraints.txt uv"
    ]
    if has_venv:
        assert not (tmp_path / "sudo-calls").exists()
    else:
        assert "install -y -qq python3-venv" in (tmp_path / "sudo-calls").read_text()


def test_nodes_get_a_python_311_venv_made_by_uv_once(cluster, repo_root, tmp_path):
    """Ubuntu 22.04's python3 is 3.10 and the project needs the 3.11 it is tested on (its
    requires-python): uv, pinned by constraints.txt, makes ~/venv on 3.11. A re-run of `ray up`
    keeps a 3.11 venv with pip; an older venv on another Python is replaced."""
    setup = "\n".join(cluster["setup_commands"])
    assert "python3 -m venv ~/venv" not in setup
    pyproject = (repo_root / "pyproject.toml").read_text()
    spec = SpecifierSet(re.search(r'^requires-python = "(.+)"$', pyproject, re.M).group(1))
    assert "3.11" in spec and "3.10" not in spec
    make_venv = setup_command(cluster, "uv venv")
    home, calls = tmp_path / "home", tmp_path / "uv-calls"
    recorder(home / "uv" / "bin", "uv", calls)
    run_on_node(make_venv, home, tmp_path / "bin")
    assert calls.read_text().splitlines() == [
        f"venv --quiet --clear --managed-python --python 3.11 --seed {home}/venv"
    ]
    calls.unlink()
    tool(home / "venv" / "bin", "python3.10", "exit 0")  # the venv an older cluster.yaml made
    run_on_node(make_venv, home, tmp_path / "bin")
    assert len(calls.read_text().splitlines()) == 1
    calls.unlink()
    tool(home / "venv" / "bin", "python3.11", '[ "$*" = "-m pip --version" ]')
    run_on_node(make_venv, home, tmp_path / "bin")
    assert not calls.exists()


@pytest.mark.parametrize(
    ("nvidia_smi", "index", "project"),
    [("exit 0", "cu128", ".[gpu]"), ("exit 9", "cpu", "."), (None, "cpu", ".")],
    ids=["gpu-node", "gpu-ami-without-gpu", "no-driver"],
)
def test_cuda_torch_and_the_gpu_extra_only_where_nvidia_smi_lists_a_gpu(
    cluster, tmp_path, nvidia_smi, index, project
):
    """Every node runs the setup commands, the CPU head too: each picks its own wheel index, and
    the GPU nodes get the project's `gpu` extra (torchao: float8 training)."""
    home, bindir, calls = tmp_path / "home", tmp_path / "bin", tmp_path / "pip-calls"
    (home / "rayladder").mkdir(parents=True)
    recorder(home / "venv" / "bin", "pip", calls)
    if nvidia_smi is not None:
        tool(bindir, "nvidia-smi", nvidia_smi)
    for part in ("torch==", "-c constraints.txt -e"):
        run_on_node(setup_command(cluster, part), home, bindir)
    assert calls.read_text().splitlines() == [
        f"install --quiet torch==2.13.0 --index-url https://download.pytorch.org/whl/{index}",
        f"install --quiet -c constraints.txt -e {project}",
    ]


@pytest.mark.parametrize("has_nvme", [True, False], ids=["p5-with-nvme", "head-without"])
def test_rerunning_setup_adds_each_bashrc_line_once(cluster, tmp_path, monkeypatch, has_nvme):
    """Checkpoints are staged on the NVMe where the node has it, in a dir ubuntu owns (the mount
    is root's); the head has none and stages in the temp dir. The stage line an older
    cluster.yaml wrote (a path rayladder doubled, absent on the head) goes."""
    home, bindir, nvme = tmp_path / "home", tmp_path / "bin", tmp_path / "nvme"
    sudo = tmp_path / "sudo-calls"
    home.mkdir()
    (home / ".bashrc").write_text(
        f"# the AMI's own\nexport RAYLADDER_STAGE_DIR={NVME}/rayladder-stage\n"
    )
    if has_nvme:
        nvme.mkdir()
    recorder(bindir, "sudo", sudo)
    appends = [c.replace(NVME, str(nvme)) for c in cluster["setup_commands"] if ".bashrc" in c]
    assert len(appends) == 2
    for _ in range(2):
        for command in appends:
            run_on_node(command, home, bindir)
    stage = [f"export RAYLADDER_STAGE_DIR={nvme}"] if has_nvme else []
    assert (home / ".bashrc").read_text().splitlines() == [
        "# the AMI's own",
        "source ~/venv/bin/activate",
        *stage,
    ]
    if not has_nvme:
        assert not sudo.exists()
        return
    made = f"{nvme}/rayladder-stage"
    assert sudo.read_text().splitlines() == [f"install -d -o ubuntu {made}"] * 2
    monkeypatch.setenv(storage.STAGE_ENV, stage[0].split("=", 1)[1])
    assert storage.upload_cache_dir("s3://bucket/runs/x").parent == Path(made)
