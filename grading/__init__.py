"""How a submission is judged: its hidden tests run in a fresh sandbox, the run turned into a
reward by the rules of docs/grading.md, and why it did not pass. Never imports dagster."""
