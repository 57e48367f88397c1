"""``podracer data prepare|info SOURCE``: the stock-trading task's prepared-market cache of a data
file, or of a job's ``env.trading`` settings. A tool above the task (it reads job files through
config.py); the cache itself is the task's (trading/cache.py)."""

from __future__ import annotations

import json
import sys
from typing import Sequence

from podracer_hpc.config import load_config
from podracer_hpc.trading.cache import cache_status, open_market, say_to_stderr
from podracer_hpc.trading.fields import DataError, market_source

__all__ = ["data_command"]


def _settings(source: str, sets: Sequence[str]) -> tuple[str, list[str], int]:
    """(data, stocks, turbulence window) of a job file or of a data file with ``--set`` overrides."""
    if source.endswith((".yaml", ".yml")):
        cfg = load_config(source, list(sets))
        if cfg.env.name != "stock_trading":
            raise DataError(f"{source}: trains {cfg.env.name!r}, not stock_trading: it has no market data")
    else:
        short = [s if s.split("=", 1)[0].startswith("env.") or "=" not in s else f"env.trading.{s}" for s in sets]
        cfg = load_config(None, ["env.name=stock_trading", *short, f"env.trading.data={source}"])
    t = cfg.env.trading
    if not t.data:
        raise DataError(f"{source}: env.trading.data is empty (the synthetic market): there is no data file to prepare")
    return str(t.data), list(t.stocks or []), int(t.turbulence_window)


def data_command(
    what: str, source: str, sets: Sequence[str] = (), cache_dir: str | None = None, force: bool = False
) -> int:
    """``podracer data prepare|info SOURCE``: prepare (or report on) the market cache of a data file or of a
    job's ``env.trading`` settings. Prints a table, then one JSON line; 2 on bad input."""
    try:
        data, stocks, window = _settings(source, sets)
        src = market_source(data)  # resolved once: the cache and the table below use it
        if what == "info":
            path, state = cache_status(src, stocks, window, cache_dir=cache_dir)
            print(f"{'cache':<10}{path}\n{'state':<10}{state}")
            print(json.dumps({"cache": str(path), "fresh": state == "fresh", "state": state}))
            return 0
        m = open_market(
            src, stocks, window, cache_dir=cache_dir, force=force, progress=say_to_stderr("[podracer data]")
        )
    except DataError as e:
        print(f"podracer data: error: {e}", file=sys.stderr)
        return 2
    md = m.data
    ds = md.date_strings()
    size = m.path.stat().st_size / 1e6 if m.path else 0.0
    rows = [
        ("cache", f"{m.path or '(not written: see above)'}"),
        ("state", f"{'prepared' if m.prepared_here else 'fresh, opened'} in {m.seconds:.2f} s"),
        ("data", f"{src.path}"),
        ("tickers", f"{md.num_stocks}: {', '.join(md.tickers[:10])}{', ...' if md.num_stocks > 10 else ''}"),
        ("times", f"{md.num_days:,}: {ds[0]} .. {ds[-1]}"),
        (
            "features",
            f"{tuple(m.market_obs.shape)} {str(m.market_obs.dtype).replace('torch.', '')}, turbulence window {window}",
        ),
        ("file", f"{size:,.1f} MB"),
        *(("note", n) for n in md.notes),
    ]
    for k, v in rows:
        print(f"{k:<10}{v}")
    print(
        json.dumps(
            {
                "cache": str(m.path) if m.path else None,
                "prepared": m.prepared_here,
                "seconds": round(m.seconds, 3),
                "times": md.num_days,
                "tickers": md.num_stocks,
                "first": ds[0],
                "last": ds[-1],
                "size_mb": round(size, 1),
                "notes": md.notes,
            }
        )
    )
    return 0
