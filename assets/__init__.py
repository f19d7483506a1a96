"""The asset graph: thin Dagster assets over the sandbox, task_sets, grading, training and datastore libraries."""
