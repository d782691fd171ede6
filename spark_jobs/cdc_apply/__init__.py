"""Spark apply library used by apply_changes.py (shipped to executors with --py-files)."""
