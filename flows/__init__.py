"""Prefect flows: collect (one iteration) and train_loop (collect -> train -> collect)."""
