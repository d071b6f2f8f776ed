"""A Ray wheel without the parts `hybrid cluster` never loads, small enough to carry to the GPU
machine (the device tool carries 64 MiB in all; ray 2.60's cp312 wheel is 79 MB, 32 MB of it
Java jars): the jars, the dashboard's web client, RLlib, Ray Data, Train, Tune and Ray LLM go,
the rest is rewritten with a RECORD that lists only what stays.

    python scripts/strip_ray_wheel.py ray-2.60.0-cp312-cp312-manylinux2014_x86_64.whl \\
        --dest .ray/

With those parts removed from an installed Ray, tests/test_replicas.py passes (two replicas,
prefix affinity, 16 clients, a killed replica) on this machine; Ray Serve's own dependencies
(aiohttp, grpcio, opencensus, ...) still have to travel beside it.
"""

from __future__ import annotations

import argparse
import zipfile
from pathlib import Path

DROPPED = ("ray/jars/", "ray/dashboard/client/", "ray/rllib/", "ray/data/", "ray/train/",
           "ray/tune/", "ray/llm/")


def strip(wheel: Path, dest: Path) -> Path:
    """Write `wheel` less DROPPED into dest (same name) -> its path."""
    dest.mkdir(parents=True, exist_ok=True)
    out = dest / wheel.name
    if out.resolve() == wheel.resolve():
        raise SystemExit(f"{out} would overwrite the wheel read: give another --dest")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as dst:
        kept = [i for i in src.infolist() if not i.filename.startswith(DROPPED)]
        names = {i.filename for i in kept}
        for info in kept:
            data = src.read(info)
            if "/" not in info.filename.removesuffix(".dist-info/RECORD"):
                # the wheel's own RECORD only: the vendored packages' RECORDs under
                # ray/thirdparty_files/ list paths of their own, and an emptied one breaks
                # importlib.metadata (transformers walks every distribution on sys.path)
                lines = data.decode().splitlines()
                data = "".join(ln + "\n" for ln in lines if ln.split(",")[0] in names).encode()
            dst.writestr(info, data, compress_type=zipfile.ZIP_DEFLATED)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheel", type=Path)
    ap.add_argument("--dest", type=Path, default=Path(".ray"))
    a = ap.parse_args()
    out = strip(a.wheel, a.dest)
    print(f"{out}: {a.wheel.stat().st_size / 1e6:.1f} MB -> {out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
