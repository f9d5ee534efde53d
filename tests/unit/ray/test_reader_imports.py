"""What Ray Data's read tasks import: a fresh worker process per read task pays for every module
the read function's module pulls in, so the reader stays free of torch (about 2 s a process on
these cores)."""

from __future__ import annotations

import pickle


def test_a_read_task_and_the_rank_dataset_builder_import_no_torch(processes):
    """The read function and the per-rank dataset builder Ray Train's controller calls, unpickled
    in a fresh interpreter as Ray does, leave torch unimported."""
    from trainer_core.ray.reader import _read_windows, rank_dataset

    payload = pickle.dumps((_read_windows, rank_dataset)).hex()
    code = (
        "import pickle, sys\n"
        f"pickle.loads(bytes.fromhex({payload!r}))\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.')))\n"
    )
    out = processes.python("-c", code)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
