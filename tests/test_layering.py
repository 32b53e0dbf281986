"""The plain-math rooms import without Lightning: one subprocess imports them and lists what
got loaded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LIGHT_MODULES = (
    "vfl_lightning.data.partition",
    "vfl_lightning.privacy.analysis",
    "vfl_lightning.algorithms.zoo",
)


def test_math_modules_do_not_import_lightning():
    script = (
        "import importlib, json, sys\n"
        f"for name in {LIGHT_MODULES!r}:\n"
        "    importlib.import_module(name)\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in "
        "('lightning', 'pytorch_lightning', 'lightning_fabric', 'hydra'))\n"
        "print(json.dumps({'heavy': heavy, 'loaded': [n for n in "
        f"{LIGHT_MODULES!r} if n in sys.modules]}}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, check=True
    )
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["loaded"] == list(LIGHT_MODULES)
    assert report["heavy"] == [], report["heavy"]
