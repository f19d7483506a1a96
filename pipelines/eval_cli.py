"""`crucible eval`: a model's report card on a task set's held-out tasks, without training it
(training/model_eval.py), as tables here and as the `model_evaluations` dataset."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import requests
from rich.markup import escape
from rich.table import Table

from commands.console import console
from commands.errors import UserError
from commands.hints import crucible_command, storage_words
from commands.settings import settings_for

# Piped output has no terminal width; the report's tables need ~100 columns.


def add_commands(commands) -> None:
    evaluate = commands.add_parser("eval", help="evaluate a model on a task set's held-out tasks, without training")
    evaluate.add_argument("--task-set", required=True, help="built-in task set name or a path")
    evaluate.add_argument("--model", help="a model directory, hub id or .gguf file for the local engines; "
                          "the name the server answers to for --engine openai (default: the one it lists)")
    evaluate.add_argument("--engine", choices=("transformers", "vllm", "openai"), default="transformers")
    evaluate.add_argument("--base-url", help="the OpenAI-compatible server (--engine openai)")
    evaluate.add_argument("--api", choices=("completions", "chat"), default="chat",
                          help="the server's API (default chat: any server; completions needs token-id prompts)")
    evaluate.add_argument("--api-key-env", help="environment variable holding the server's API key")
    evaluate.add_argument("--tokenizer", help="directory of the served model's tokenizer and chat template "
                          "(--engine openai; default: --model, when that is a directory, hub id or .gguf file)")
    evaluate.add_argument("--prompt-format", choices=("chat", "completion"), help="chat: the model's own template; "
                          "completion: a completion template (docs/prompt-formats.md); default: chat where the model "
                          "has a template, else completion (a base model)")
    evaluate.add_argument("--completion-template", help="dialogue (default), function (HumanEval's continuation), "
                          "or a Jinja file of your own (with --stop)")
    evaluate.add_argument("--stop", action="append", help="a stop string of the completion template (repeatable; "
                          "default: the built-in template's own)")
    evaluate.add_argument("--samples", type=at_least_one, default=4, help="answers per task (1: greedy; default 4, so "
                          "that stability across runs is measured)")
    evaluate.add_argument("--tasks", type=at_least_one, default=None, help="the first N held-out tasks (default: all)")
    evaluate.add_argument("--max-new-tokens", type=at_least_one, default=256)
    evaluate.add_argument("--max-turns", type=at_least_one, default=1, help="more than 1: multi-turn episodes")
    evaluate.add_argument("--temperature", type=float, default=0.6)
    evaluate.add_argument("--name", help="the evaluation's name in the dataset (default: from the model)")
    evaluate.add_argument("--storage", help="storage root (default ./.crucible/data)")
    evaluate.set_defaults(handler=command_eval)


def at_least_one(text: str) -> int:
    """An argument that counts something: a whole number of 1 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: give 1 or more")
    return value


def command_eval(args: argparse.Namespace) -> int:
    from datastore.store import rows_to_table
    from pipelines.resources import crucible_resource
    from task_sets.loader import TaskSetError, load_task_set
    from training.experiment import ExperimentConfig
    from training.model_eval import evaluate_model
    from training.policy.chat import ChatFormatError
    from training.policy.completion import CompletionTemplateError, completion_template
    from training.policy.importing import ModelImportError, prompted_model, resolve_source

    settings = settings_for(args)
    try:  # before any model is loaded: a misspelt set is refused at once
        load_task_set(args.task_set, Path(settings.task_sets))
    except TaskSetError as error:
        raise UserError(str(error)) from None
    if args.engine == "openai":
        if not args.base_url:
            raise UserError("--engine openai needs --base-url (the server's root, e.g. http://127.0.0.1:8000)")
        args.model = args.model or served_model(args.base_url)
    elif not args.model:
        raise UserError(f"--engine {args.engine} needs --model: a model directory, a hub id or a .gguf file")
    name = args.name or _slug(args.model)
    server = {"base_url": args.base_url, "model": args.model, "api": args.api,
              "api_key_env": args.api_key_env} if args.engine == "openai" else None
    experiment = ExperimentConfig(name=name, task_set=args.task_set, engine=args.engine, server=server,
                                  eval_tasks=args.tasks, eval_samples=args.samples, max_new_tokens=args.max_new_tokens,
                                  max_turns=args.max_turns, temperature=args.temperature)
    try:
        if args.engine == "openai":
            chat_dir = resolve_source(args.tokenizer or args.model)
        else:
            chat_dir = prompted_model(args.model, args.prompt_format, completion_template(args.completion_template,
                                                                                          args.stop),
                                      experiment.episode_max_tokens)
    except (ModelImportError, CompletionTemplateError) as error:
        hint = "; for a server's model, give its tokenizer with --tokenizer DIR" if args.engine == "openai" else ""
        raise UserError(f"{error}{hint}") from None
    crucible = crucible_resource(settings)
    try:
        rows = evaluate_model(crucible, experiment, args.model, chat_dir, log=console.print)
    except ChatFormatError as error:
        raise UserError(f"{chat_dir}: {error}") from None
    crucible.store().write_partition("model_evaluations", name, 0, rows_to_table("model_evaluations", rows))
    print_report(crucible.storage_root, name)
    example = crucible_command("sql", *storage_words(args.storage),
                               f"SELECT * FROM model_eval_pass_rates WHERE evaluation = '{name}'")
    console.print(f"\n[bold]Data[/bold]: the model_evaluations dataset in {escape(crucible.storage_root)} "
                  f"(experiment = {name!r}); e.g. {escape(example)}", soft_wrap=True, highlight=False)
    return 0


def served_model(base_url: str) -> str:
    """The one model a server lists at /v1/models (vllm serve and SGLang list what they serve)."""
    url = base_url.rstrip("/") + "/v1/models"
    try:
        listed = [model["id"] for model in requests.get(url, timeout=30).json()["data"]]
    except (requests.RequestException, ValueError, KeyError, TypeError):
        listed = []
    if len(listed) != 1:
        raise UserError(f"{url} does not name one model ({len(listed)} listed): give --model, the name the server "
                        "answers to")
    return listed[0]


# Each section of the report: the model_eval_* view (datastore/metrics.py) and its columns shown, by header.
REPORT = {
    "Pass rate (mean over tasks ± standard error)": ("model_eval_pass_rates", {
        "task set": "task_set", "domain": "domain", "difficulty": "difficulty", "tasks": "tasks",
        "samples": "samples", "pass rate": "pass_rate", "± se": "stderr"}),
    "Stability across repeated samples of a task": ("model_eval_stability", {
        "tasks sampled ≥ 2×": "repeated_tasks", "pairwise agreement": "agreement",
        "tasks all runs agree": "unanimous_share"}),
    "Failure modes": ("model_eval_failures", {"kind": "kind", "value": "value", "samples": "samples"}),
    "Cost": ("model_eval_cost", {
        "samples": "samples", "solutions (passed)": "solutions", "prompt tokens / solution": "prompt_tokens_per_solution",
        "sampled tokens / solution": "sampled_tokens_per_solution",
        "observation tokens / solution": "observation_tokens_per_solution",
        "sandbox s / solution": "sandbox_s_per_solution"}),
}
TEXT_COLUMNS = ("task set", "domain", "difficulty", "kind", "value")


def print_report(storage_root: str, name: str) -> None:
    from datastore import catalog, metrics

    connection = catalog.connect(storage_root)
    for title, (view, columns) in REPORT.items():
        table = Table(title=f"{title}: {name}")
        for header in columns:
            table.add_column(header, justify="left" if header in TEXT_COLUMNS else "right")
        for row in metrics.model_evaluation(connection, view, name):
            table.add_row(*(_cell(row[column]) for column in columns.values()))
        console.print(table)


def _cell(value) -> str:
    if value is None:
        return "–"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _slug(model: str) -> str:
    """An evaluation name (an experiment name's pattern) from a model's name or path."""
    return "eval-" + (re.sub(r"[^a-z0-9_\-]+", "-", model.lower().rstrip("/").rsplit("/", 1)[-1]).strip("-") or "model")
