"""Serve the collection deployments: ``python -m deployments.serve`` or ``focus deploy``.

Two deployments of the ``collect`` flow are registered with the Prefect server named by
``PREFECT_API_URL`` and served by this process:

* ``collect/scheduled`` runs on a cron schedule with the configuration given here;
  each run gets a fresh collection id derived from its flow run.
* ``collect/manual`` has no schedule; start it from the UI's Run button (or
  ``prefect deployment run collect/manual``) and edit its ``config`` parameter there.

A rerun of a failed or crashed run from the UI (Retry) re-runs the same flow run, whose
collection id is the same, so it resumes after the last finished wave.
"""

from __future__ import annotations

import argparse
from typing import Any

from tasks.config import FocusConfig, load_config

SCHEDULED = "scheduled"
MANUAL = "manual"


def build_deployments(config: FocusConfig, cron: str = "0 * * * *") -> list[Any]:
    """The two RunnerDeployments (not yet registered)."""
    from flows.collect import collect

    params = {"config": config.model_dump(mode="json", exclude={"collection_id"})}
    scheduled = collect.to_deployment(
        name=SCHEDULED, cron=cron, parameters=params, description="Scheduled collection (one iteration per run)."
    )
    manual = collect.to_deployment(
        name=MANUAL, parameters=params, description="Manual collection: edit 'config' and press Run."
    )
    return [scheduled, manual]


def serve_deployments(config: FocusConfig, cron: str = "0 * * * *", **serve_kwargs: Any) -> None:
    """Register both deployments and run their flow runs in this process until stopped."""
    from prefect import serve

    serve(*build_deployments(config, cron), **serve_kwargs)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", help="TOML or YAML configuration of the collections")
    ap.add_argument("--cron", default="0 * * * *")
    ap.add_argument("--limit", type=int, default=None, help="most flow runs at once")
    args = ap.parse_args(argv)
    serve_deployments(load_config(args.config), cron=args.cron, limit=args.limit)


if __name__ == "__main__":
    main()
