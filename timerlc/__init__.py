"""timerlc: a compiler for deep reinforcement-learning programs written in RTL."""

__version__ = "0.1.0"
