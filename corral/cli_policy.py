"""`corral policy validate|explain|test`: tools for policy authors."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import click
from rich.table import Table

from contract.errors import CorralError
from corral.cli_common import Context, emit_json, fail, out, pass_ctx, run_async
from corral.ops.policies import (
    ValidationReport,
    explain_rule,
    rule_paths,
    run_rule_tests,
    validate_rules,
)

_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)


@click.group()
def policy() -> None:
    """Validate, explain and test Falco rules and responses."""


@policy.command("validate")
@click.argument("files", nargs=-1, type=_FILE)
@click.option("--responses", type=_FILE, default=None, help="Also check a responses file.")
@click.option(
    "--allow-unsupported",
    is_flag=True,
    help="Exit 0 even if a rule needs a field this sensor does not serve (it is reported).",
)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def validate(
    ctx: Context,
    files: tuple[Path, ...],
    responses: Path | None,
    allow_unsupported: bool,
    as_json: bool,
) -> None:
    """Load FILES in order (default: the stack's rules) and report each rule's support.

    Exits non-zero on what Falco refuses and on rules this engine cannot
    evaluate (unless --allow-unsupported); Falco's warnings are printed."""
    report = validate_rules(
        rule_paths(ctx.config, files), responses=responses, allow_unsupported=allow_unsupported
    )
    if as_json:
        emit_json(report.to_dict())
    else:
        _print_report(report)
    if not report.ok:
        raise SystemExit(1)


def _print_report(report: ValidationReport) -> None:
    rules = report.rules
    table = Table("rule", "status", "priority", "event types", "reason")
    for r in rules:
        colour = {"supported": "green", "disabled": "dim"}.get(r.status, "red")
        types = "all" if r.event_types is None else ",".join(r.event_types)[:40]
        table.add_row(r.name, f"[{colour}]{r.status}[/]", r.priority, types, r.reason or "")
    out.print(table)
    for warning in report.warnings:
        out.print(f"warning: {warning}", markup=False, highlight=False)
    for line in report.error_lines():
        out.print(line, style="red", markup=False, highlight=False)
    counts = report.counts()
    out.print("  ".join(f"{k}: {v}" for k, v in counts.items()))


@policy.command("explain")
@click.argument("rule")
@click.option(
    "--rules", "files", multiple=True, type=_FILE, help="Rule files (default: the stack's)."
)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
def explain(ctx: Context, rule: str, files: tuple[Path, ...], as_json: bool) -> None:
    """Show RULE's expanded condition, fields, event types and exceptions."""
    paths = rule_paths(ctx.config, files)
    try:
        explanation = explain_rule(rule, paths)
    except CorralError as err:
        fail(f"{err} (in {', '.join(str(p) for p in paths)})")
    data = dataclasses.asdict(explanation)
    if as_json:
        emit_json(data)
        return
    for key in (
        "name",
        "status",
        "priority",
        "tags",
        "event_types_text",
        "fields",
        "macros",
        "lists",
        "output",
        "file",
    ):
        out.print(f"[bold]{key}[/]: {data.get(key)}")
    out.print(f"[bold]condition[/]:\n  {data['condition_with_exceptions']}", markup=True)
    out.print(f"[bold]expanded[/]:\n  {data['expanded_condition']}", markup=True)


@policy.command("test")
@click.argument("directory", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--rules", "files", multiple=True, type=_FILE)
@click.option("--json", "as_json", is_flag=True)
@pass_ctx
@run_async
async def test(ctx: Context, directory: Path, files: tuple[Path, ...], as_json: bool) -> None:
    """Run the YAML test cases in DIRECTORY in real sandboxes with the real sensor."""
    paths = rule_paths(ctx.config, files)
    results = await run_rule_tests(
        ctx.config, directory, paths, say=lambda m: click.echo(m, err=True)
    )
    if as_json:
        emit_json([r.model_dump(mode="json") for r in results])
    else:
        for r in results:
            out.print(r.summary(), style="green" if r.passed else "red", markup=False)
        passed = sum(r.passed for r in results)
        out.print(f"{passed} passed, {len(results) - passed} failed")
    if not all(r.passed for r in results):
        raise SystemExit(1)


COMMANDS = [policy]
