"""The old path of the component provider's plugin server (`nvlfabric.components.pluginserver`).

A plugin directory written by an earlier release (`python -m nvlfabric.components.plugin_dir`)
holds a `__main__.py` that imports `main` from here; it keeps working until that directory is
rewritten. Nothing in nvlfabric imports this module."""

from nvlfabric.components.pluginserver import main

__all__ = ["main"]
