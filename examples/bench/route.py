"""The route of one sync step through the package: which of asyncrl's files its calls enter, in order, and how often
the route changes folder (BENCHMARKS.md, "Restructures"). A 2-step in-process GRPO run on the micro
preset; only the second step is recorded, from the return of the first step's ``end_step`` to the return of the
second's, on every thread (a profile hook, so nothing of the package is changed to be counted).

Run it in each checkout to compare (the test helpers are that checkout's):
``cd CHECKOUT && HF_HUB_OFFLINE=1 PYTHONPATH=. /path/to/.venv/bin/python /path/to/examples/bench/route.py``
"""

from __future__ import annotations

import sys
import tempfile
import threading
from pathlib import Path

import asyncrl
from asyncrl.config import load_config
from asyncrl.schedules import run_training
from tests.helpers import make_data, make_model, train_overrides

PACKAGE = Path(asyncrl.__file__).resolve().parent


class Route:
    """Call events into the package's files between two returns of a step's outermost ``end_step``."""

    def __init__(self):
        self.ends, self.files, self.lock = 0, [], threading.Lock()

    def __call__(self, frame, event, arg):
        path = frame.f_code.co_filename
        if not path.startswith(str(PACKAGE)):
            return
        rel = str(Path(path).relative_to(PACKAGE))
        with self.lock:
            caller = frame.f_back.f_code.co_name if frame.f_back else ""
            if event == "return" and frame.f_code.co_name == "end_step" and caller != "end_step":
                self.ends += 1  # the outermost end_step of a step (a schedule's may call the run's)
            elif event == "call" and self.ends == 1:
                self.files.append(rel)


if __name__ == "__main__":
    route = Route()
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        train, test = make_data(root)
        model = make_model(root, train)
        over = train_overrides(model, train, test, root / "run", 2) + ["trainer.backend=in_process"]
        cfg = load_config(None, over)
        threading.setprofile(route)
        sys.setprofile(route)
        try:
            run_training(cfg)
        finally:
            sys.setprofile(None)
            threading.setprofile(None)
    files = route.files
    folder = [str(Path(f).parent) for f in files]
    changes = sum(a != b for a, b in zip(folder, folder[1:]))
    distinct = sorted(set(files))
    print(f"calls {len(files)}, files {len(distinct)}, folders {len(set(folder))}, folder changes {changes}")
    for f in distinct:
        print(" ", f, files.count(f))
