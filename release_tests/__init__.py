"""Measurements: each prints a table, the machine it ran on, and writes Parquet."""
