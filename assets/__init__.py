"""The asset graph: thin Dagster assets over the sandbox, task_sets, training and datastore libraries."""
