"""Marks this folder as a package for the import contracts (pyproject.toml [tool.importlinter]); nothing to import."""
