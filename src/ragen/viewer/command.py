"""``ragen view RUN_DIR``: serve the trajectory viewer, or export one step to an HTML file.

The CLI wires these in with ``add_arguments(parser)`` and ``parser.set_defaults(func=run)``.
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket
import sys
from pathlib import Path

from ragen.run.jsonl import RunDirError
from ragen.viewer.store import MAX_STEP, RunStore, StepKey, parse_step

DEFAULT_PORT = 8765
DEFAULT_HOST = "127.0.0.1"
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1")
"""Host headers a loopback server always accepts, besides the address it was given."""


def _step_arg(text: str) -> StepKey:
    try:
        return parse_step(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from err


def _port_arg(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise argparse.ArgumentTypeError(f"{text} is not a port number (1 to 65535)")
    return port


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``ragen view``."""
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run directory (ragen train --out)")
    parser.add_argument(
        "--port", type=_port_arg, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT})"
    )
    parser.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to listen on (default {DEFAULT_HOST}: this machine only; "
        "0.0.0.0 shows the run's text to your whole network)",
    )
    parser.add_argument(
        "--export",
        metavar="FILE.html",
        help="write one step as a self-contained HTML file instead of serving",
    )
    parser.add_argument(
        "--step",
        type=_step_arg,
        metavar="N",
        help=f"the step to export or open (0 to {MAX_STEP}, or 'eval'; default: the latest)",
    )


def run(args: argparse.Namespace) -> int:
    """Serve the viewer until Ctrl+C, or write the export; returns the exit status."""
    root = Path(args.run_dir)
    if args.export:
        from ragen.viewer.export import EXPORT_BYTES, export_step
        from ragen.viewer.files import size_text

        step, count, total = export_step(root, args.step, args.export)
        held = f"{count} episodes" if count == total else f"the first {count} of {total} episodes"
        print(f"wrote step {step} ({held}) of {root} to {args.export}")
        if count < total:
            print(
                f"ragen view: an export holds at most {size_text(EXPORT_BYTES)} of episodes; "
                f"`ragen view {root}` shows them all",
                file=sys.stderr,
            )
        return 0
    RunStore(root)  # refuses a folder that is not a run directory before binding a port
    return serve(root, host=args.host, port=args.port, step=args.step)


def loopback_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address ``host`` names if it is a loopback one (127.0.0.0/8, ::1, localhost),
    written in any form the socket layer binds to (``127.1``, ``0x7f.1``), or a name the
    resolver maps to one (its first address, the one a bind takes); else None. The guard
    follows the address bound, never the name typed."""
    if host.lower() == "localhost":
        return ipaddress.ip_address("127.0.0.1")
    try:
        address = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        try:  # the shorthand IPv4 forms ipaddress refuses but bind() accepts
            address = ipaddress.IPv4Address(socket.inet_aton(host))
        except (OSError, ValueError):  # ValueError: a NUL in the text
            found = resolved_address(host)
            if found is None:
                return None
            address = found
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped:
        address = address.ipv4_mapped
    return address if address.is_loopback else None


def resolved_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The first address the resolver gives for the name ``host``; None if it gives none."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError, ValueError):
        return None
    for *_, sockaddr in infos:
        try:  # an IPv6 address may carry a %zone
            return ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        except ValueError:
            continue
    return None


def allowed_hosts(host: str) -> list[str] | None:
    """Host headers accepted: when bound to loopback, the loopback names and the address
    given (as typed and in canonical form); else any (None)."""
    address = loopback_address(host)
    if address is None:
        return None
    return list(dict.fromkeys([*LOOPBACK_NAMES, host.strip("[]").lower(), str(address)]))


def check_port_free(host: str, port: int) -> None:
    """Say which flag to change when the port is taken, instead of uvicorn's traceback."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise RunDirError(
                    f"port {port} on {host} is in use (another `ragen view`?): "
                    f"pass --port {port + 1}"
                ) from err
            raise RunDirError(f"cannot listen on {host}:{port} ({err}): check --host") from err


def serve(root: Path, *, host: str, port: int, step: StepKey | None = None) -> int:
    from ragen.viewer.app import create_app
    from ragen.viewer.connections import make_server

    check_port_free(host, port)
    allowed = allowed_hosts(host)
    app = create_app(root, allowed_hosts=allowed)
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{port}/"
    if step is not None:
        url += f"#/step/{step}"
    print(f"ragen view: {root} at {url} (Ctrl+C to stop)")
    if allowed is None:
        print(
            f"ragen view: listening on {host}: anyone who can reach this machine can read the run",
            file=sys.stderr,
        )
    make_server(app, host, port).run()
    return 0
