"""``psij config``: print the site defaults in effect (see :mod:`psij._site_config`) and the file
each comes from. It reads the configuration files and nothing else, and imports only
:mod:`psij.cli._common` of the command's modules."""

import sys
from typing import Any, List

from psij.cli._common import EXIT_FAILED, add_command

__all__ = ["add_config_command", "config_main"]


def add_config_command(commands: Any) -> None:
    parser = add_command(
        commands, "config", "show the site defaults in effect and where each comes from",
        "Print the configuration files looked at (highest precedence first) and, per executor, "
        "each default in effect with the file it comes from. A job's own values win over an "
        "executor configuration, which wins over these files.")
    parser.add_argument("--executor", metavar="NAME",
                        help="show only this executor's defaults")


def config_main(args: Any) -> int:
    from psij import _site_config

    lines: List[str] = ["Configuration files (highest precedence first):"]
    for role, path in _site_config.files():
        state = "found" if path.is_file() else "not found"
        lines.append(f"  {role:<12} {path}  ({state})")
    try:
        found = _site_config.settings()
    except _site_config.SiteConfigError as ex:
        sys.stdout.write("\n".join(lines) + "\n")
        print(f"psij config: error: {ex}", file=sys.stderr)
        return EXIT_FAILED
    names = sorted(found) if args.executor is None else [args.executor]
    for name in names:
        lines.append("")
        lines.append(f"[executors.{name}]")
        values = found.get(name, {})
        if not values:
            lines.append("  (no defaults)")
        for key in sorted(values):
            setting = values[key]
            lines.append(f"  {key} = {_toml(setting.value)}    # from {setting.source}")
    if not names:
        lines.append("")
        lines.append("No defaults are set.")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{_toml(k)} = {_toml(v)}" for k, v in value.items()) + " }"
    if isinstance(value, str):
        import json

        return json.dumps(value, ensure_ascii=False)
    return repr(value)
