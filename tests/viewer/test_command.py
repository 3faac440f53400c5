"""`ragen view` arguments and the errors a user sees."""

from __future__ import annotations

import argparse
import socket

import pytest
from fastapi.testclient import TestClient

from ragen.run.jsonl import RunDirError
from ragen.viewer import command
from ragen.viewer.app import create_app


def _parse(*argv):
    parser = argparse.ArgumentParser(prog="ragen view")
    command.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_bind_to_loopback():
    args = _parse("runs/x")
    assert (args.run_dir, args.port, args.host, args.export, args.step) == (
        "runs/x",
        8765,
        "127.0.0.1",
        None,
        None,
    )
    assert command.allowed_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "::1"]
    assert command.allowed_hosts("0.0.0.0") is None


@pytest.mark.parametrize(
    "argv", [("r", "--port", "0"), ("r", "--port", "http"), ("r", "--step", "-1")]
)
def test_bad_values_are_refused_by_the_parser(argv, capsys):
    with pytest.raises(SystemExit):
        _parse(*argv)
    assert "ragen view: error" in capsys.readouterr().err


def test_step_accepts_eval():
    assert _parse("r", "--step", "eval").step == "eval"
    assert _parse("r", "--step", "12").step == 12


def test_export_through_run(viewer_run, tmp_path, capsys):
    out = tmp_path / "step1.html"
    assert command.run(_parse(str(viewer_run), "--export", str(out), "--step", "1")) == 0
    assert out.is_file() and "wrote step 1 (8 episodes)" in capsys.readouterr().out


def test_not_a_run_directory(tmp_path):
    with pytest.raises(RunDirError, match="not a folder"):
        command.run(_parse(str(tmp_path / "nope")))
    with pytest.raises(RunDirError, match="not a run directory"):
        command.run(_parse(str(tmp_path)))


def test_a_taken_port_names_the_flag_to_change():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(RunDirError, match=f"pass --port {port + 1}"):
            command.check_port_free("127.0.0.1", port)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "127.1", "0x7f.1", "localhost", "::1"])
def test_every_loopback_address_keeps_the_host_check(viewer_run, host):
    allowed = command.allowed_hosts(host)
    assert allowed is not None and {"127.0.0.1", "localhost", "::1", host.lower()} <= set(allowed)
    guarded = TestClient(create_app(viewer_run, allowed_hosts=allowed))
    assert guarded.get("/api/version", headers={"host": "127.0.0.1:8765"}).status_code == 200
    assert guarded.get("/api/version", headers={"host": "rebound.example:8765"}).status_code == 400


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.20", "128.1"])
def test_public_addresses_accept_any_host_name(host):
    assert command.allowed_hosts(host) is None


@pytest.mark.parametrize(
    ("address", "guarded"), [("127.0.0.1", True), ("::1", True), ("10.1.2.3", False)]
)
def test_a_host_name_is_guarded_by_the_address_it_resolves_to(
    viewer_run, monkeypatch, address, guarded
):
    # `--host vm` where the machine's hosts file maps vm to 127.0.0.1 binds loopback.
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    answer = [(family, socket.SOCK_STREAM, 6, "", (address, 0))]
    monkeypatch.setattr(socket, "getaddrinfo", lambda host, *a, **k: answer if host == "vm" else [])
    allowed = command.allowed_hosts("vm")
    assert (allowed is not None) == guarded
    if guarded:
        app = TestClient(create_app(viewer_run, allowed_hosts=allowed))
        assert app.get("/api/version", headers={"host": "vm:8765"}).status_code == 200
        assert app.get("/api/version", headers={"host": "evil.com"}).status_code == 400
    assert command.allowed_hosts("no-such-name") is None
