"""The README's workstation walk-through (`ray start --head`, `ray job submit --working-dir`),
run as written, and the guards around a submitted job: upload size, relative output dirs."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import grpc
import pytest
from scripts import load_script

from trainer_core.config.loader import ConfigError
from trainer_core.io.output_dir import RAY_JOB_CONFIG_ENV, check_output_dir
from trainer_core.ray.upload import UploadTooLargeError, check_upload


def test_upload_guard_names_the_biggest_entries(tmp_path):
    (tmp_path / "code.py").write_text("print('hi')\n")
    (tmp_path / "data").mkdir()
    with open(tmp_path / "data" / "big.bin", "wb") as f:
        f.truncate(120 * 2**20)  # sparse: no disk used; over the dashboard's 100 MiB request cap
    (tmp_path / "runs").mkdir()
    with open(tmp_path / "runs" / "ckpt.bin", "wb") as f:
        f.truncate(900 * 2**20)
    (tmp_path / ".rayignore").write_text("runs\n")
    with pytest.raises(
        UploadTooLargeError,
        match=r"would upload 120 MiB, over Ray's 100 MiB limit.*biggest: data \(120 MiB\)",
    ):
        check_upload(tmp_path)
    (tmp_path / ".rayignore").write_text("runs\ndata\n")
    assert check_upload(tmp_path) < 2**20


def test_project_upload_fits(repo_root):
    assert check_upload(repo_root) < 10 * 2**20


def test_submit_script_runs_from_a_shell_and_asks_for_the_command(processes, free_port):
    """--help printed only the usage line and exited 2; a job submitted where nothing answers
    ended in Ray's connection traceback, after the upload was packed."""
    out = processes.python("workflows/submit.py", "--no-wait")
    assert out.returncode == 2 and out.stdout == ""
    assert (
        out.stderr
        == "error: no script to run: give it after --, e.g. -- workflows/ladder.py --dry-run\n"
    )
    out = processes.python("workflows/submit.py", "--help")
    assert out.returncode == 0
    assert out.stdout.startswith(
        "usage: python workflows/submit.py [--address URL] [--no-wait] -- "
    )
    assert "--address ADDRESS" in out.stdout and "--no-wait" in out.stdout
    nowhere = f"http://127.0.0.1:{free_port()}"
    args = ("--address", nowhere, "--", "workflows/ladder.py", "--dry-run")
    out = processes.python("workflows/submit.py", *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith(f"error: --address: nothing answers at {nowhere[7:]} (")


def test_submit_takes_the_command_as_ray_job_submit_does():
    """``ray job submit -- python workflows/ladder.py`` is how Ray's docs write it: given so to
    submit.py, the job ran ``python python workflows/ladder.py`` and failed on the cluster,
    after the upload. Options submit.py doesn't know go to ``ray job submit``."""
    parse = load_script("workflows/submit.py").parse
    argv = ["--submission-id=l-1", "--", "python", "workflows/ladder.py", "--dry-run"]
    args, passed_on, script = parse(argv)
    assert script == ["workflows/ladder.py", "--dry-run"] and passed_on == ["--submission-id=l-1"]
    assert parse(["--no-wait", "--", "workflows/ladder.py"])[2] == ["workflows/ladder.py"]


def test_submit_probes_a_dashboard_url_at_its_own_port():
    """A dashboard behind a proxy (https://host, no port) was probed at 8265, and refused."""
    probe = load_script("workflows/submit.py").jobs_api_address
    with pytest.raises(ConfigError, match=r"nothing answers at 127\.0\.0\.1:443 "):
        probe("https://127.0.0.1")


def test_an_address_with_a_bad_port_is_refused_in_one_line(processes):
    """urlsplit's port is read lazily: a port not a number, or past 65535, ended submit.py in
    a ValueError traceback."""
    args = ("--address", "foo:bar", "--", "workflows/ladder.py")
    out = processes.python("workflows/submit.py", *args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.startswith("error: --address: 'foo:bar' is not a URL (")
    assert out.stderr.endswith("); give the dashboard, http://HOST:8265\n")
    assert out.stderr.count("\n") == 1
    address = load_script("workflows/submit.py").jobs_api_address
    for bad in ("http://127.0.0.1:notaport", "http://127.0.0.1:82700"):
        with pytest.raises(ConfigError, match=rf"^--address: '{bad}' is not a URL \("):
            address(bad)


@pytest.fixture
def http_server():
    """``http_server(status, body)``: HOST:PORT of a local HTTP server answering every GET with
    ``status`` and ``body``, as a dashboard's does."""
    servers: list[ThreadingHTTPServer] = []

    def start(status: int, body: bytes) -> str:
        class Answer(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = ThreadingHTTPServer(("127.0.0.1", 0), Answer)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"127.0.0.1:{server.server_port}"

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


@pytest.fixture
def grpc_server():
    """HOST:PORT of a gRPC server, as a GCS is: it answers HTTP/1 in HTTP/2 frames."""
    server = grpc.server(ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}"
    server.stop(0)


def test_a_dashboard_given_as_host_port_is_submitted_to_as_a_url(
    http_server, grpc_server, monkeypatch
):
    """``--address 127.0.0.1:8270`` passed the probe and went to ``ray job submit`` as it was,
    which takes an address without a scheme for a GCS's and timed out 43 s later. A GCS's
    HOST:PORT and a ray:// address go as they are: Ray looks their dashboard up."""
    submit = load_script("workflows/submit.py")
    version = b'{"version": "4", "ray_version": "2.60.0"}'
    dashboard = http_server(200, version)
    assert submit.jobs_api_address(dashboard) == f"http://{dashboard}"
    with_auth = http_server(401, b"Unauthorized: Missing authentication token")
    assert submit.jobs_api_address(with_auth) == f"http://{with_auth}"
    assert submit.jobs_api_address(grpc_server) == grpc_server
    for url in (f"http://{dashboard}", f"ray://{grpc_server}"):
        assert submit.jobs_api_address(url) == url
    monkeypatch.setattr(submit, "DASHBOARD_PORT", int(http_server(200, version).split(":")[1]))
    assert submit.jobs_api_address("127.0.0.1") == f"http://127.0.0.1:{submit.DASHBOARD_PORT}"


def test_the_script_and_its_config_must_be_in_the_upload(
    processes, free_port, repo_root, tmp_path, monkeypatch
):
    """A missing --config failed on the cluster, after the upload and the job's start (12 s);
    one outside the repository was found on a one-machine cluster only. Each is refused before
    the upload, and what the job is given is relative to the repository, where it runs."""
    nowhere = f"http://127.0.0.1:{free_port()}"
    nope = "workflows/configs/nope.yaml"
    args = ("--address", nowhere, "--", "workflows/ladder.py", "--config", nope)
    out = processes.python("workflows/submit.py", *args)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr == (
        f"error: --config: {nope} is not a file; give a path to one in {repo_root}\n"
    )
    command = load_script("workflows/submit.py").job_command
    with pytest.raises(ConfigError, match=r"^the script after --: workflows/nope\.py is not a"):
        command(["workflows/nope.py"])
    outside = tmp_path / "ladder.yaml"
    outside.write_text("name: x\n")
    with pytest.raises(
        ConfigError, match=rf"^--config: {outside} lies outside {repo_root}, the working dir"
    ):
        command(["workflows/ladder.py", f"--config={outside}"])
    with pytest.raises(ConfigError, match=r"^--config: \.venv/pyvenv\.cfg is not uploaded \("):
        command(["workflows/ladder.py", "--config", ".venv/pyvenv.cfg"])
    tiny = repo_root / "workflows" / "configs" / "train-tiny.yaml"
    given = ["workflows/train.py", "--config", str(tiny), "--trainer.max_steps=2"]
    assert command(given) == [
        "workflows/train.py",
        "--config",
        "workflows/configs/train-tiny.yaml",
        "--trainer.max_steps=2",
    ]
    monkeypatch.chdir(repo_root / "workflows")
    assert command(["ladder.py", "--config=configs/ladder-demo.yaml"]) == [
        "workflows/ladder.py",
        "--config=workflows/configs/ladder-demo.yaml",
    ]
    assert command(["-m", "trainer_core.train"]) == ["-m", "trainer_core.train"]


def test_the_job_goes_where_submit_checked_it(monkeypatch):
    """Ray's job client takes RAY_API_SERVER_ADDRESS, then RAY_ADDRESS, over --address: with
    RAY_ADDRESS exported (as the README does) and --address naming another cluster, submit.py
    probed and announced one and Ray submitted to the other. RAY_ADDRESS=auto is Ray's lookup of
    this machine's cluster: the default dashboard, not a host named auto."""
    submit = load_script("workflows/submit.py")
    monkeypatch.setenv("RAY_ADDRESS", "http://a:8265")
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "http://c:8265")
    env = submit.job_env("http://b:8265")
    assert env["RAY_ADDRESS"] == "http://b:8265" and "RAY_API_SERVER_ADDRESS" not in env
    assert submit.parse(["--", "x.py"])[0].address == "http://a:8265"
    monkeypatch.setenv("RAY_ADDRESS", "auto")
    assert submit.parse(["--", "x.py"])[0].address == submit.LOCAL_DASHBOARD


WALKTHROUGH = (
    "<!-- workstation walk-through: tests/e2e/test_job_submit.py runs this block as it is -->"
)


def readme_walkthrough(repo_root: Path) -> str:
    """The README's workstation walk-through: the bash block after :data:`WALKTHROUGH`."""
    text = (repo_root / "README.md").read_text()
    block = text.split(WALKTHROUGH, 1)[1].split("```bash\n", 1)[1]
    return block.split("```", 1)[0]


def checkout_of(repo_root: Path, dest: Path) -> Path:
    """The working tree as a user's checkout holds it (tracked and new files, not what git
    ignores), with the repo's venv linked in as `make setup` would have made it."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=repo_root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in filter(None, listed.split("\0")):
        source = repo_root / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    (dest / ".venv").symlink_to(repo_root / ".venv")
    return dest


@pytest.mark.ray
@pytest.mark.slow
def test_the_readme_walkthrough_runs_as_written(processes, repo_root, tmp_path, no_local_ray):
    """The README's lines, run by bash in a checkout: the venv activated, a head started, the
    tiny run submitted, its logs followed to the end, its status read, Ray stopped."""
    lines = readme_walkthrough(repo_root)
    assert "source .venv/bin/activate" in lines and "ray stop" in lines
    for port in (6379, 8265):
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0, (
                f"port {port} is taken: the walk-through needs it"
            )
    checkout = checkout_of(repo_root, tmp_path / "checkout")
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(tmp_path)}
    out = None
    try:
        out = processes.run(
            "bash", "-euo", "pipefail", "-c", lines, env=env, cwd=checkout, timeout=500
        )
    finally:
        if out is None or out.returncode != 0:
            # stopped before its `ray stop`: the head it started (a daemon) would run on
            # through every later test (a CI run's: ~20% slower to the end)
            stop = "source .venv/bin/activate && ray stop --force"
            processes.run("bash", "-c", stop, env=env, cwd=checkout, timeout=120)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-3000:]
    assert "run tiny-1 finished: step 20" in out.stdout  # the job's own output, followed
    assert out.stdout.count("Job 'tiny-1' succeeded") == 2  # at the end of the logs, and status
    info = json.loads((checkout / "runs" / "tiny-1" / "run.json").read_text())
    assert info["status"] == "finished" and info["last_step"] == 20
    assert "Stopped all" in out.stdout + out.stderr


def test_a_relative_output_dir_is_refused_inside_an_uploaded_working_dir(monkeypatch):
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"}}
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, json.dumps(job))
    with pytest.raises(
        ConfigError, match=r"^trainer.run_dir: 'runs/x' is relative, and this Ray job"
    ):
        check_output_dir("runs/x", "trainer.run_dir")
    assert check_output_dir("/tmp/rayladder-abs", "trainer.run_dir") == Path("/tmp/rayladder-abs")
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, json.dumps({"runtime_env": {}}))
    assert check_output_dir("runs/x", "trainer.run_dir") == Path("runs/x").absolute()


def test_a_submitted_job_with_a_relative_dir_in_its_config_is_refused(
    monkeypatch, run_script, repo_root
):
    """The config made its dirs absolute as it loaded, so inside Ray's copy of the working dir
    the check saw an absolute path and let the run write where nothing is kept (train-tiny.yaml,
    ladder-demo.yaml: both relative)."""
    job = {"runtime_env": {"working_dir": "gcs://_ray_pkg_abc.zip"}}
    monkeypatch.setenv(RAY_JOB_CONFIG_ENV, json.dumps(job))
    tiny = repo_root / "workflows" / "configs" / "train-tiny.yaml"
    code, _, err = run_script("workflows/train.py", "--config", str(tiny))
    assert code == 2 and "trainer.run_dir: 'runs/train-tiny' is relative" in err
    code, _, err = run_script("workflows/ladder.py")
    assert code == 2 and "dir: 'runs/ladder-demo' is relative" in err
