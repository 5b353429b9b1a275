"""Entry point of the nvlfabric component provider plugin (see PulumiPlugin.yaml beside it)."""

from nvlfabric.components.pluginserver import main

if __name__ == "__main__":
    main()
