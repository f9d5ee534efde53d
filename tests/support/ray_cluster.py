"""A real multi-node Ray cluster on this machine, started as a user starts one: ``ray start
--head`` and ``ray start --address=...``, each node with a resource label of its own, so that
``ray.nodes()`` tells which node is which.

Each node is one ``ray start --block`` process in a session of its own, and every process Ray
starts for that node (GCS, raylet, agents, workers) stays in that session. Stopping a node
SIGKILLs exactly that session's processes, by PID: never ``ray stop``, which ends every Ray of
the user on the machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

RAY = Path(sys.executable).parent / "ray"
RAYLET = f"{os.sep}raylet{os.sep}raylet"
"""How Ray's raylet binary's path ends."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stat(pid: int) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name ([] once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return []


def _processes() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def _program(pid: int) -> str:
    """The executable path a process was started with ("" once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except (FileNotFoundError, ProcessLookupError):
        return ""


@dataclass
class Node:
    label: str
    proc: subprocess.Popen
    temp_dir: str
    log: Path

    def raylet_pid(self) -> int:
        """The node's raylet: the child of its ``ray start`` running Ray's raylet binary."""
        for pid in _processes():
            stat = _stat(pid)
            if stat and int(stat[1]) == self.proc.pid and _program(pid).endswith(RAYLET):
                return pid
        raise LookupError(f"node {self.label}: no raylet under pid {self.proc.pid}")

    def wait_started(self, timeout: float) -> None:
        """Until ``ray start`` says the node runs (an error with its log if it exits first)."""
        deadline = time.monotonic() + timeout
        while "Ray runtime started" not in self.log.read_text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"node {self.label} did not start:\n{self.log.read_text()}")
            time.sleep(0.2)

    def session(self) -> list[int]:
        """Every live process of the node's session (its ``ray start`` is the session leader)."""
        leader = self.proc.pid
        return [p for p in _processes() if (s := _stat(p)) and s[0] != "Z" and int(s[3]) == leader]

    def stop(self, timeout: float = 30) -> None:
        """SIGKILL the node's processes until none is left, then remove its temp dir."""
        deadline = time.monotonic() + timeout
        while pids := self.session():
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            self.proc.poll()  # reaps ray start; its children go to init, which reaps them
            if time.monotonic() > deadline:
                raise RuntimeError(f"node {self.label}: processes {pids} outlived SIGKILL")
            time.sleep(0.1)
        self.proc.wait(timeout=timeout)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


class RayCluster:
    """Nodes started with ``ray start``, their environment ``env``; the head gets
    ``system_config`` (e.g. how fast a lost node is declared dead)."""

    def __init__(self, logs: Path, env: dict[str, str], system_config: dict):
        self.logs, self.env, self.system_config = logs, env, system_config
        self.nodes: list[Node] = []
        self.address = ""

    def start_head(self, cpus: float, label: str, dashboard: bool = True) -> Node:
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        return self._start(
            label,
            "--head",
            f"--port={port}",
            f"--num-cpus={cpus}",
            f"--dashboard-port={free_port()}" if dashboard else "--include-dashboard=false",
            f"--ray-client-server-port={free_port()}",
            f"--system-config={json.dumps(self.system_config)}",
        )

    def start_head_and_wait(
        self, cpus: float, label: str, timeout: float, dashboard: bool = True
    ) -> Node:
        """The head, started (``ray start`` says so). Ray gives a starting node a fixed 30 s to
        register with its GCS; on a loaded 2-core machine the GCS has once stayed silent that
        long, and ``ray start`` gave up. That head's processes are stopped and it starts anew,
        once."""
        head = self.start_head(cpus, label, dashboard)
        try:
            head.wait_started(timeout)
        except RuntimeError:
            head.stop()
            self.nodes.remove(head)
            head = self.start_head(cpus, label, dashboard)
            head.wait_started(timeout)
        return head

    def add_node(self, cpus: float, label: str) -> Node:
        return self._start(label, f"--address={self.address}", f"--num-cpus={cpus}")

    def _start(self, label: str, *args: str) -> Node:
        temp_dir = tempfile.mkdtemp(prefix="rl-")  # short: Ray's socket paths are capped
        log = self.logs / f"node-{label}.log"
        argv = [
            str(RAY),
            "start",
            *args,
            f"--resources={json.dumps({label: 1})}",
            f"--temp-dir={temp_dir}",
            # Nodes on one machine need ports of their own (the defaults would collide).
            f"--dashboard-agent-listen-port={free_port()}",
            f"--metrics-export-port={free_port()}",
            f"--runtime-env-agent-port={free_port()}",
            "--disable-usage-stats",
            "--block",
        ]
        with open(log, "w") as out:
            proc = subprocess.Popen(
                argv, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        node = Node(label, proc, temp_dir, log)
        self.nodes.append(node)
        return node

    def node(self, label: str) -> Node:
        (node,) = [n for n in self.nodes if n.label == label]
        return node

    def node_ids(self) -> dict[str, str]:
        """Label -> node id of every live node (needs ``ray`` connected to this cluster)."""
        import ray

        return {
            node.label: n["NodeID"]
            for n in ray.nodes()
            for node in self.nodes
            if n["Alive"] and node.label in n["Resources"]
        }

    def wait_alive(self, labels: set[str], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not labels <= self.node_ids().keys():
            for node in self.nodes:
                if node.proc.poll() is not None:
                    raise RuntimeError(f"node {node.label} exited:\n{node.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes {sorted(labels)} not all up in {timeout} s")
            time.sleep(0.2)

    def close(self) -> None:
        """Stop every node, worker nodes first."""
        for node in reversed(self.nodes):
            node.stop()
