"""Corral as a SWE-ReX deployment: SWE-agent (or any SWE-ReX user) runs its commands
in a Corral episode instead of a Docker container.

    deployment = CorralDeployment({"image": "busybox", "reward": "..."}, corral=corral)
    await deployment.start()
    runtime = deployment.runtime
    await runtime.create_session(CreateBashSessionRequest())
    obs = await runtime.run_in_session(BashAction(command="cd /workspace && ls"))
    await deployment.stop()          # finishes the episode: its reward runs
    deployment.result                # the EpisodeResult (reward, steps, alerts)

Sessions keep their working directory and exported variables between commands
(a state file in the sandbox, sourced before each command), so they work
without the exec agent. Interactive programs (`is_interactive_command`) need a
PTY and are refused with a clear error.
"""

from __future__ import annotations

import logging
import re
import shlex
from pathlib import Path
from typing import Any, get_args

from corral.adapters._frameworks import require

require("swerex", "swerex")

from swerex.deployment.abstract import AbstractDeployment  # noqa: E402
from swerex.deployment.hooks.abstract import CombinedDeploymentHook, DeploymentHook  # noqa: E402
from swerex.exceptions import (  # noqa: E402
    CommandTimeoutError,
    DeploymentNotStartedError,
    NonZeroExitCodeError,
    SessionDoesNotExistError,
    SessionExistsError,
    SwerexException,
)
from swerex.runtime.abstract import (  # noqa: E402
    AbstractRuntime,
    Action,
    BashAction,
    BashObservation,
    CloseResponse,
    CloseSessionRequest,
    CloseSessionResponse,
    Command,
    CommandResponse,
    CreateBashSessionResponse,
    CreateSessionRequest,
    CreateSessionResponse,
    IsAliveResponse,
    Observation,
    ReadFileRequest,
    ReadFileResponse,
    UploadRequest,
    UploadResponse,
    WriteFileRequest,
    WriteFileResponse,
)

from contract.config import StackConfig  # noqa: E402
from contract.models import (  # noqa: E402
    EpisodeResult,
    EpisodeSpec,
    Outcome,
    StepResult,
)
from corral.adapters._episodes import end_episode, interactive_spec  # noqa: E402
from corral.errors import CorralError, EpisodeFileNotFound  # noqa: E402
from corral.sdk import Corral, Episode  # noqa: E402

__all__ = ["CorralDeployment", "CorralRuntime"]

SESSION_DIR = "/tmp/.corral-swerex"
# SWE-ReX's default startup timeout (1 s) is for a local shell; an exec into a
# sandbox on a busy node can take longer than that before the shell even starts.
STARTUP_TIMEOUT_FLOOR_S = 30.0
# Episode states in which it takes no more commands (a closed one's state is its
# outcome); every other one does, or will once placed, provisioned or woken.
_TAKES_NO_REQUESTS = frozenset({"closing", "quarantined", *get_args(Outcome)})
_SESSION_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")

# A session command: restore the session's cwd and exports, run the command in
# this shell (so `cd` and `export` stick), save them again, keep its status.
_SESSION_SCRIPT = """\
__corral_state={state}
[ -f "$__corral_state" ] && . "$__corral_state"
{{
{command}
}} 2>&1
__corral_rc=$?
{{ export -p; printf "cd -- '%s'\\n" "$(pwd | sed "s/'/'\\\\\\\\''/g")"; }} > "$__corral_state"
exit $__corral_rc
"""


class CorralRuntime(AbstractRuntime):
    """SWE-ReX's runtime interface over one interactive Corral episode."""

    def __init__(self, episode: Episode, *, logger: logging.Logger | None = None) -> None:
        self.episode = episode
        self.logger = logger or logging.getLogger("corral.swerex")
        self.sessions: set[str] = set()

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        try:
            status = await self.episode.status()
        except CorralError as err:
            return IsAliveResponse(is_alive=False, message=str(err))
        alive = status.state not in _TAKES_NO_REQUESTS
        return IsAliveResponse(is_alive=alive, message="" if alive else status.state)

    async def create_session(self, request: CreateSessionRequest) -> CreateSessionResponse:
        name = _session_name(request.session)
        if name in self.sessions:
            raise SessionExistsError(f"session {name!r} already exists")
        # A missing file is skipped, as bash's `source` would only complain: POSIX sh
        # would exit on it.
        quoted = map(shlex.quote, request.startup_source)
        sources = [f"if [ -r {path} ]; then . {path}; fi" for path in quoted]
        startup = "\n".join([f"mkdir -p {SESSION_DIR}", *sources])
        timeout = max(request.startup_timeout, STARTUP_TIMEOUT_FLOOR_S)
        step = await self._in_session(name, startup, timeout=timeout)
        self.sessions.add(name)
        return CreateBashSessionResponse(output=step.stdout)

    async def run_in_session(self, action: Action) -> Observation:
        if not isinstance(action, BashAction):
            # Commands run to completion one at a time: there is nothing to interrupt.
            return BashObservation(output="", exit_code=0)
        if action.session not in self.sessions:
            raise SessionDoesNotExistError(f"session {action.session!r} does not exist")
        if action.is_interactive_command or action.is_interactive_quit:
            raise SwerexException("interactive commands need a PTY, which Corral sessions lack")
        step = await self._in_session(action.session, action.command, timeout=action.timeout)
        return _observation(action, step)

    async def _in_session(self, name: str, command: str, *, timeout: float | None) -> StepResult:
        state = shlex.quote(f"{SESSION_DIR}/{name}.sh")
        script = _SESSION_SCRIPT.format(state=state, command=command)
        step = await self.episode.exec(script, timeout_s=timeout)
        if step.timed_out:
            raise CommandTimeoutError(f"timeout ({timeout}s) exceeded while running {command!r}")
        return step

    async def close_session(self, request: CloseSessionRequest) -> CloseSessionResponse:
        if request.session not in self.sessions:
            raise SessionDoesNotExistError(f"session {request.session!r} does not exist")
        self.sessions.discard(request.session)
        await self.episode.exec(["rm", "-f", f"{SESSION_DIR}/{request.session}.sh"])
        return CloseSessionResponse()

    async def execute(self, command: Command) -> CommandResponse:
        argv = _merged(_argv(command)) if command.merge_output_streams else _argv(command)
        step = await self.episode.exec(
            argv, timeout_s=command.timeout, env=command.env, workdir=command.cwd
        )
        if step.timed_out:
            raise CommandTimeoutError(f"timeout ({command.timeout}s) exceeded running a command")
        stdout, stderr = step.stdout, step.stderr
        if command.check and step.exit_code != 0:
            message = f"command {command.command!r} failed with exit code {step.exit_code}"
            prefix = f"{command.error_msg}: " if command.error_msg else ""
            raise NonZeroExitCodeError(f"{prefix}{message}. stdout: {stdout!r} stderr: {stderr!r}")
        return CommandResponse(stdout=stdout, stderr=stderr, exit_code=step.exit_code)

    async def read_file(self, request: ReadFileRequest) -> ReadFileResponse:
        try:
            data = await self.episode.read_file(request.path)
        except EpisodeFileNotFound as err:
            raise FileNotFoundError(str(err)) from err
        content = data.decode(request.encoding or "utf-8", errors=request.errors or "strict")
        return ReadFileResponse(content=content)

    async def write_file(self, request: WriteFileRequest) -> WriteFileResponse:
        await self.episode.write_file(request.path, request.content)
        return WriteFileResponse()

    async def upload(self, request: UploadRequest) -> UploadResponse:
        """A local file, or a directory tree, into the sandbox (modes kept)."""
        source = Path(request.source_path)
        if not source.exists():
            raise FileNotFoundError(f"no such file or directory to upload: {source}")
        if source.is_file():
            await self._upload_file(source, request.target_path)
            return UploadResponse()
        for path in sorted(p for p in source.rglob("*") if p.is_file()):
            relative = path.relative_to(source).as_posix()
            await self._upload_file(path, f"{request.target_path.rstrip('/')}/{relative}")
        return UploadResponse()

    async def _upload_file(self, path: Path, target: str) -> None:
        await self.episode.write_file(target, path.read_bytes(), mode=path.stat().st_mode & 0o777)

    async def close(self) -> CloseResponse:
        self.sessions.clear()
        return CloseResponse()


class CorralDeployment(AbstractDeployment):
    """A SWE-ReX deployment that is one Corral episode: `start` starts it (interactive),
    `stop` finishes it (its reward runs; `result` holds the `EpisodeResult`)."""

    def __init__(
        self,
        spec: EpisodeSpec | dict[str, Any],
        *,
        corral: Corral | None = None,
        config: StackConfig | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.spec = interactive_spec(spec)
        self.logger = logger or logging.getLogger("corral.swerex")
        self.result: EpisodeResult | None = None
        self._corral = corral
        self._config = config
        self._runtime: CorralRuntime | None = None
        self._hooks = CombinedDeploymentHook()

    def add_hook(self, hook: DeploymentHook) -> None:
        self._hooks.add_hook(hook)

    async def start(self) -> None:
        if self._runtime is not None:
            return
        corral = self._corral = self._corral or await Corral.connect(self._config)
        self._hooks.on_custom_step("Starting Corral episode")
        episode = await corral.start_episode(self.spec)
        self._runtime = CorralRuntime(episode, logger=self.logger)

    async def stop(self) -> None:
        """Finish the episode (idempotent); its result goes to `result`."""
        if self._runtime is None or self.result is not None:
            return
        await self._runtime.close()
        self.result = await end_episode(self._runtime.episode)

    async def is_alive(self, *, timeout: float | None = None) -> IsAliveResponse:
        return await self.runtime.is_alive(timeout=timeout)

    @property
    def runtime(self) -> CorralRuntime:
        if self._runtime is None:
            raise DeploymentNotStartedError()
        return self._runtime

    @property
    def episode(self) -> Episode:
        return self.runtime.episode

    def __del__(self) -> None:
        # SWE-ReX's base class stops deployments here through an event loop;
        # a Corral episode outlives its handle (its idle TTL reaps it), so skip it.
        pass


def _session_name(name: str) -> str:
    if not _SESSION_NAME.fullmatch(name):
        raise SwerexException(f"session name {name!r}: letters, digits, '_', '.', '-' only")
    return name


def _argv(command: Command) -> str | list[str]:
    """The command as Corral runs it: a string under /bin/sh -c, a list as an argv."""
    if command.shell:
        return command.command if isinstance(command.command, str) else shlex.join(command.command)
    return shlex.split(command.command) if isinstance(command.command, str) else command.command


def _merged(argv: str | list[str]) -> list[str]:
    """The command with its stderr on its stdout, interleaved as written."""
    if isinstance(argv, str):
        return ["/bin/sh", "-c", f"exec 2>&1\n{argv}"]
    return ["/bin/sh", "-c", 'exec 2>&1; exec "$@"', "sh", *argv]


def _observation(action: BashAction, step: StepResult) -> BashObservation:
    output = step.stdout + step.stderr
    if action.check == "ignore":
        return BashObservation(output=output, exit_code=None)
    if action.check == "raise" and step.exit_code != 0:
        prefix = f"{action.error_msg}: " if action.error_msg else ""
        raise NonZeroExitCodeError(
            f"{prefix}command {action.command!r} failed with exit code {step.exit_code}. "
            f"Here is the output:\n{output!r}"
        )
    return BashObservation(output=output, exit_code=step.exit_code)
