"""`hybrid cluster`: `hybrid serve`'s flags, plus how many replicas of the engine to run and
what each gets, on Ray Serve (server/replicas/; the `cluster` extra). Without --ray-address it
starts a Ray instance of its own on this machine; `--ray-address auto` joins the running
cluster (`ray start --head` on one machine, `ray start --address ...` on the others)."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading


def cmd_cluster(args: argparse.Namespace) -> int:
    from hybrid.errors import HybridError
    from server.config import ServerConfig
    from server.listen import bind_listener

    try:
        from server.replicas import deployment
    except ImportError as e:
        raise HybridError(f"hybrid cluster needs Ray Serve ({e}): pip install -e '.[cluster]' "
                          f"(or pip install 'ray[serve]')") from None
    config = ServerConfig.from_flat({name: getattr(args, name) for name in args.settings})
    if args.replicas < 1:
        raise HybridError(f"--replicas must be at least 1, got {args.replicas}")
    gpus = args.replica_gpus if args.replica_gpus is not None else _default_gpus()
    cpus = args.replica_cpus or max(1, (os.cpu_count() or 2) // args.replicas)
    if args.ray_address is None and gpus * args.replicas > _gpu_count():
        raise HybridError(f"{args.replicas} replicas of {gpus:g} GPUs need "
                          f"{gpus * args.replicas:g} GPUs; this machine has {_gpu_count()}: "
                          f"lower --replicas or --replica-gpus (0: CPU only)")
    bind_listener(config.host, config.port).close()  # a port in use fails now, not after loading
    done = threading.Event()  # a signal, also one that comes while the replicas start
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    if args.ray_address is None and args.replicas > 1:
        print(f"note: {args.replicas} replicas on one machine share its memory bandwidth, where "
              f"experts that run on the CPU are read: with those, they serve about what one "
              f"does; they scale where each replica's GPU holds the experts, or across "
              f"machines (docs/tuning.md)", file=sys.stderr, flush=True)
    url = deployment.start(config, args.replicas, gpus, cpus, address=args.ray_address)
    if not done.is_set():
        threads = config.engine.cpu_threads or deployment.replica_threads(cpus)
        print(f"serving on {url}/v1 with {args.replicas} replicas ({gpus:g} GPUs, {cpus:g} "
              f"CPUs and {threads} CPU expert threads each; Ray Serve); Ctrl-C stops",
              file=sys.stderr, flush=True)
    done.wait()
    print("shutting down the replicas", file=sys.stderr, flush=True)
    deployment.stop()
    return 0


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _default_gpus() -> float:
    return 1.0 if _gpu_count() else 0.0


def add_cluster_parser(sub: argparse._SubParsersAction) -> None:
    from cli.flags import add_flags
    from hybrid.engine.config import EngineConfig
    from server.config import ServerConfig

    p = sub.add_parser("cluster", help="serve N replicas of the engine behind one endpoint "
                                       "(Ray Serve; pip install -e '.[cluster]')")
    names = add_flags(p, EngineConfig, ServerConfig)
    p.add_argument("--replicas", type=int, default=2, help="engine replicas (each loads the model)")
    p.add_argument("--replica-gpus", type=float, default=None,
                   help="GPUs a replica takes (default: 1 where CUDA is, else 0)")
    p.add_argument("--replica-cpus", type=float, default=None,
                   help="logical CPUs a replica takes (default: split evenly); its CPU "
                        "experts' threads, unless --cpu-threads says, are its share of the "
                        "physical cores less 4 left to Ray, less one")
    p.add_argument("--ray-address", default=None,
                   help="join a Ray cluster ('auto': the one this machine is in; ray://host:"
                        "10001) instead of starting a local Ray instance")
    p.set_defaults(func=cmd_cluster, settings=tuple(names))
