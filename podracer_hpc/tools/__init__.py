"""User commands over runs: ``podracer status``, ``evaluate``, ``export``, ``backtest``, ``data``,
``bench`` and ``study``. Each is a tool above the training code: nothing below imports them."""
