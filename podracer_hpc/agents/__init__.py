"""PPO, SAC and TD3: each agent with its settings (``settings``), its maths and its state."""
