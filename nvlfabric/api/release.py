"""This release of nvlfabric: the one place its version is written (docs/compatibility.md, "Versions").

The wheel's version (pyproject.toml reads this file without importing it), `nvlfabric.__version__`,
the agent image tag the driver deploys, the component provider's plugin version and the requirement
its plugin directory pins all derive from it; tests/packaging/test_release.py holds them, the CHANGELOG and
the git tag to it. PEP 440: a release is X.Y.Z; between releases main carries the next one as
X.Y.Z.devN. A plain literal assignment, so setuptools reads it statically.
"""

__version__ = "0.2.0.dev0"
