"""The command line of ``podracer backtest`` (its arguments only): ``podracer backtest --help`` and
a usage error are answered from here, without loading torch or the trading env."""

from __future__ import annotations

import argparse

__all__ = ["parser"]


def parser() -> argparse.ArgumentParser:
    """The arguments of ``podracer backtest``."""
    ap = argparse.ArgumentParser(
        prog="podracer backtest",
        description="Backtest a stock_trading checkpoint on a held-out period next to equal-weight buy and hold and "
        "a minimum-variance portfolio. Settings not given default to the checkpoint's env config.",
    )
    ap.add_argument("checkpoint", help="a pod checkpoint (checkpoints/rank<r>.safetensors) or a leaderboard entry")
    ap.add_argument(
        "--data",
        default=None,
        help="long-format bars (CSV/Parquet/HDF5); default: the run's env.trading.data "
        "(the synthetic market when empty)",
    )
    ap.add_argument(
        "--start", default=None, help="first day (default: the day after the run's env.trading.end, if set)"
    )
    ap.add_argument("--end", default=None, help="last day (default: the end of the data)")
    ap.add_argument("--stocks", default=None, help="comma-separated tickers (default: the run's env.trading.stocks)")
    ap.add_argument("--initial-cash", type=float, default=None)
    ap.add_argument("--cost", type=float, default=None, help="proportional transaction cost, e.g. 0.002")
    ap.add_argument("--max-shares", type=int, default=None)
    ap.add_argument("--turbulence-threshold", type=float, default=None, help="0 = never liquidate")
    ap.add_argument("--periods-per-year", type=float, default=None, help="default: inferred from the bar spacing")
    ap.add_argument("--minvar-lookback", type=int, default=252, help="returns in the minimum-variance estimate")
    ap.add_argument(
        "--rebalance-every",
        type=int,
        default=0,
        help="rebalance the minimum-variance portfolio every k bars (0: never)",
    )
    ap.add_argument("--plot", default="backtest.png", help="PNG of the account values ('' for none)")
    ap.add_argument("--device", default="cpu")
    from podracer_hpc.tools.trust import add_arguments  # no torch either: --config, --trust-config, ...

    add_arguments(ap)
    return ap
