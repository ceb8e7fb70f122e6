"""Statements, their order and loops (isl), and the memory plan."""
