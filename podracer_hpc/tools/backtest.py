"""Backtest a trading policy on a held-out period, beside two passive baselines.

``backtest(policy, data, start, end)`` runs the deterministic policy (a callable on
observations, or a pod checkpoint / leaderboard entry) in one ``stock_trading`` account from
``start`` to ``end``, trading at each bar's close with the env's rules and costs, and reports for
it and for

- **equal-weight buy and hold**: the initial cash split equally over the stocks at the first
  bar's close (fractional shares, the transaction cost paid once), then held;
- **minimum variance**: the long-only portfolio of least variance (``min w' Sigma w``, ``w >= 0``,
  ``sum w = 1``, by projected gradient on the simplex) with ``Sigma`` the covariance of the
  ``minvar_lookback`` returns up to the first bar (no look-ahead), bought like the equal-weight
  one; with ``rebalance_every = k > 0`` it is re-estimated from the trailing returns and traded
  back to its weights every k bars, paying the cost on the turnover.

Metrics (``metrics``, from the account values ``v_0 .. v_n`` and the per-bar returns
``r_t = v_t / v_{t-1} - 1``, ``P`` bars per year: 252 for daily bars, 252 x bars per day
otherwise):

- cumulative return ``v_n / v_0 - 1``; annual return ``(v_n / v_0) ** (P / n) - 1``;
- annual volatility ``std(r, ddof=1) sqrt(P)``; Sharpe ratio ``mean(r) / std(r, ddof=1) sqrt(P)``
  (risk-free rate 0);
- max drawdown ``min_t (v_t / max_{s <= t} v_s - 1)`` (a negative fraction);
  Calmar ratio ``annual return / |max drawdown|``. Undefined values are ``None``.

``main(argv)`` is the command line (``podracer backtest CHECKPOINT --data FILE --start ...
--end ...``): a table, a PNG of the account values, and a last line of JSON.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from podracer_hpc.docfield import ConfigError
from podracer_hpc.envs.registry import as_kwargs, options_from
from podracer_hpc.tools.backtest_args import parser
from podracer_hpc.tools.trust import from_args
from podracer_hpc.trading.data import MarketData
from podracer_hpc.trading.env import Market, StockTradingEnv, get_market, market_of, tickers_from_state
from podracer_hpc.trading.fields import DataError, is_daily, market_source
from podracer_hpc.trading.task import TradingOptions

METRICS = ("cumulative_return", "annual_return", "annual_volatility", "sharpe_ratio", "max_drawdown", "calmar_ratio")
Policy = Callable[[torch.Tensor], torch.Tensor]
_DEFAULT = TradingOptions()  # the env's settings (defaults: TradingOptions, config section env.trading)


# --------------------------------------------------------------------------------------
# Metrics
# --------------------------------------------------------------------------------------
def _num(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None


def metrics(values: Sequence[float] | np.ndarray, periods_per_year: float = 252.0) -> dict[str, float | None]:
    """Performance of an account-value series (see the module docstring)."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 1 or len(v) < 2:
        raise ValueError("metrics need at least two account values")
    if not (v > 0).all():
        raise ValueError("account values must be > 0")
    n = len(v) - 1
    r = v[1:] / v[:-1] - 1.0
    growth = v[-1] / v[0]
    cum = growth - 1.0
    ann = growth ** (periods_per_year / n) - 1.0
    sd = float(np.std(r, ddof=1)) if n > 1 else math.nan
    vol = sd * math.sqrt(periods_per_year)
    sharpe = float(np.mean(r)) / sd * math.sqrt(periods_per_year) if sd > 0 else math.nan
    peak = np.maximum.accumulate(v)
    mdd = float(np.min(v / peak - 1.0))
    calmar = ann / abs(mdd) if mdd < 0 else math.nan
    return {
        "cumulative_return": _num(cum),
        "annual_return": _num(ann),
        "annual_volatility": _num(vol),
        "sharpe_ratio": _num(sharpe),
        "max_drawdown": _num(mdd),
        "calmar_ratio": _num(calmar),
    }


def infer_periods_per_year(dates: np.ndarray) -> float:
    """252 for daily (or coarser) bars; 252 x the median number of bars per day otherwise."""
    if len(dates) < 2 or is_daily(dates):
        return 252.0
    days = dates.astype("datetime64[D]")
    _, counts = np.unique(days, return_counts=True)
    return 252.0 * float(np.median(counts))


# --------------------------------------------------------------------------------------
# Baselines
# --------------------------------------------------------------------------------------
def min_variance_weights(rets: np.ndarray, iters: int = 3000) -> np.ndarray:
    """Long-only minimum-variance weights of returns ``[n, S]`` (projected gradient on the simplex)."""
    n, S = rets.shape
    if S == 1:
        return np.ones(1)
    if n < 2:
        return np.full(S, 1.0 / S)
    cov = np.cov(rets, rowvar=False, ddof=1).reshape(S, S)
    cov = cov + np.eye(S) * (1e-10 + 1e-6 * np.trace(cov) / S)  # a touch of shrinkage: never singular
    step = 1.0 / max(np.linalg.eigvalsh(cov).max(), 1e-18)
    w = np.full(S, 1.0 / S)
    for _ in range(iters):
        w = _project_simplex(w - step * (cov @ w))
    return w


def _project_simplex(y: np.ndarray) -> np.ndarray:
    """Euclidean projection onto {w >= 0, sum w = 1} (Held et al.; Duchi et al. 2008)."""
    u = np.sort(y)[::-1]
    css = np.cumsum(u) - 1.0
    k = np.arange(1, len(y) + 1)
    rho = np.nonzero(u - css / k > 0)[0][-1]
    return np.maximum(y - css[rho] / (rho + 1.0), 0.0)


def _buy_and_hold(close: np.ndarray, weights: np.ndarray, cash: float, cost: float) -> np.ndarray:
    shares = cash * weights / (close[0] * (1.0 + cost))
    return close @ shares


def _min_variance_path(
    close_all: np.ndarray, lo: int, hi: int, cash: float, cost: float, lookback: int, rebalance_every: int
) -> tuple[np.ndarray, np.ndarray]:
    rets = close_all[1:] / close_all[:-1] - 1.0  # rets[t-1] is the return into bar t

    def weights_at(t: int) -> np.ndarray:
        a = max(0, t - lookback)
        return min_variance_weights(rets[a:t])  # returns into bars a+1 .. t: all known at t

    w0 = weights_at(lo)
    close = close_all[lo : hi + 1]
    if rebalance_every <= 0:
        return _buy_and_hold(close, w0, cash, cost), w0
    shares = cash * w0 / (close[0] * (1.0 + cost))
    values = np.empty(len(close))
    for k in range(len(close)):
        p = close[k]
        v = float(shares @ p)
        if k > 0 and k % rebalance_every == 0:
            w = weights_at(lo + k)
            turnover = np.abs(w * v - shares * p).sum()
            v_after = v - cost * turnover  # cost on the traded value (first order in cost)
            shares = v_after * w / p
            v = v_after
        values[k] = v
    return values, w0


# --------------------------------------------------------------------------------------
# Policies from checkpoints
# --------------------------------------------------------------------------------------
EXPORTED_META = "podracer.json"  # the extra file of an exported (TorchScript) policy


def load_exported_policy(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> tuple[Policy, dict[str, Any]] | None:
    """An exported policy (another system's, e.g. the RLlib baseline's ``checkpoints/policy.pt``): a
    TorchScript module from observations to deterministic actions with a ``podracer.json`` extra
    file (``config``: the run's env section in podracer's shape, ``tickers``, ``obs_dim``). None
    if ``path`` is not a TorchScript archive."""
    import zipfile

    if not zipfile.is_zipfile(path):
        return None
    from podracer_hpc.files.safeio import StateFileError

    extra = {EXPORTED_META: ""}
    try:
        module = torch.jit.load(str(path), map_location=torch.device(device), _extra_files=extra)
        meta = json.loads(extra[EXPORTED_META] or "{}")
    except (RuntimeError, ValueError) as e:
        raise StateFileError(f"{path}: not a podracer checkpoint, leaderboard entry or exported policy ({e})") from None
    if meta.get("kind") != "exported-policy":
        raise StateFileError(f"{path}: a TorchScript file without podracer's {EXPORTED_META} (not an exported policy)")
    cfg_dict = meta.get("config") or {}
    if (cfg_dict.get("env") or {}).get("name") != "stock_trading":
        raise StateFileError(f"{path}: trained on task {(cfg_dict.get('env') or {}).get('name')!r}, not stock_trading")
    module.eval()

    @torch.no_grad()
    def policy(obs: torch.Tensor) -> torch.Tensor:
        return module(obs.to(torch.float32)).clamp(-1.0, 1.0)

    policy.obs_dim = int(meta["obs_dim"])  # type: ignore[attr-defined]
    policy.tickers = list(meta.get("tickers") or []) or None  # type: ignore[attr-defined]
    return policy, cfg_dict


def load_policy(
    path: str | os.PathLike, device: str | torch.device = "cpu", trust: Any = None
) -> tuple[Policy, dict[str, Any]]:
    """The deterministic policy of a pod checkpoint, a leaderboard entry or an exported policy
    (:func:`load_exported_policy`): (policy, run config dict). ``trust``: what the user allowed
    (tools/trust.py; None: the defaults): an entry is read through its leaderboard (keyed checksum
    checked), and a file owned by an outsider is refused unless allowed. Only a ``stock_trading``
    agent is read, and its env is built here from the trading options (no stored code runs)."""
    from podracer_hpc.agents.ppo import PPOAgent
    from podracer_hpc.agents.settings import PPOConfig
    from podracer_hpc.config import from_dict
    from podracer_hpc.files import safeio
    from podracer_hpc.files.kinds import identify, wrong_kind
    from podracer_hpc.files.owner import check_owner, group_of
    from podracer_hpc.pool.leaderboard import ENTRY_KIND, EntryGone, InvalidEntryId, Leaderboard
    from podracer_hpc.tools.trust import Trust

    trust = trust if trust is not None else Trust()
    dev, path = torch.device(device), Path(path)
    found = identify(path)
    wrong = wrong_kind(found, ("checkpoint", "entry", "exported"))
    if wrong:  # a config, a log, a run directory: said what it is, never read as a state file
        raise safeio.StateFileError(wrong)
    if found.kind == "exported" and path.suffix == ".onnx":
        raise safeio.StateFileError(
            f"{path}: an ONNX policy; this reads TorchScript ones: podracer export policy CHECKPOINT --out policy.pt"
        )
    if path.is_file() and not trust.allow_foreign:
        check_owner(
            path, group_of(path.parent.parent if path.parent.name in ("checkpoints", "entries") else path.parent)
        )
    exported = load_exported_policy(path, dev) if path.is_file() else None
    if exported is not None:
        return exported
    if found.kind == "entry" and path.parent.name == "entries":  # through its leaderboard: keyed checksum
        board = Leaderboard(
            path.parent.parent, read_only=True, accept_unkeyed=trust.accept_unkeyed, allow_foreign=trust.allow_foreign
        )
        try:
            tensors, meta = board.load(path.name.split(".", 1)[0], device=dev)
        except (EntryGone, InvalidEntryId) as e:
            raise safeio.StateFileError(str(e)) from None
    else:
        try:
            tensors, meta, _ = safeio.load(path, "pod-state", device=dev)
        except safeio.StateFileError as e:
            if "expected a 'pod-state'" not in str(e):
                raise
            if not trust.accept_unkeyed:  # an entry's tensors without their leaderboard: no keyed checksum
                raise safeio.StateFileError(
                    f"{path}: a leaderboard entry's tensors outside its leaderboard: its keyed checksum cannot be "
                    "checked. Give the entry in its leaderboard (<leaderboard>/entries/<id>.safetensors), or "
                    "--accept-unkeyed if you know who wrote it"
                ) from None
            tensors, meta, _ = safeio.load(path, ENTRY_KIND, device=dev)
            meta = dict(meta.get("meta") or meta)
    cfg_dict = meta.get("config") or {}
    if (cfg_dict.get("env") or {}).get("name") != "stock_trading":
        raise safeio.StateFileError(
            f"{path}: trained on task {(cfg_dict.get('env') or {}).get('name')!r}, not stock_trading"
        )
    algo = (cfg_dict.get("agent") or {}).get("algo", "ppo")
    if algo != "ppo":
        raise safeio.StateFileError(
            f"{path}: a {algo} agent; this reads PPO agents' files. Export its policy first "
            f"(podracer export policy {path} --out policy.pt) and backtest the exported file"
        )
    agent_cfg = from_dict(PPOConfig, cfg_dict.get("agent") or {}, "agent.")  # only what builds the networks
    layout = None
    try:
        if agent_cfg.network == "per_asset":  # the layout is part of the network's state
            assets, glob = tensors["net.asset_columns"], tensors["net.global_columns"]
            layout = (glob.tolist(), assets.tolist())
            act_dim = int(assets.shape[0])
            obs_dim = int(max(int(assets.max()), int(glob.max()))) + 1
        else:
            obs_dim = int(tensors["net.actor.0.weight"].shape[1])
            act_dim = int(tensors["net.log_std"].shape[0])
    except KeyError as e:
        raise safeio.StateFileError(f"{path}: holds no policy network ({e} missing)") from None
    agent = PPOAgent(
        obs_dim, act_dim, False, 0, int(cfg_dict["env"].get("num_envs", 1)), agent_cfg, dev, asset_layout=layout
    )
    try:
        agent.load(tensors, meta, hparams=False, optimizer=False)  # the agent's own state contract (keys, old files)
    except (RuntimeError, KeyError, ValueError) as e:
        raise safeio.StateFileError(f"{path}: does not hold a policy of this shape ({e})") from None
    agent.eval()

    @torch.no_grad()
    def policy(obs: torch.Tensor) -> torch.Tensor:
        return agent.act_deterministic(agent.normalize_obs(obs.to(torch.float32), update=False)).clamp(-1.0, 1.0)

    policy.obs_dim = obs_dim  # type: ignore[attr-defined]
    policy.tickers = tickers_from_state(tensors)  # type: ignore[attr-defined]  (None for leaderboard entries)
    return policy, cfg_dict


# --------------------------------------------------------------------------------------
# The backtest
# --------------------------------------------------------------------------------------
def backtest(
    policy: Policy | str | os.PathLike,
    data: str | os.PathLike | MarketData | Market | None = None,
    start: str | None = None,
    end: str | None = None,
    *,
    stocks: Sequence[str] = (),
    initial_cash: float = _DEFAULT.initial_cash,
    cost: float = _DEFAULT.cost,
    max_shares: int = _DEFAULT.max_shares,
    actions: str | None = None,
    turbulence_threshold: float = _DEFAULT.turbulence_threshold,
    turbulence_window: int = _DEFAULT.turbulence_window,
    warmup_bars: int = _DEFAULT.warmup_bars,
    synthetic: dict[str, Any] | None = None,
    device: str | torch.device = "cpu",
    periods_per_year: float | None = None,
    minvar_lookback: int = 252,
    rebalance_every: int = 0,
    plot: str | os.PathLike | None = None,
    title: str = "",
) -> dict[str, Any]:
    """Run ``policy`` from ``start`` to ``end`` (dates; default the whole data after ``warmup_bars``).

    Returns ``{"start", "end", "bars", "periods_per_year", "agent", "equal_weight",
    "min_variance", "final_value", "plot", "series"}`` where the three strategies hold the
    metrics of :func:`metrics` and ``series`` the dates and account values. ``actions`` (what an
    action means: ``shares`` or ``weights``) defaults to the checkpoint's rule, else ``shares``.
    """
    dev = torch.device(device)
    if not callable(policy):
        policy, cfg = load_policy(policy, dev)
        if actions is None:
            actions = ((cfg.get("env") or {}).get("trading") or {}).get("actions")
    actions = actions or _DEFAULT.actions
    trained_on = getattr(policy, "tickers", None)
    if not stocks and trained_on and not isinstance(data, Market):
        stocks = trained_on  # a checkpoint knows its stocks and their order
        if data and not isinstance(data, MarketData):  # the pods' cache (all tickers), if it holds exactly those
            from podracer_hpc.trading.cache import read_fresh

            data = market_source(data)  # resolved once, here, for both lookups below
            _, pods_cache, _ = read_fresh(data, (), turbulence_window)  # checked and opened once
            if pods_cache is not None and pods_cache.data.tickers == list(trained_on):
                data = market_of(pods_cache, dev, torch.float32)
    if isinstance(data, Market):
        market = data
    else:
        syn = {f"synthetic_{k}": v for k, v in (synthetic or {}).items()}
        market = get_market(data, stocks, dev, torch.float32, turbulence_window, **syn)
    if trained_on and market.data.tickers != list(trained_on):
        raise ValueError(
            f"the policy was trained on {len(trained_on)} stocks ({', '.join(trained_on[:8])}"
            f"{', ...' if len(trained_on) > 8 else ''}), the backtest data has "
            f"{', '.join(market.data.tickers[:8])}{', ...' if market.num_stocks > 8 else ''}"
        )
    env = StockTradingEnv(
        1,
        dev,
        data=market,
        start=start,
        end=end,
        initial_cash=initial_cash,
        cost=cost,
        max_shares=max_shares,
        actions=actions,
        turbulence_threshold=turbulence_threshold,
        warmup_bars=warmup_bars,
        random_start=False,
        max_episode_steps=10**12,
    )
    want = getattr(policy, "obs_dim", None)
    if want is not None and want != env.obs_dim:
        raise ValueError(
            f"the policy expects {want} observations ({(want - 2) // 10} stocks), the data gives "
            f"{env.obs_dim} ({env.num_stocks} stocks: {', '.join(market.data.tickers[:8])}"
            f"{', ...' if env.num_stocks > 8 else ''})"
        )
    lo, hi = env.lo, env.hi
    state = env.initial_state(torch.zeros(1, 1, dtype=torch.float64, device=dev))
    values = [float(env.portfolio_value(state)[0])]
    with torch.no_grad():
        for _ in range(hi - lo):
            action = policy(env.observe(state))
            state, _, _ = env.dynamics(state, action)
            values.append(float(env.portfolio_value(state)[0]))
    agent_v = np.asarray(values)
    close_all = market.data.close.numpy()
    close = close_all[lo : hi + 1]
    S = close.shape[1]
    ew_v = _buy_and_hold(close, np.full(S, 1.0 / S), initial_cash, cost)
    mv_v, mv_w = _min_variance_path(close_all, lo, hi, initial_cash, cost, minvar_lookback, rebalance_every)
    dates = market.data.dates[lo : hi + 1]
    ppy = float(periods_per_year or infer_periods_per_year(dates))
    ds = market.data.date_strings()
    out: dict[str, Any] = {
        "start": ds[lo],
        "end": ds[hi],
        "bars": int(hi - lo),
        "periods_per_year": ppy,
        "agent": metrics(agent_v, ppy),
        "equal_weight": metrics(ew_v, ppy),
        "min_variance": metrics(mv_v, ppy),
        "final_value": float(agent_v[-1]),
        "initial_cash": float(initial_cash),
        "min_variance_weights": {t: round(float(w), 6) for t, w in zip(market.data.tickers, mv_w) if w > 1e-6},
        "plot": None,
        "series": {
            "dates": ds[lo : hi + 1],
            "agent": agent_v.tolist(),
            "equal_weight": ew_v.tolist(),
            "min_variance": mv_v.tolist(),
        },
    }
    if plot:
        out["plot"] = str(plot_values(out["series"], plot, title or f"Backtest {ds[lo]} .. {ds[hi]}"))
    return out


def plot_values(series: dict[str, Any], path: str | os.PathLike, title: str = "") -> Path:
    """A PNG of the account values over time (matplotlib's Agg canvas; no global backend change)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    dates = np.asarray(series["dates"], dtype="datetime64[s]")
    fig = Figure(figsize=(9, 4.5), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    for key, label in (
        ("agent", "agent"),
        ("equal_weight", "equal-weight buy and hold"),
        ("min_variance", "minimum variance"),
    ):
        ax.plot(
            dates.astype("datetime64[ms]").astype(object), series[key], label=label, lw=1.4 if key == "agent" else 1.0
        )
    ax.set_title(title)
    ax.set_ylabel("account value")
    ax.grid(alpha=0.3)
    ax.legend(loc="best")
    fig.autofmt_xdate()
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, format="png")
    return p


def table(result: dict[str, Any]) -> str:
    """The metrics of the three strategies as a text table."""
    head = f"backtest {result['start']} .. {result['end']} "
    head += f"({result['bars']} bars, {result['periods_per_year']:g} per year)"
    lines = [head, f"{'metric':<20}{'agent':>14}{'equal weight':>14}{'min variance':>14}"]
    for m in METRICS:
        row = f"{m:<20}"
        for k in ("agent", "equal_weight", "min_variance"):
            v = result[k][m]
            row += f"{'-' if v is None else f'{v:.4f}':>14}"
        lines.append(row)
    return "\n".join(lines)


# --------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    torch.set_num_threads(
        1
    )  # one account, one bar at a time: more threads only wait on each other (ms per op under load)
    from podracer_hpc.files.safeio import StateFileError

    try:
        policy, cfg = load_policy(args.checkpoint, args.device, from_args(args))
        trading = (cfg.get("env") or {}).get("trading") or {}
        env_cfg = as_kwargs(options_from(TradingOptions, trading, "the checkpoint's env.trading", ignore_unknown=True))

        def pick(cli: Any, key: str) -> Any:
            return env_cfg[key] if cli is None else cli

        start = args.start
        if start is None and env_cfg.get("end"):
            start = _day_after(env_cfg["end"])
        stocks = (
            [s.strip() for s in args.stocks.split(",") if s.strip()] if args.stocks else list(env_cfg["stocks"] or [])
        )
        result = backtest(
            policy,
            pick(args.data, "data") or None,
            start,
            args.end,
            stocks=stocks,
            initial_cash=pick(args.initial_cash, "initial_cash"),
            cost=pick(args.cost, "cost"),
            max_shares=pick(args.max_shares, "max_shares"),
            actions=env_cfg["actions"],
            turbulence_threshold=pick(args.turbulence_threshold, "turbulence_threshold"),
            turbulence_window=env_cfg["turbulence_window"],
            warmup_bars=env_cfg["warmup_bars"],
            synthetic={k[len("synthetic_") :]: env_cfg[k] for k in env_cfg if k.startswith("synthetic_")},
            device=args.device,
            periods_per_year=args.periods_per_year,
            minvar_lookback=args.minvar_lookback,
            rebalance_every=args.rebalance_every,
            plot=args.plot or None,
        )
    except (DataError, StateFileError, ValueError, ConfigError) as e:
        print(f"podracer backtest: error: {e}", file=sys.stderr)
        return 2
    print(table(result))
    if result["plot"]:
        print(f"account values: {result['plot']}")
    summary = {k: v for k, v in result.items() if k != "series"}
    summary["checkpoint"] = str(args.checkpoint)
    print(json.dumps(summary))
    return 0


def _day_after(day: str) -> str:
    d = np.datetime64(str(day).strip()[:10], "D") + np.timedelta64(1, "D")
    return str(d)


__all__ = [
    "backtest",
    "metrics",
    "main",
    "load_policy",
    "min_variance_weights",
    "infer_periods_per_year",
    "plot_values",
    "table",
    "METRICS",
]

if __name__ == "__main__":
    sys.exit(main())
