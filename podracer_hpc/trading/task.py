"""The stock-trading task, declared: its ``env.trading`` options (defaults, docs, checks) and where
its env class lives (trading/env.py, imported when a pod builds one). This module imports no
torch (the registry reads it for ``podracer config`` and ``podracer submit --dry-run``)."""

from __future__ import annotations

import dataclasses
import math

from podracer_hpc.docfield import F
from podracer_hpc.envs.registry import Lazy, OptionError, Task, register

__all__ = ["ACTIONS", "STRUCTURES", "TradingOptions"]

STRUCTURES = ("none", "momentum", "mean_reversion", "mixed")  # the synthetic market's predictable structure
ACTIONS = ("shares", "weights")


@dataclasses.dataclass
class TradingOptions:
    """stock_trading settings (market data, costs, capital).

    The config section ``env.trading`` and the keyword options of :class:`StockTradingEnv`: the
    one place of their defaults, docs and checks (``podracer backtest`` reads them too)."""

    data: str = F("", "long-format bars (CSV, Parquet, HDF5: date, ticker, OHLCV); '' = synthetic market")
    stocks: list = F([], "tickers to trade, in this order; [] = every ticker the alignment keeps")
    start: str = F("", "first day of the training window (e.g. 2016-01-04); '' = data start + warmup_bars")
    end: str = F("", "last day of the training window; '' = the data's last day (a backtest starts after it)")
    initial_cash: float = F(1_000_000.0, "cash of a new account")
    cost: float = F(0.001, "proportional transaction cost of a buy or a sell (0.002 = 0.2%)")
    max_shares: int = F(100, "largest order per stock per step, in shares (action +-1; actions=shares)")
    actions: str = F(
        "shares",
        "shares: a_i x max_shares shares bought (+) or sold (-); weights: target portfolio "
        "weights max(a_i, 0), scaled to sum to at most 1, the rest in cash",
    )
    reward_scale: float = F(0.0, "reward = change in account value x this; 0 = 100 / initial_cash (percent)")
    turbulence_threshold: float = F(0.0, "sell everything and buy nothing at or above this turbulence; 0 = never")
    turbulence_window: int = F(252, "past returns (bars) in the turbulence index's covariance; 0 = no index")
    warmup_bars: int = F(60, "bars at the start of the data used only to warm up the indicators")
    random_start: bool = F(True, "each env starts at a random day of the window (false: all at its first day)")
    synthetic_stocks: int = F(30, "assets of the synthetic market (when data is '')")
    synthetic_days: int = F(1512, "business days of the synthetic market")
    synthetic_seed: int = F(0, "seed of the synthetic market (the same for every pod)")
    synthetic_structure: str = F("momentum", "predictable structure: none | momentum | mean_reversion | mixed")

    def check(self) -> None:
        """Raise :class:`OptionError` naming the first setting out of its range (what the env cannot run)."""

        def need(ok: bool, key: str, why: str) -> None:
            if not ok:
                raise OptionError(key, why)

        need(
            math.isfinite(self.initial_cash) and self.initial_cash > 0,
            "initial_cash",
            f"must be a finite amount > 0, got {self.initial_cash}",
        )
        need(
            0 <= self.cost < 1,
            "cost",
            f"must be in [0, 1) (a fraction of the traded value: 0.002 = 0.2%), got {self.cost}",
        )
        need(self.max_shares >= 1, "max_shares", f"must be >= 1, got {self.max_shares}")
        need(self.actions in ACTIONS, "actions", f"must be one of {', '.join(ACTIONS)}, got {self.actions!r}")
        need(
            math.isfinite(self.reward_scale) and self.reward_scale >= 0,
            "reward_scale",
            f"must be >= 0 (0 = 100 / initial_cash), got {self.reward_scale}",
        )
        need(
            self.turbulence_threshold >= 0,
            "turbulence_threshold",
            f"must be >= 0 (0 = off), got {self.turbulence_threshold}",
        )
        need(
            self.turbulence_window >= 0,
            "turbulence_window",
            f"must be >= 0 (0 = no index), got {self.turbulence_window}",
        )
        need(self.warmup_bars >= 0, "warmup_bars", f"must be >= 0, got {self.warmup_bars}")
        need(self.synthetic_stocks >= 1, "synthetic_stocks", f"must be >= 1, got {self.synthetic_stocks}")
        need(self.synthetic_days >= 2, "synthetic_days", f"must be >= 2, got {self.synthetic_days}")
        need(
            self.synthetic_structure in STRUCTURES,
            "synthetic_structure",
            f"must be one of {', '.join(STRUCTURES)}, got {self.synthetic_structure!r}",
        )


register(
    Task(
        "stock_trading",
        build=Lazy("podracer_hpc.trading.env", "StockTradingEnv"),
        options=TradingOptions,
        section="trading",
        assets=True,
        doc="trade a portfolio of stocks on daily or minute bars (docs/trading.md)",
    )
)
