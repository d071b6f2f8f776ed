"""scripts/strip_ray_wheel.py on a small wheel of Ray's layout: the parts `hybrid cluster` never
loads are gone, the rest is byte for byte, and RECORD lists exactly what stays (pip installs it;
the real Ray wheel so stripped passes tests/test_replicas.py: docs/tuning.md)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KEPT = ["ray/__init__.py", "ray/serve/api.py", "ray/core/src/ray/raylet/raylet",
        "ray/dashboard/modules/x.py", "ray/_raylet.so"]
DROPPED = ["ray/jars/ray_dist.jar", "ray/dashboard/client/build/index.html",
           "ray/rllib/algorithms/ppo.py", "ray/data/dataset.py", "ray/train/v2/x.py",
           "ray/tune/tuner.py", "ray/llm/_internal/x.py"]
VENDORED = "ray/thirdparty_files/colorama-0.4.6.dist-info/RECORD"
VENDORED_RECORD = "colorama/__init__.py,sha256=y,2\ncolorama-0.4.6.dist-info/RECORD,,\n"


def test_strips_what_cluster_never_loads(tmp_path) -> None:
    wheel = tmp_path / "ray-9.9.9-cp312-cp312-manylinux2014_x86_64.whl"
    record = "ray-9.9.9.dist-info/RECORD"
    with zipfile.ZipFile(wheel, "w") as z:
        for name in KEPT + DROPPED:
            z.writestr(name, f"bytes of {name}")
        z.writestr("ray-9.9.9.dist-info/METADATA", "Name: ray\n")
        z.writestr(record, "".join(f"{n},sha256=x,1\n" for n in KEPT + DROPPED) + f"{record},,\n")
        # a vendored package's RECORD lists paths of its own: it stays as it was (emptied, it
        # broke importlib.metadata, which transformers walks at import)
        z.writestr(VENDORED, VENDORED_RECORD)
    out = subprocess.run([sys.executable, str(ROOT / "scripts/strip_ray_wheel.py"), str(wheel),
                          "--dest", str(tmp_path / "out")], capture_output=True, text=True,
                         check=True).stdout
    assert "MB ->" in out
    with zipfile.ZipFile(tmp_path / "out" / wheel.name) as z:
        names = set(z.namelist())
        assert names == {*KEPT, "ray-9.9.9.dist-info/METADATA", record, VENDORED}
        assert z.read(VENDORED).decode() == VENDORED_RECORD
        assert all(z.read(n) == f"bytes of {n}".encode() for n in KEPT)
        listed = [line.split(",")[0] for line in z.read(record).decode().splitlines()]
    assert sorted(listed) == sorted([*KEPT, record])
