"""Stock trading on batched environments: market data, indicators, a synthetic market, the
``stock_trading`` env and a backtest (see docs/trading.md)."""

# Import order: podracer_hpc.envs registers this package's env in its TASKS, so it must be
# initialized first (importing trading.env inside it while this package is half-imported is fine).
from .. import envs as _envs  # noqa: F401  isort: skip
from .data import DataError, MarketData, from_arrays, load_market
from .env import CONFIG_KEYS, Market, StockTradingEnv, env_options, get_market
from .synthetic import synthetic_history, synthetic_market

__all__ = ["DataError", "MarketData", "from_arrays", "load_market", "CONFIG_KEYS", "Market", "StockTradingEnv",
           "env_options", "get_market", "synthetic_history", "synthetic_market"]
