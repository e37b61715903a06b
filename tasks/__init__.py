"""The pipeline's collection (tasks.collect: one loop, a checkpoint journal), its
configuration (tasks.config) and trainers (tasks.trainers). Nothing here imports Prefect."""
