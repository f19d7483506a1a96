"""The `crucible` commands that never touch Dagster: the deployment's settings
(`settings.py`), task sets (`tasks.py`), environments (`env.py`), verifying solutions
(`verify.py`), one command in a sandbox (`sandbox.py`), and the stored data read with SQL
(`reports.py`); and what they share: where they print (`console.py`), the one-line error
(`errors.py`), commands to paste (`hints.py`). pipelines/cli.py gathers them with the commands that run Dagster (`run`, `ui`,
`continue`, `eval`) under one `crucible`."""
