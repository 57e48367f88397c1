"""The ``podracer`` console script: train | bench | config."""

from __future__ import annotations

import argparse
import json
import sys

from .config import ConfigError, describe, load_config


def _cmd_train(args: argparse.Namespace) -> int:
    from .run import EXIT_REQUEUE, TrainingError, train
    from .safeio import StateFileError

    cfg = load_config(args.config, args.set)
    try:
        result = train(cfg, run_dir=args.run_dir, stop_after_updates=args.stop_after_updates, quiet=args.quiet)
    except (StateFileError, TrainingError) as e:
        print(f"podracer train: error: {e}", file=sys.stderr)
        return 2
    from .comm import get_comm

    if get_comm().rank == 0:
        print(json.dumps(result.summary), flush=True)
    return 0 if result.complete else EXIT_REQUEUE


def _cmd_bench(args: argparse.Namespace) -> int:
    from . import bench

    if args.what == "env":
        out = bench.bench_env(args.task, args.num_envs, device=args.device, seconds=args.seconds,
                              gym_envs=args.gym_envs, compile_mode=args.compile)
    else:
        out = bench.bench_train(args.config, args.set, seconds=args.seconds)
    print(out["table"])
    print(json.dumps(out["result"]), flush=True)
    return 0


def _cmd_config(args: argparse.Namespace) -> int:
    if args.config:
        import yaml

        from .config import to_dict

        print(yaml.safe_dump(to_dict(load_config(args.config, args.set)), sort_keys=False), end="")
        return 0
    width = max(len(k) for k, _, _ in describe())
    for key, doc, default in describe():
        print(f"{key:<{width}}  {default!r:<12}  {doc}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="podracer", description="Massively parallel deep RL pods on Slurm clusters.")
    sub = p.add_subparsers(dest="cmd", required=True)

    t = sub.add_parser("train", help="train one pod per MPI rank (run under mpiexec/srun for a pool)")
    t.add_argument("config", help="job file, e.g. jobs/pendulum.yaml")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a config key (dotted)")
    t.add_argument("--run-dir", default=None, help="run directory (default runs/<name>); resumed if it has checkpoints")
    t.add_argument("--stop-after-updates", type=int, default=0, metavar="N",
                   help="checkpoint and stop after N updates of this invocation (time slicing, tests)")
    t.add_argument("--quiet", action="store_true", help="no periodic progress lines (events and errors are still printed)")
    t.set_defaults(func=_cmd_train)

    b = sub.add_parser("bench", help="benchmarks: a table, then one JSON line")
    bsub = b.add_subparsers(dest="what", required=True)
    be = bsub.add_parser("env", help="env steps/s over num_envs, next to gymnasium's SyncVectorEnv")
    be.add_argument("--task", default="pendulum")
    be.add_argument("--num-envs", type=int, nargs="+", default=[1, 64, 4096, 65536])
    be.add_argument("--gym-envs", type=int, default=64, help="SyncVectorEnv size of the reference (0 = skip)")
    be.add_argument("--seconds", type=float, default=2.0, help="time per measurement")
    be.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    be.add_argument("--compile", default=None, metavar="MODE",
                    help="also measure the torch.compile'd step (default | reduce-overhead: CUDA graphs)")
    be.set_defaults(func=_cmd_bench)
    bt = bsub.add_parser("train", help="end-to-end training throughput (env steps/s, learning included)")
    bt.add_argument("config", nargs="?", default=None, help="job file (default: jobs/pendulum.yaml settings)")
    bt.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    bt.add_argument("--seconds", type=float, default=10.0)
    bt.set_defaults(func=_cmd_bench)

    c = sub.add_parser("config", help="list every config key with its doc, or print a resolved job file")
    c.add_argument("config", nargs="?", default=None)
    c.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    c.set_defaults(func=_cmd_config)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"podracer {args.cmd}: config error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
