"""Writes the component provider's plugin directory anywhere: `python -m nvlfabric.components.plugin_dir DIR`.

The plugin directory (`nvlfabric/components/plugin/`, shipped in the wheel) is three files:
`PulumiPlugin.yaml` (runtime python, `virtualenv: venv`), `__main__.py` (starts
`nvlfabric.components.pluginserver`) and `requirements.txt` (`nvlfabric[pulumi]==<this version>`). It
needs no checkout: the Pulumi engine creates `DIR/venv` and installs requirements.txt into it through
the Python language host's InstallDependencies when `pulumi package add DIR`, `pulumi package
get-schema DIR` or `pulumi install` (in a project whose `packages:` names DIR) runs. So this command
only copies the files out of the installed package, pinning the requirement to the nvlfabric that
runs it, or to `--requirement SPEC` (e.g. `nvlfabric[pulumi] @ https://.../nvlfabric-0.1.0-py3-none-any.whl`)
when pip should take nvlfabric from elsewhere than its index.
"""

from __future__ import annotations

import argparse
import shutil
from importlib import resources
from pathlib import Path

from nvlfabric.api.release import __version__

#: The plugin's files, as `pulumi package add` reads them; `venv/` is created beside them.
FILES = ("PulumiPlugin.yaml", "__main__.py", "requirements.txt")


def requirement() -> str:
    """What the plugin's virtualenv installs by default: this nvlfabric, with its Pulumi extra."""
    return f"nvlfabric[pulumi]=={__version__}"


def write(target: Path, spec: str | None = None) -> Path:
    """Writes the plugin directory at `target` (created; existing plugin files replaced, an existing
    `venv/` kept) with `spec` (default: `requirement()`) as its one requirement, and a `.gitignore`
    for `venv/` and `__pycache__/`. Returns `target`."""
    target.mkdir(parents=True, exist_ok=True)
    source = resources.files("nvlfabric.components") / "plugin"
    for name in FILES:
        with resources.as_file(source / name) as path:
            shutil.copyfile(path, target / name)
    reqs = target / "requirements.txt"
    comments = [line for line in reqs.read_text().splitlines() if line.startswith("#")]
    reqs.write_text("\n".join([*comments, spec or requirement()]) + "\n")
    # A project commits the plugin's files, not its environment (nor the bytecode of the __main__.py
    # that `python <dir>` imports).
    (target / ".gitignore").write_text("venv/\n__pycache__/\n")
    return target


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m nvlfabric.components.plugin_dir",
        description="Write nvlfabric's component provider plugin directory; then `pulumi package add DIR` "
                    "in a Pulumi project creates DIR/venv with nvlfabric installed and adds the package.")
    parser.add_argument("dir", type=Path, help="where to write it (created if missing)")
    parser.add_argument("--requirement", metavar="SPEC",
                        help=f"what DIR/venv installs instead of {requirement()} "
                             "(a pip requirement, e.g. 'nvlfabric[pulumi] @ <wheel URL>')")
    args = parser.parse_args(argv)
    where = write(args.dir, args.requirement)
    print(f"wrote {where}; next, in your Pulumi project: pulumi package add {where.resolve()}")


if __name__ == "__main__":
    main()
