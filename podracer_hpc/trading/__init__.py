"""Stock trading on batched environments: market data, indicators, a synthetic market, the
``stock_trading`` env (its settings: :class:`TradingOptions`, config section ``env.trading``)
and a backtest (see docs/trading.md).

Importing this package imports no torch (the task's declaration, trading/task.py, is read by
``podracer config``); the names below load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "DataError": ".data",
    "MarketData": ".data",
    "from_arrays": ".data",
    "load_market": ".data",
    "Market": ".env",
    "StockTradingEnv": ".env",
    "TradingOptions": ".task",
    "get_market": ".env",
    "synthetic_history": ".synthetic",
    "synthetic_market": ".synthetic",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "DataError",
    "MarketData",
    "from_arrays",
    "load_market",
    "Market",
    "StockTradingEnv",
    "TradingOptions",
    "get_market",
    "synthetic_history",
    "synthetic_market",
]
