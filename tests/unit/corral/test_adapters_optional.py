"""The framework adapters are optional extras (issue 23): `import corral` needs none
of the frameworks, and an adapter whose framework is missing fails in one line."""

from __future__ import annotations

import subprocess

from tests.blocked_imports import run_without

# framework module -> the extra that installs it (also the adapter's module name)
FRAMEWORKS = {
    "swerex": "swerex",
    "minisweagent": "minisweagent",
    "skyrl_gym": "skyrl",
    "verifiers": "verifiers",
}


# Runs in the child: the frameworks fail to import, as when they are not installed.
def _run_without_frameworks(body: str) -> subprocess.CompletedProcess[str]:
    return run_without(FRAMEWORKS, body)


def test_corral_and_its_adapters_package_import_without_any_framework() -> None:
    body = (
        "import corral, corral.env, corral.adapters\n"
        f"print(sorted(m for m in sys.modules if m.split('.')[0] in {tuple(FRAMEWORKS)!r}))\n"
    )
    ran = _run_without_frameworks(body)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == "[]"


def test_an_adapter_without_its_framework_names_the_extra() -> None:
    body = "from corral.adapters._frameworks import MissingFramework\n"
    for extra in FRAMEWORKS.values():
        body += f"try:\n    import corral.adapters.{extra}\nexcept MissingFramework as err:\n"
        body += "    print(err)\n"
    ran = _run_without_frameworks(body)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == [
        f"{framework} is not installed: pip install 'corral[{extra}]'"
        for framework, extra in FRAMEWORKS.items()
    ]
