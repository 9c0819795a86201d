"""Where BFCL's package lives, and how it gets there, without touching the environment's packages.

The harness needs BFCL's data and checkers, which ship in the ``bfcl-eval`` package. Installed
the ordinary way, that package brings several GB of vendor SDKs the harness never imports; with
``pip install --no-deps`` it leaves the environment inconsistent (``pip check`` lists its 27
unmet requirements, and every later ``pip install`` repeats them). So the harness keeps its own
copy in a folder of its own — ``pip install --no-deps --target FOLDER`` — that is not on
``sys.path``: pip never sees it as installed, and ``bfcl_compat`` imports the package from there.

The folder: ``$HERMES_BFCL_DIR`` when set, else ``share/hermes-agent/bfcl-eval-<version>`` under
the Python environment's prefix (so it goes away with the environment, and each environment has
the version its harness expects). The only other module the checkers import, ``mpmath``, is an
ordinary dependency: the ``eval`` extra.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from importlib import metadata
from importlib.machinery import ModuleSpec, PathFinder
from pathlib import Path

from hermes_agent.errors import HermesAgentError, MissingDependencyError

PACKAGE = "bfcl_eval"
DISTRIBUTION = "bfcl-eval"
VERSION = "2026.3.23"
"""The bfcl-eval release whose data (``BFCL_v4``) and checker interfaces the harness uses."""
ENV_VAR = "HERMES_BFCL_DIR"
EXTRA_MODULES = ("mpmath",)
"""What BFCL's checkers and backends import beyond the standard library (the ``eval`` extra)."""

SETUP_COMMAND = "hermes-agent eval bfcl --setup"
EXTRA_HINT = 'pip install "hermes-agent-core[eval]"'


def install_dir() -> Path:
    """The harness's own folder for bfcl-eval: ``$HERMES_BFCL_DIR``, else one in this Python."""
    chosen = os.environ.get(ENV_VAR)
    if chosen:
        return Path(chosen).expanduser().resolve()
    return Path(sys.prefix) / "share" / "hermes-agent" / f"{DISTRIBUTION}-{VERSION}"


def find_package() -> ModuleSpec | None:
    """Where ``bfcl_eval`` can be imported from: the harness's folder first; without
    ``$HERMES_BFCL_DIR``, a ``bfcl_eval`` installed in the environment itself also counts."""
    spec = PathFinder.find_spec(PACKAGE, [str(install_dir())])
    if spec is None and not os.environ.get(ENV_VAR):
        spec = importlib.util.find_spec(PACKAGE)
    return spec


def missing_message() -> str:
    """What to do when bfcl-eval is nowhere to be found (one line)."""
    return (
        f"BFCL's data and checkers are not installed; run `{SETUP_COMMAND}` (it installs "
        f"{DISTRIBUTION}=={VERSION} without its dependencies into {install_dir()}, outside this "
        f"environment's packages; set {ENV_VAR} to use another folder)"
    )


def missing_extra() -> list[str]:
    """The modules of the ``eval`` extra that cannot be imported here."""
    return [name for name in EXTRA_MODULES if importlib.util.find_spec(name) is None]


def version_in(folder: Path) -> str | None:
    """The bfcl-eval version installed in ``folder`` (a ``--target`` or site folder), if any."""
    for found in metadata.distributions(name=DISTRIBUTION, path=[str(folder)]):
        version: str = found.version
        return version
    return None


def install_command(folder: Path) -> list[str]:
    """The pip command that puts bfcl-eval, and nothing else, into ``folder``."""
    return [
        sys.executable,
        "-m",
        "pip",
        "install",
        "--no-deps",
        "--upgrade",  # with --target: replace another version already in the folder
        "--disable-pip-version-check",
        "--target",
        str(folder),
        f"{DISTRIBUTION}=={VERSION}",
    ]


def install() -> tuple[Path, bool]:
    """Install bfcl-eval into ``install_dir()`` unless that version is there already.

    Returns the folder and whether pip ran. pip's own output goes to this process's stdout and
    stderr. Raises ``HermesAgentError`` (with what to do) when pip is missing or fails.
    """
    folder = install_dir()
    if version_in(folder) == VERSION:
        return folder, False
    if importlib.util.find_spec("pip") is None:
        manual = " ".join(install_command(folder)[3:])
        raise MissingDependencyError(
            f"this Python environment has no pip; install bfcl-eval yourself: pip {manual}"
        )
    writable = next((p for p in (folder, *folder.parents) if p.exists()), folder)
    if not os.access(writable, os.W_OK):
        raise HermesAgentError(
            f"cannot write to {folder} ({writable} is read-only); set {ENV_VAR} to a folder of "
            f"yours and run `{SETUP_COMMAND}` again"
        )
    done = subprocess.run(install_command(folder), check=False)
    if done.returncode != 0 or version_in(folder) != VERSION:
        raise HermesAgentError(
            f"pip could not install {DISTRIBUTION}=={VERSION} into {folder} "
            f"(exit status {done.returncode}; pip's messages are above)"
        )
    return folder, True
