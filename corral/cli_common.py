"""What every `corral` sub-command module shares: the context (the stack's
config, loaded once), output consoles, JSON output, one-line failures.

Below `corral/cli.py` and the `cli_*` modules alike, so that they import it
and not each other (`cli.py` registers the `cli_*` modules' commands).
"""

from __future__ import annotations

import asyncio
import functools
import json
import shlex
import sys
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import click
import yaml
from pydantic import BaseModel
from rich.console import Console

from contract.config import StackConfig, load_config
from contract.errors import CorralError

T = TypeVar("T")
console = Console(stderr=True, highlight=False)
# Piped output gets a wide page: ids must survive `| grep` and copy-paste whole.
out = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)


def fail(message: str) -> None:
    raise click.ClickException(" ".join(message.split()) if "\n" not in message else message)


def run_async(func: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T]:
    """Run a coroutine command; turn Corral's errors into one-line exits."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        try:
            return asyncio.run(func(*args, **kwargs))
        except CorralError as err:
            fail(str(err))
            raise AssertionError("unreachable") from err

    return wrapper


def emit_json(data: Any) -> None:
    if isinstance(data, BaseModel):
        text = data.model_dump_json(indent=2)
    else:
        text = json.dumps(_jsonable(data), indent=2, default=str)
    click.echo(text)


def _jsonable(data: Any) -> Any:
    if isinstance(data, BaseModel):
        return data.model_dump(mode="json")
    if isinstance(data, list):
        return [_jsonable(d) for d in data]
    if isinstance(data, dict):
        return {k: _jsonable(v) for k, v in data.items()}
    return data


class Context:
    def __init__(self, config_path: Path | None) -> None:
        self._config_path = config_path
        self._config: StackConfig | None = None

    @property
    def config(self) -> StackConfig:
        if self._config is None:
            try:
                self._config = load_config(self._config_path)
            except CorralError as err:
                fail(str(err))
        assert self._config is not None
        return self._config


pass_ctx = click.make_pass_decorator(Context)


def load_spec_file(path: Path) -> dict[str, Any]:
    """An episode spec from YAML or JSON; errors name the file."""
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        fail(f"{path}: cannot read spec: {' '.join(str(err).split())}")
    if not isinstance(data, dict):
        fail(f"{path}: a spec is a mapping (image, steps, ...)")
    return data


def shell_join(argv: tuple[str, ...]) -> str | list[str]:
    """`-- echo hi` as an argv; a single argument with spaces is a shell string."""
    if len(argv) == 1 and any(ch in argv[0] for ch in " |;&><$"):
        return argv[0]
    return list(argv) if len(argv) > 1 else shlex.split(argv[0]) if argv else []
