"""Stock trading on batched environments: market data, indicators, a synthetic market, the
``stock_trading`` env (its settings: :class:`TradingOptions`, config section ``env.trading``)
and a backtest (see docs/trading.md)."""

from .data import DataError, MarketData, from_arrays, load_market
from .env import Market, StockTradingEnv, TradingOptions, get_market
from .synthetic import synthetic_history, synthetic_market

__all__ = ["DataError", "MarketData", "from_arrays", "load_market", "Market", "StockTradingEnv", "TradingOptions",
           "get_market", "synthetic_history", "synthetic_market"]
