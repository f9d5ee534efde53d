"""``python workflows/submit.py [--address URL] [--no-wait] -- workflows/ladder.py [args...]``

``ray job submit --working-dir .`` with a check first: the upload must fit Ray's 100 MiB cap
(what .rayignore excludes does not count), else a clear error names the biggest entries.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from trainer_core.ray.upload import UploadTooLargeError, check_upload

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    argv = sys.argv[1:]
    if "--" not in argv:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    own, script = argv[: argv.index("--")], argv[argv.index("--") + 1 :]
    try:
        size = check_upload(ROOT)
    except UploadTooLargeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"uploading {size / 2**20:.1f} MiB working dir")
    cmd = ["ray", "job", "submit", "--working-dir", str(ROOT), *own, "--", "python", *script]
    return subprocess.call(cmd, env=os.environ.copy())


if __name__ == "__main__":
    sys.exit(main())
