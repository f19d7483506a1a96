"""Task schema, loaders and the built-in task sets. Never imports dagster."""
