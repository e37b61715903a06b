"""Prefect tasks of a collection, one per phase (see tasks.phases); the steps they run (tasks.steps) import no Prefect."""
