"""``stock_trading``: a batched stock-trading environment on the pod's device.

Each of the ``N`` environments is one trading account in the same market, at its own day:
an episode starts at a day drawn from the env's own random stream (uniform over the trading
window, so the accounts are spread over the whole history, never in lockstep) and lasts
``max_episode_steps`` days (truncated) or until the last day of the window (terminated).

State (float64, one row per env, so that money is exact): ``[cash, holdings (S), day]``
(``env.dtype`` is this float64; observations and rewards come in the ``dtype`` asked for,
``env.obs_dtype``). The market (closes, the observation features, the turbulence index) is a
constant table on the env's device, shared by all envs and indexed by day. The trading window
is the days ``max(start, warmup_bars) .. end`` of the data; a restart draws one uniform from
the env's stream for its start day and opens a fresh account (``initial_cash``, no shares).

Step at day ``d`` (everything is a tensor op over ``[N, S]``; no loop over envs or stocks):

1. The action ``a in [-1, 1]^S`` (clipped; NaN = 0; a single column is broadcast to every
   stock) becomes integer share orders ``trunc(a * max_shares)``. With ``actions="weights"`` it
   is a target portfolio instead: weights ``w = max(a, 0) / max(1, sum max(a, 0))`` (the rest in
   cash) and orders ``floor(w V / close) - holdings`` (``V`` the account's value), then the same
   sells-first and cash rules: a target that is held is not traded again.
2. If ``turbulence_threshold > 0`` and ``turbulence[d] >= turbulence_threshold``, the order is
   replaced by "sell everything" and nothing is bought (the action is ignored that day only).
3. **Sells first**, at ``close[d]``: ``sell = min(-order, holdings)`` (no short selling); cash
   ``+= sell . price * (1 - cost)``.
4. **Buys** at ``close[d]``, limited by cash including costs: the budget is the cash after the
   sells less a 1e-9 relative margin (for floating-point rounding); if the orders ``b`` cost
   more, ``b . price * (1 + cost) > budget``, every order is scaled by the same factor
   ``f = budget / (b . price * (1 + cost))`` and rounded down, ``floor(b * f)``; cash
   ``-= buy . price * (1 + cost)``. So cash and holdings never go negative, and
   ``cash' = cash + sell . price * (1 - cost) - buy . price * (1 + cost)`` exactly.
5. The day advances; ``reward = (V_{d+1} - V_d) * reward_scale`` with ``V = cash + holdings .
   close`` (``V_d`` before the trade: the costs are part of the reward). ``reward_scale = 0``
   means ``100 / initial_cash`` (the reward is the change in % of the initial capital).

Observation (``obs_dim = 10 S + 2``, in the env's ``dtype``), all from data up to day ``d``
(no look-ahead): ``cash / initial_cash``, ``holdings * close / initial_cash`` (S), ``log close``
(S), ``macd / close``, ``rsi / 100``, ``cci / 100``, ``dx / 100``, ``boll_ub / close - 1``,
``boll_lb / close - 1``, ``sma30 / close - 1``, ``sma60 / close - 1`` (S each) and
``log1p(turbulence / S)``. Trades happen at the close the agent observes (the usual daily-bar
assumption).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Sequence

import torch

import podracer_hpc.trading.indicators as ind  # not "from . import": that reads as needing the package
from podracer_hpc.envs.base import TorchVecEnv
from podracer_hpc.envs.registry import options_from
from podracer_hpc.envs.rng import BatchRNG, draw
from podracer_hpc.trading.data import MarketData
from podracer_hpc.trading.fields import MarketSource, market_source
from podracer_hpc.trading.synthetic import synthetic_market
from podracer_hpc.trading.task import ACTIONS, TradingOptions  # noqa: E402,F401  (the declaration, no torch)

# --------------------------------------------------------------------------------------
# The market table shared by every env (computed once per data set and device)
# --------------------------------------------------------------------------------------
OBS_FEATURES = ("log_close", *ind.INDICATORS)


@dataclasses.dataclass
class Market:
    """Closes ``[T, S]`` (float64), the market part of the observation ``[T, 9 S + 1]``, turbulence ``[T]``."""

    data: MarketData
    close: torch.Tensor
    market_obs: torch.Tensor
    turbulence: torch.Tensor
    fingerprint: int

    @property
    def num_days(self) -> int:
        return self.data.num_days

    @property
    def num_stocks(self) -> int:
        return self.data.num_stocks


def market_features(
    md: MarketData, turbulence_window: int = 252, device: str | torch.device = "cpu"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(market observation ``[T, 9 S + 1]`` float64, turbulence ``[T]``) of a market, computed on ``device``
    (:func:`indicators.market_features`; a data file's market is prepared once and cached instead:
    :mod:`podracer_hpc.trading.cache`).

    ``turbulence_window`` 0 (or 1) turns the turbulence index off (it is 0 everywhere).
    """
    dev = torch.device(device)
    return ind.market_features(md.high.to(dev), md.low.to(dev), md.close.to(dev), turbulence_window)


def prepare_market(
    md: MarketData, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32, turbulence_window: int = 252
) -> Market:
    dev = torch.device(device)
    obs, turb = market_features(md, turbulence_window, dev)
    return Market(
        md,
        md.close.to(dev, torch.float64).contiguous(),
        obs.to(dev, dtype).contiguous(),
        turb.to(dev),
        md.fingerprint(),
    )


_CACHE: dict[tuple, Market] = {}
_CACHE_SIZE = 4


def _cached_market(key: tuple, build: Any) -> Market:
    m = _CACHE.get(key)
    if m is None:
        m = build()
        if len(_CACHE) >= _CACHE_SIZE:
            _CACHE.pop(next(iter(_CACHE)))
        _CACHE[key] = m
    return m


def market_of(prepared: Any, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> Market:
    """The env's :class:`Market` (on ``device``) of a prepared market (:class:`cache.PreparedMarket`)."""
    dev = torch.device(device)
    return Market(
        prepared.data,
        prepared.data.close.to(dev, torch.float64),
        prepared.market_obs.to(dev, dtype),
        prepared.turbulence.to(dev),
        prepared.fingerprint,
    )


def get_market(
    data: str | os.PathLike | MarketSource | MarketData | None = None,
    stocks: Sequence[str] = (),
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    turbulence_window: int = 252,
    synthetic_stocks: int = 30,
    synthetic_days: int = 1512,
    synthetic_seed: int = 0,
    synthetic_structure: str = "momentum",
    cache_dir: str | os.PathLike | None = None,
) -> Market:
    """The market of a data file, a :class:`MarketData`, or the synthetic market (``data`` empty).

    A data file's market comes from its prepared-market cache (:func:`cache.open_market`: read and
    memory-mapped, or prepared once under a lock and written; ``cache_dir`` default
    ``$PODRACER_MARKET_CACHE``, else beside the data file). The file is resolved once here
    (:func:`~.fields.market_source`) and handed down."""
    dev = torch.device(device)
    stocks = tuple(stocks or ())
    if isinstance(data, MarketData):
        md = data.select(stocks) if stocks else data
        return prepare_market(md, dev, dtype, turbulence_window)
    if data:
        from podracer_hpc.trading.cache import open_market

        src = market_source(data)
        st = src.path.stat()
        key = (
            "file",
            str(src.path.resolve()),
            st.st_mtime_ns,
            st.st_size,
            stocks,
            str(dev),
            dtype,
            turbulence_window,
            str(cache_dir or ""),
        )
        return _cached_market(
            key, lambda: market_of(open_market(src, stocks, turbulence_window, dtype, cache_dir), dev, dtype)
        )
    key = (
        "synthetic",
        synthetic_stocks,
        synthetic_days,
        synthetic_seed,
        synthetic_structure,
        stocks,
        str(dev),
        dtype,
        turbulence_window,
    )

    def build() -> Market:
        md = synthetic_market(synthetic_stocks, synthetic_days, synthetic_seed, synthetic_structure)
        return prepare_market(md.select(stocks) if stocks else md, dev, dtype, turbulence_window)

    return _cached_market(key, build)


# --------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------
class StockTradingEnv(TorchVecEnv):
    """Batched stock trading (see the module docstring). ``dtype`` is the observation dtype."""

    discrete = False
    default_max_episode_steps = 252
    action_low = -1.0
    action_high = 1.0
    BUY_MARGIN = 1e-9  # relative cash kept back when buys are scaled down (rounding safety)

    def __init__(
        self,
        num_envs: int,
        device: str | torch.device = "cpu",
        seed: int = 0,
        max_episode_steps: int = 0,
        dtype: torch.dtype = torch.float32,
        *,
        data: str | os.PathLike | MarketData | Market | None = None,
        **options: Any,
    ):
        """``options``: the fields of :class:`TradingOptions` (defaults and docs there), checked by it;
        ``data`` is a file, a :class:`MarketData`, a prepared :class:`Market` or None/'' (synthetic)."""
        o = options_from(TradingOptions, options, "stock_trading")  # TypeError / ValueError naming the option
        dev = torch.device(device)
        if isinstance(data, Market):
            market = data
            mdev = market.close.device
            if not (mdev.type == dev.type and (dev.index is None or mdev.index in (None, dev.index))):
                raise ValueError(f"stock_trading: the market lives on {mdev}, the env on {dev}")
        else:
            market = get_market(
                data,
                o.stocks,
                dev,
                dtype,
                o.turbulence_window,
                o.synthetic_stocks,
                o.synthetic_days,
                o.synthetic_seed,
                o.synthetic_structure,
            )
        self.market = market
        md = market.data
        S = md.num_stocks
        self.num_stocks = S
        self.state_dim = S + 2
        self.obs_dim = 10 * S + 2
        self.act_dim = S
        super().__init__(num_envs, device=dev, seed=seed, max_episode_steps=max_episode_steps, dtype=torch.float64)
        self.obs_dtype = dtype

        # the trading window [lo, hi]: day indices into the market table
        start, end = o.start, o.end
        lo = max(md.index_at_or_after(start) if start else 0, min(int(o.warmup_bars), md.num_days - 2))
        hi = md.index_at_or_before(end) if end else md.num_days - 1
        if hi - lo < 1:
            raise ValueError(
                f"stock_trading: the trading window {start or '(data start)'} .. {end or '(data end)'} "
                f"holds fewer than 2 bars of the data ({md.date_strings()[0]} .. {md.date_strings()[-1]}, "
                f"{md.num_days} bars)"
            )
        self.lo, self.hi = int(lo), int(hi)
        self.window = self.hi - self.lo
        self.max_episode_steps = min(self.max_episode_steps, self.window)
        self.random_start = bool(o.random_start)

        self.initial_cash = float(o.initial_cash)
        self.cost = float(o.cost)
        self.max_shares = int(o.max_shares)
        self.actions = o.actions
        self.reward_scale = float(o.reward_scale) or 100.0 / self.initial_cash
        self.turbulence_threshold = float(o.turbulence_threshold)
        self._liquidate = (market.turbulence >= self.turbulence_threshold) if self.turbulence_threshold > 0 else None
        self.data_id = torch.tensor(market.fingerprint, dtype=torch.int64)

    # --- views of the state --------------------------------------------------------------
    def cash(self, state: torch.Tensor) -> torch.Tensor:
        return state[:, 0]

    def holdings(self, state: torch.Tensor) -> torch.Tensor:
        return state[:, 1 : 1 + self.num_stocks]

    def day(self, state: torch.Tensor) -> torch.Tensor:
        return state[:, 1 + self.num_stocks].long()

    def prices(self, state: torch.Tensor) -> torch.Tensor:
        return self.market.close[self.day(state)]

    def portfolio_value(self, state: torch.Tensor) -> torch.Tensor:
        """Cash plus holdings at the day's close, ``[N]`` float64."""
        return state[:, 0] + (self.holdings(state) * self.prices(state)).sum(1)

    def obs_layout(self) -> list[tuple[str, slice]]:
        """(name, columns) of each block of the observation."""
        S = self.num_stocks
        out = [("cash", slice(0, 1)), ("position_value", slice(1, 1 + S))]
        for i, name in enumerate(OBS_FEATURES):
            out.append((name, slice(1 + S * (i + 1), 1 + S * (i + 2))))
        out.append(("turbulence", slice(10 * S + 1, 10 * S + 2)))
        return out

    def asset_layout(self) -> tuple[list[int], list[list[int]]]:
        """(columns about the whole account or market, ``[S][F]`` columns of each stock's features):
        what ``agent.network: per_asset`` shares its weights over (the blocks of :meth:`obs_layout`)."""
        blocks = dict(self.obs_layout())
        glob = [blocks.pop("cash").start, blocks.pop("turbulence").start]
        return glob, [[cols.start + s for cols in blocks.values()] for s in range(self.num_stocks)]

    # --- physics ------------------------------------------------------------------------
    def initial_state(self, u: torch.Tensor) -> torch.Tensor:
        n = u.shape[0]
        if self.random_start:
            day = self.lo + torch.floor(u[:, 0].to(torch.float64) * self.window)
        else:
            day = torch.full((n,), float(self.lo), dtype=torch.float64, device=u.device)
        state = torch.zeros(n, self.state_dim, dtype=torch.float64, device=u.device)
        state[:, 0] = self.initial_cash
        state[:, -1] = day
        return state

    def orders(
        self, state: torch.Tensor, action: torch.Tensor, p: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(shares sold, shares bought) ``[N, S]`` at the current day's close ``p``, by the rules above."""
        sell, buy, _ = self._orders(state, action, p)
        return sell, buy

    def _orders(self, state: torch.Tensor, action: torch.Tensor, p: torch.Tensor | None = None):
        """``orders`` plus the value of the sells ``[N]``."""
        n, S = state.shape[0], self.num_stocks
        a = action.reshape(n, -1)
        if a.shape[1] != S:
            if a.shape[1] != 1:
                raise ValueError(f"stock_trading: action has {a.shape[1]} columns, expected {S} (one per stock) or 1")
            a = a.expand(n, S)
        cash, hold = state[:, 0], state[:, 1 : 1 + S]
        if p is None:
            p = self.market.close.index_select(0, state[:, 1 + S].long())
        a = torch.nan_to_num(a.to(torch.float64), nan=0.0)
        if self.actions == "weights":  # target weights: trade the difference to the target holdings
            w = a.clamp_(0.0, 1.0)
            w = w / w.sum(1, keepdim=True).clamp_(min=1.0)
            value = cash + torch.linalg.vecdot(hold, p)  # the cash check below leaves room for the costs
            x = (w * value[:, None] / p).floor_().sub_(hold)
        else:
            x = a.clamp_(-1.0, 1.0).mul_(self.max_shares)
        # trunc(x) split by sign (floor is much faster than trunc on some CPU builds)
        buy = x.clamp(min=0.0).floor_()
        ask = x.neg_().clamp_(min=0.0).floor_()  # shares the action asks to sell
        if self._liquidate is not None:
            liq = self._liquidate.index_select(0, state[:, 1 + S].long())[:, None]
            ask = torch.where(liq, hold, ask)
            buy = buy.masked_fill_(liq, 0.0)
        sell = torch.minimum(ask, hold)
        sold = torch.linalg.vecdot(sell, p)
        budget = (cash + sold * (1.0 - self.cost)) * (1.0 - self.BUY_MARGIN)
        want = torch.linalg.vecdot(buy, p) * (1.0 + self.cost)
        short = want > budget
        f = torch.where(short, budget / torch.where(short, want, 1.0), 1.0)
        buy = buy.mul_(f[:, None]).floor_()  # f = 1 where affordable: whole orders stay whole
        return sell, buy, sold

    def _dynamics(self, state: torch.Tensor, action: torch.Tensor):
        """``dynamics`` plus the next day's closes ``[N, S]`` (reused by the observation)."""
        S = self.num_stocks
        close = self.market.close
        cash, hold, day_f = state[:, 0], state[:, 1 : 1 + S], state[:, 1 + S]
        day = day_f.long()
        p = close.index_select(0, day)
        p1 = close.index_select(0, day + 1)
        sell, buy, sold = self._orders(state, action, p)
        new_cash = cash + sold * (1.0 - self.cost) - torch.linalg.vecdot(buy, p) * (1.0 + self.cost)
        if torch.compiler.is_compiling():  # torch.compile refuses out= into a strided view
            new_hold = hold + buy.sub_(sell)
            next_state = torch.cat([new_cash[:, None], new_hold, (day_f + 1.0)[:, None]], 1)
        else:  # eager: written in place, one allocation
            next_state = torch.empty_like(state)
            new_hold = torch.add(hold, buy.sub_(sell), out=next_state[:, 1 : 1 + S])
            next_state[:, 0] = new_cash
            next_state[:, 1 + S] = day_f + 1.0
        v0 = cash + torch.linalg.vecdot(hold, p)
        v1 = new_cash + torch.linalg.vecdot(new_hold, p1)
        reward = (v1 - v0) * self.reward_scale
        terminated = next_state[:, 1 + S] >= self.hi
        return next_state, reward, terminated, p1

    def dynamics(self, state: torch.Tensor, action: torch.Tensor):
        next_state, reward, terminated, _ = self._dynamics(state, action)
        return next_state, reward, terminated

    def observe(self, state: torch.Tensor, p: torch.Tensor | None = None) -> torch.Tensor:
        S = self.num_stocks
        day = state[:, 1 + S].long()
        if p is None:
            p = self.market.close.index_select(0, day)
        inv = 1.0 / self.initial_cash
        mo = self.market.market_obs
        if torch.compiler.is_compiling():  # no out= into a strided view under torch.compile
            return torch.cat(
                [
                    (state[:, :1] * inv).to(self.obs_dtype),
                    (state[:, 1 : 1 + S] * p * inv).to(self.obs_dtype),
                    mo.index_select(0, day).to(self.obs_dtype),
                ],
                1,
            )
        obs = torch.empty(state.shape[0], self.obs_dim, dtype=self.obs_dtype, device=state.device)
        obs[:, 0] = state[:, 0] * inv
        obs[:, 1 : 1 + S] = torch.mul(state[:, 1 : 1 + S], p).mul_(inv)
        if mo.dtype == self.obs_dtype:
            torch.index_select(mo, 0, day, out=obs[:, 1 + S :])
        else:
            obs[:, 1 + S :] = mo.index_select(0, day)
        return obs

    # --- the protocol (as TorchVecEnv, with one random draw per restart) ----------------
    def reset(self, seed: int | None = None) -> torch.Tensor:
        """Start a new episode in every environment; a seed restarts every stream."""
        if seed is not None:
            self.seed = seed
            self.rng = BatchRNG(seed, self.num_envs, self.device)
        self.state = self.initial_state(self.rng.uniform(1, dtype=torch.float64))
        self.t.zero_()
        self.ep_return.zero_()
        return self.observe(self.state)

    def pure_step(self, state, t, ep_return, key, counter, action):
        """The whole step, branch-free (the GPU and ``compile`` path; same results as ``step`` on CPU)."""
        next_state, reward, terminated, p1 = self._dynamics(state, action)
        t = t + 1
        truncated = (t >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        final_obs = self.observe(next_state, p1)
        ep_ret = ep_return + reward
        u, counter = draw(key, counter, 1, done, torch.float64)
        new_state = torch.where(done[:, None], self.initial_state(u), next_state)
        obs = torch.where(done[:, None], self.observe(new_state), final_obs)
        return (
            new_state,
            torch.where(done, 0, t),
            torch.where(done, 0.0, ep_ret),
            counter,
            obs,
            reward.to(self.obs_dtype),
            terminated,
            truncated,
            final_obs,
            done,
            ep_ret,
            t,
        )

    def step(self, action: torch.Tensor):
        if self._compiled_step is not None:
            return super().step(action)
        if self.device.type != "cpu":  # branch-free: no host sync
            return self._apply(
                self.pure_step(self.state, self.t, self.ep_return, self.rng.key, self.rng.counter, action)
            )
        # CPU: checking on the host is free, so only finished envs are restarted and observed again
        next_state, reward, terminated, p1 = self._dynamics(self.state, action)
        t = self.t + 1
        truncated = (t >= self.max_episode_steps) & ~terminated
        done = terminated | truncated
        obs = self.observe(next_state, p1)
        ep_ret = self.ep_return + reward
        final_obs = obs
        if bool(done.any()):
            final_obs = obs.clone()
            u, self.rng.counter = draw(self.rng.key, self.rng.counter, 1, done, torch.float64)
            idx = done.nonzero().squeeze(1)
            fresh = self.initial_state(u.index_select(0, idx))
            next_state.index_copy_(0, idx, fresh)
            obs.index_copy_(0, idx, self.observe(fresh))
            self.t = torch.where(done, 0, t)
            self.ep_return = torch.where(done, 0.0, ep_ret)
        else:
            self.t, self.ep_return = t, ep_ret
        self.state = next_state
        info = {"final_obs": final_obs, "done": done, "episode_return": ep_ret, "episode_length": t}
        return obs, reward.to(self.obs_dtype), terminated, truncated, info

    # --- checkpoints --------------------------------------------------------------------
    def state_dict(self) -> dict[str, torch.Tensor]:
        sd = super().state_dict()
        sd["data_id"] = self.data_id.clone()
        sd["window"] = torch.tensor([self.lo, self.hi], dtype=torch.int64)
        # the tickers, in order, so that a backtest of this checkpoint trades the same stocks
        sd["tickers"] = torch.tensor(list("\n".join(self.market.data.tickers).encode()), dtype=torch.uint8)
        return sd

    def load_state_dict(self, sd: dict[str, torch.Tensor]) -> None:
        if "data_id" in sd and int(sd["data_id"]) != int(self.data_id):
            raise ValueError(
                "stock_trading: the env state was saved on other market data (data file, stocks or "
                "synthetic market changed since the checkpoint)"
            )
        if "window" in sd and sd["window"].tolist() != [self.lo, self.hi]:
            raise ValueError(
                f"stock_trading: the env state was saved for trading window days {sd['window'].tolist()}, "
                f"this env trades days {[self.lo, self.hi]} (env.trading.start/end changed?)"
            )
        super().load_state_dict({k: v for k, v in sd.items() if k not in ("data_id", "window", "tickers")})


def tickers_from_state(sd: dict[str, torch.Tensor]) -> list[str] | None:
    """The tickers saved by ``StockTradingEnv.state_dict`` (keys with or without the ``env.`` prefix)."""
    t = sd.get("tickers", sd.get("env.tickers"))
    if t is None:
        return None
    return bytes(t.to("cpu", torch.uint8).tolist()).decode().split("\n")


__all__ = [
    "StockTradingEnv",
    "TradingOptions",
    "tickers_from_state",
    "Market",
    "get_market",
    "market_of",
    "prepare_market",
    "market_features",
    "OBS_FEATURES",
]
