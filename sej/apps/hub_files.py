"""The files that set up a hub, with this installation's paths: `sej-hub --print unit|crontab|config|alerts`.

    unit      the systemd unit, for /etc/systemd/system/sej-hub.service (runs sej-hub)
    crontab   the cron line, for /etc/cron.d/sej-hub (runs sej-hub-cron every 5 minutes)
    config    an example hub.toml, for /etc/sej/hub.toml
    alerts    Prometheus alerting rules for the hub's /metrics, for Prometheus's rule_files

They are package data (sej/apps/files/, in the wheel), templates in which `@BINDIR@` stands for the
directory of the console scripts and `@CONFIG@` for the hub.toml path (default /etc/sej/hub.toml).
render() fills them in; print_option() and config_option() are sej-hub's `--print` and `--config`.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import Callable
from importlib import resources
from typing import Any, TypeVar

import click

DEFAULT_CONFIG = "/etc/sej/hub.toml"

FILES = {"unit": "sej-hub.service", "crontab": "hub.crontab", "config": "hub.toml", "alerts": "sej-hub.rules.yml"}
"""What `sej-hub --print` writes: name -> its template under sej/apps/files/."""

SCRIPTS = ("sej-hub", "sej-hub-cron")
"""The console scripts the files run; pip puts both in the same directory."""


def template(name: str) -> str:
    """The template text of FILES[name], as the wheel carries it."""
    return resources.files(__package__).joinpath("files", FILES[name]).read_text(encoding="utf-8")


def scripts_dir(argv0: str | None = None) -> str:
    """The directory of this installation's console scripts (sej-hub, sej-hub-cron), absolute.

    1. The running program, when it is one of them: `sej-hub --print unit` names the very sej-hub that
       printed it, whether pip put it in a venv's bin/, /usr/local/bin (a system install), ~/.local/bin
       (--user) or elsewhere (--prefix). A symlink to it is kept as it is: it is what the user runs.
    2. Otherwise (`python3 -m sej.apps.hub --print unit`) the scripts directory of this interpreter's
       install scheme, where pip puts console scripts: in a venv `<venv>/bin` (sys.prefix is the venv),
       for a system Python its default scheme (Debian's: /usr/local/bin); then the --user scheme's, if
       sej-hub is there. If sej-hub is in neither, still the first: where `pip install` would put it.
    """
    argv0 = sys.argv[0] if argv0 is None else argv0
    if os.path.basename(argv0) in SCRIPTS and os.path.isfile(argv0):
        return os.path.dirname(os.path.abspath(argv0))
    default = sysconfig.get_path("scripts")
    candidates = [default]
    user_scheme = f"{os.name}_user"
    if user_scheme in sysconfig.get_scheme_names():
        candidates.append(sysconfig.get_path("scripts", user_scheme))
    for d in candidates:
        if os.path.isfile(os.path.join(d, SCRIPTS[0])):
            return os.path.abspath(d)
    return os.path.abspath(default)


def render(name: str, config: str | None = None, bindir: str | None = None) -> str:
    """FILES[name] with the scripts' directory (default scripts_dir()) and the hub.toml path filled in.

    `config` defaults to DEFAULT_CONFIG; a relative path is made absolute (cron and systemd do not run
    in the directory it was given in). A path with a space or a `%` is refused where the file names it:
    systemd's ExecStart and cron would split or expand it.
    """
    if name not in FILES:
        raise ValueError(f"no file {name!r}: choose one of {', '.join(FILES)}")
    config = os.path.abspath(config) if config is not None else DEFAULT_CONFIG
    bindir = bindir if bindir is not None else scripts_dir()
    text = template(name)
    for what, path, placeholder in (("the config path", config, "@CONFIG@"),
                                    ("the scripts' directory", bindir, "@BINDIR@")):  # fmt: skip
        if placeholder in text and any(c in path for c in " \t\n%\\\"'"):
            raise ValueError(f"{what} {path!r} has a space, a quote, a backslash or a '%': use a plain path")
    return text.replace("@BINDIR@", bindir.rstrip("/")).replace("@CONFIG@", config)


_F = TypeVar("_F", bound=Callable[..., Any])

_PRINT = "sej.apps.hub_files.print"
"""Where --print leaves its choice (ctx.meta) for --config's callback."""


def _remember_print(ctx: click.Context, param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.meta[_PRINT] = value


def _config_or_print(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    """--config's value; or, after --print, the file with this config path (default /etc/sej/hub.toml), and exit 0.

    --print is eager, so its callback has run before this one whatever the order on the command line; --config
    is required unless --print is given (checked here, since click's own check would come first).
    """
    name = ctx.meta.get(_PRINT)
    if name is None:
        if value is None:
            raise click.MissingParameter(ctx=ctx, param=param)
        return value
    try:
        text = render(name, config=value)
    except ValueError as e:
        raise click.BadParameter(str(e), ctx=ctx, param=param) from None
    click.echo(text, nl=False)
    ctx.exit(0)


def print_option() -> Callable[[_F], _F]:
    """sej-hub's `--print unit|crontab|config|alerts` (eager: it needs no valid config and runs nothing)."""
    return click.option(
        "--print",
        "print_file",
        type=click.Choice(tuple(FILES)),
        is_eager=True,
        expose_value=False,
        callback=_remember_print,
        help="Write the systemd unit, the crontab line or an example hub.toml, with this installation's paths "
        f"(and --config FILE, default {DEFAULT_CONFIG}) filled in, or Prometheus alerting rules for the "
        "hub's metrics, to stdout, and exit.",
    )


def config_option() -> Callable[[_F], _F]:
    """sej-hub's `--config FILE`: required, except with --print (which it then carries out)."""
    return click.option(
        "--config",
        "config_path",
        metavar="FILE",
        callback=_config_or_print,
        help="The hub.toml file (required, except with --print).",
    )
