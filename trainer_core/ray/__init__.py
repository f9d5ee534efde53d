"""The Ray layer: Ray Train runs, Ray Data streaming and Ray Tune trials on top of the library.

Thin by design: it decides where processes run and where data and results go; the training
loop itself is ``trainer_core.train.trainer`` unchanged.

Its one statement: Ray reads ``RAY_DEDUP_LOGS`` once, when it is first imported, and by default
folds lines that differ only in their numbers, such as the runs' progress lines, into
"[repeated Nx across cluster]" notes. Set here, before any module of this layer imports Ray;
a value the user set wins.
"""

import os

os.environ.setdefault("RAY_DEDUP_LOGS", "0")
