"""`sej serve ROOT`: the producer's side of the hub's serve transport, on stdin and stdout (run by the hub over SSH)."""

from __future__ import annotations

import os
import sys

import click

from ...hub.serve_server import serve
from ...layout import check_reader_name
from ..shell import Failure, usage


@click.command("serve")
@click.argument("root")
@click.option("--restrict", is_flag=True,
              help="Serve ROOT whatever the hub asks for, and commit only the reader --reader (for a key pinned "
                   "to this command in authorized_keys).")  # fmt: skip
@click.option("--reader", default="hub", show_default=True, help="With --restrict: the one reader the hub may commit.")
def serve_cmd(root: str, restrict: bool, reader: str) -> None:
    """Serve the journals under ROOT to a hub over stdin and stdout (docs/hub.md, "sej serve").

    The hub runs this over SSH; it is not meant to be run by hand. It reads ROOT's journals (never
    following a link, never opening anything but regular files) and writes only reader offset files.
    """
    try:
        check_reader_name(reader)
    except ValueError as e:
        raise usage(str(e)) from None
    if not os.path.isdir(root):
        raise usage(f"{root} is not a directory")
    if sys.stdin.isatty() or sys.stdout.isatty():
        raise usage("sej serve speaks to a hub over stdin and stdout; the hub runs it over SSH")
    code = serve(root, restrict=restrict, reader=reader)
    if code:
        raise Failure(f"sej serve {root}: the stream ended abnormally (exit {code})")
