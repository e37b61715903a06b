"""Deployments of the collect flow: a scheduled (cron) one and a manual one (see serve.py, prefect.yaml)."""
