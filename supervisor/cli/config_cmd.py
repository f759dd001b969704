"""``supervise config show``: the effective config after every layer."""

from __future__ import annotations

from pathlib import Path

import click

from ..config import load_config, render_yaml
from .common import echo_json, handle_errors


@click.group("config")
def config_group() -> None:
    """Inspect the effective configuration."""


@config_group.command("show")
@click.option("--config", "config_file", type=click.Path(path_type=Path), help="YAML config file.")
@click.option("--set", "sets", multiple=True, metavar="KEY=VALUE", help="Override one key (dotted).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of YAML.")
@handle_errors
def show(config_file: Path | None, sets: tuple[str, ...], as_json: bool) -> None:
    """Print the effective config: defaults < YAML file < SUPERVISE_* environment < --set."""
    cfg = load_config(config_file, sets=sets)
    if as_json:
        echo_json({"config": cfg.to_dict(), "config_hash": cfg.config_hash()})
    else:
        click.echo(f"# config_hash: {cfg.config_hash()}")
        click.echo(render_yaml(cfg), nl=False)


def register(group: click.Group) -> None:
    group.add_command(config_group)
