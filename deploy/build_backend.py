"""Build backend of the server distribution (`threadrun-server`): setuptools, editable only.

The server's import packages are `app`, `shared` and `workers`, names that many applications
use for their own code. Installed from a wheel they would land in site-packages under those
names and shadow a user's packages (or be shadowed by them). The server is deployed from a
source tree instead: a checkout (`make install`) or the image (deploy/Dockerfile installs /app
editable). So this backend refuses every wheel and sdist hook: there is nothing of the server
to publish, and `pip install .` or `pip install git+<repository>` of the root stops at its
first hook, before any dependency is downloaded, with a pointer to the client distribution
(clients/python), which is what a user wants. The editable hooks are setuptools' own.
"""

from __future__ import annotations

from typing import NoReturn

from setuptools.build_meta import (
    build_editable,
    get_requires_for_build_editable,
    prepare_metadata_for_build_editable,
)

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
    "prepare_metadata_for_build_editable",
    "prepare_metadata_for_build_wheel",
]

REFUSAL = (
    "threadrun-server is installed from its source tree only (pip install -e ./clients/python "
    "-e ., as `make install` and deploy/Dockerfile do): a wheel would put its top-level "
    "packages app, shared and workers into site-packages. For the Python client and the "
    "`threadrun` command, install clients/python instead (pip install ./clients/python, or "
    "git+<repository>#subdirectory=clients/python)."
)


def refuse(*_args: object, **_kwargs: object) -> NoReturn:
    """Every PEP 517 wheel and sdist hook: exit with `REFUSAL` (see the module docstring)."""
    raise SystemExit(REFUSAL)


get_requires_for_build_wheel = prepare_metadata_for_build_wheel = build_wheel = refuse
get_requires_for_build_sdist = build_sdist = refuse
