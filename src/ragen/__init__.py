"""ragen: multi-turn reinforcement learning for LLM agents (StarPO / StarPO-S)."""

__version__ = "0.1.0"
