"""The server side of the work-pool path (``deployments/prefect.yaml``), after ``prefect deploy``.

``prefect deploy`` derives each deployment's parameter schema from the flow's signature
itself (whatever the yaml says: Prefect 3.9 overwrites a ``parameter_openapi_schema`` key
there) and leaves it open, so the server accepted a run naming a parameter the flow does
not take (``prefect deployment run collect/pool-manual --param bogus=1``, the API), and
that run crashed in Prefect's engine before the flow began: ``Process exited with status
code: 1``, the cause only in the worker's console. :func:`close_schemas` closes the
stored schemas as ``focus deploy`` registers its own (:func:`deployments.serve._closed`),
so the server refuses such a run when it is created (``409 ... Additional properties are
not allowed ('bogus' was unexpected)``). ``focus deploy --work-pool`` runs it, with the
watchdog; a later ``prefect deploy`` opens them again, so it belongs after every one.
"""

from __future__ import annotations

from typing import Any

#: The flows FOCUS defines: the deployments of these names are FOCUS's to close.
FLOWS = ("collect", "train_loop")


def closed(schema: dict[str, Any] | None) -> dict[str, Any]:
    """``schema`` (a deployment's parameter schema as stored) refusing parameters it does not name."""
    return {**(schema or {"type": "object", "properties": {}}), "additionalProperties": False}


async def close_schemas(flows: tuple[str, ...] = FLOWS) -> list[str]:
    """Close the parameter schema of every deployment of ``flows`` whose schema is open;
    the names (``flow/deployment``) of those changed. Idempotent: a closed one is left."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentUpdate
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName

    changed = []
    async with get_client() as client:
        named = {
            f.id: f.name for f in await client.read_flows(flow_filter=FlowFilter(name=FlowFilterName(any_=list(flows))))
        }
        if not named:
            return []
        deployments = await client.read_deployments(flow_filter=FlowFilter(name=FlowFilterName(any_=list(flows))))
        for d in deployments:
            schema = d.parameter_openapi_schema
            if (schema or {}).get("additionalProperties") is False:
                continue
            update = DeploymentUpdate(parameter_openapi_schema=closed(schema))
            await client.update_deployment(d.id, update)
            changed.append(f"{named.get(d.flow_id, '?')}/{d.name}")
    return changed
