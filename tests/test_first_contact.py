"""A model URL nothing answers fails in seconds; a service that answered is waited for.

``focus collect --model-url`` at a closed port on 127.0.0.1 waited the whole outage
window (``model.http.outage_wait_s``, 300 s) and then failed its first wave: a wrong
port looked like a restart. The command now asks the URL before anything starts
(:func:`focus.backends.reach.first_contact`): a real closed port is one line naming the
URL and exit 2 within seconds; a port that takes connections and does not answer yet (a
server loading its weights), or a fleet with one replica there, goes on.
"""

from __future__ import annotations

import contextlib
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.prefect import base_env, free_port

from focus.backends.reach import first_contact, scheduler_contact

FOCUS = str(Path(sys.executable).with_name("focus"))


def test_a_closed_port_is_one_line_naming_the_url():
    url = f"http://127.0.0.1:{free_port()}"
    line = first_contact([url], grace_s=0.6)
    assert line is not None and line.startswith(f"cannot reach the model service at {url}: no connection in 0.6 s")
    assert "Connection refused" in line and "model.url" in line


def test_an_unknown_host_is_not_retried():
    line = first_contact(["http://no-such-host.invalid:8000"], grace_s=30.0)  # a name lookup fails at once
    assert line is not None and "its host name is not known" in line


@pytest.mark.integration
def test_a_port_that_takes_connections_is_there_whatever_it_answers(monkeypatch):
    """A server that accepts and never answers (vLLM loading its weights) is not refused
    here: the outage and silence watches of the run take it from there. Its answer is
    waited for 0.3 s, not the default 3 s (twice: 6 s), to the same end: the connection
    was made, and no answer is an answer."""
    from focus.backends import reach

    monkeypatch.setattr(reach, "CONNECT_S", 0.3)
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        url = f"http://127.0.0.1:{listening.getsockname()[1]}"
        assert first_contact([url], grace_s=0.6) is None
        # a fleet with one replica down goes on with the one that is there
        assert first_contact([f"http://127.0.0.1:{free_port()}", url], grace_s=0.6) is None
        assert scheduler_contact(url.replace("http://", "tcp://"), grace_s=0.6) is None


def test_a_dask_scheduler_address_at_a_closed_port_is_one_line():
    address = f"tcp://127.0.0.1:{free_port()}"
    line = scheduler_contact(address, grace_s=0.6)
    assert line is not None and line.startswith(f"cannot reach the Dask scheduler at {address!r}: no connection in 0.6")
    assert "check execution.address:" in line and "or leave it out to run rollouts in-process" in line, line
    assert scheduler_contact("inproc://1.2.3.4/5/6") is None  # not TCP: Dask's own check


def test_a_flow_run_names_the_setting_where_its_value_came_from(monkeypatch):
    """A flow run a deployment started names the field of its ``config`` parameter, or the
    worker's variable when the value is that variable's (it said ``--model-url``, a flag
    its user never saw); a command names its flags. The contacts try for 0.6 s, not the
    default 5 s (two of them cost 10 s): the line's wording is what is checked here, the
    default's wait by the command tests below."""
    import functools

    from flows.preflight import COMMAND_NAMES, CommandNames, run_setting, unreachable
    from focus.backends import reach
    from tasks.config import FocusConfig

    monkeypatch.setattr(reach, "scheduler_contact", functools.partial(reach.scheduler_contact, grace_s=0.6))

    url = f"http://127.0.0.1:{free_port()}"
    assert run_setting("model.url", url, {}) == "the model.url field of the run's config parameter"
    via_env = run_setting("model.url", url, {"FOCUS_MODEL__URL": url + "/"})
    assert via_env == "FOCUS_MODEL__URL (where this flow run runs)"
    assert run_setting("model.url", url, {"FOCUS_MODEL__URL": "http://elsewhere:1"}).startswith("the model.url field")
    address = f"tcp://127.0.0.1:{free_port()}"
    cfg = FocusConfig.model_validate({"execution": {"kind": "dask", "address": address}})
    line = unreachable(cfg) or ""
    assert "check the execution.address field of the run's config parameter:" in line and "--" not in line, line
    token = COMMAND_NAMES.set(CommandNames(dask_address="execution.address (--dask-address)"))
    try:
        assert "check execution.address (--dask-address):" in (unreachable(cfg) or "")
    finally:
        COMMAND_NAMES.reset(token)


def test_a_critic_url_nothing_answers_is_one_line_naming_the_critic():
    """``critic.kind = "http"`` with ``critic.url`` at a closed port waited
    ``critic.http.outage_wait_s`` (300 s) after the evidence ran, as an outage, where the
    same mistake in ``model.url`` is one line in seconds. The contact tries for
    ``critic.http.first_contact_s`` = 0.6 s here (the line says so)."""
    from flows.preflight import unreachable
    from tasks.config import FocusConfig

    url = f"http://127.0.0.1:{free_port()}/score"
    cfg = FocusConfig.model_validate({"critic": {"kind": "http", "url": url, "http": {"first_contact_s": 0.6}}})
    line = unreachable(cfg) or ""
    assert line.startswith(f"cannot reach the critic service at {url}: no connection in 0.6 s"), line
    assert "check the critic.url field of the run's config parameter," in line, line
    assert "(critic.http.outage_wait_s)" in line and "model" not in line, line
    assert "wait longer: critic.http.first_contact_s" in line, line


def test_the_first_contact_waits_as_long_as_the_model_client_is_told(monkeypatch):
    """``model.http.first_contact_s`` (5 s by default, as the constant it replaced) is how
    long the contact tries: a server that opens its port only once its weights are loaded
    (SGLang) is waited for longer, a script's closed port fails sooner. What each contact
    was given is recorded here (nothing waits); the line names the wait and the setting."""
    from flows.preflight import unreachable
    from focus.backends import reach
    from tasks.config import FocusConfig

    asked: list[float] = []

    def refused(targets, connects, grace_s):
        asked.append(grace_s)
        return targets[0], ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(reach, "_first", refused)
    url = f"http://127.0.0.1:{free_port()}"
    served = {"kind": "openai", "url": url}
    assert reach.FIRST_CONTACT_S == 5.0 and "no connection in 5 s" in (unreachable(FocusConfig(model=served)) or "")
    line = unreachable(FocusConfig.model_validate({"model": {**served, "http": {"first_contact_s": 600}}})) or ""
    assert line.startswith(f"cannot reach the model service at {url}: no connection in 600 s"), line
    assert "wait longer: model.http.first_contact_s" in line, line
    critic = {"kind": "http", "url": url, "http": {"first_contact_s": 0.25}}
    assert "no connection in 0.25 s" in (unreachable(FocusConfig.model_validate({"critic": critic})) or "")
    assert asked == [5.0, 600.0, 0.25]


@pytest.mark.integration
def test_focus_collect_at_a_closed_port_fails_in_seconds(tmp_path):
    """Before, this waited model.http.outage_wait_s (300 s): the subprocess's timeout fails it.
    The contact tries for ``model.http.first_contact_s`` = 0.5 s, set as a user sets it (the
    default's 5 s is the test above's)."""
    url = f"http://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [FOCUS, "collect", "--model-url", url, "--store", str(tmp_path / "runs"), "--log-file", str(tmp_path / "c.log"),
         "--set", "model.http.first_contact_s=0.5"],
        cwd=tmp_path, env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot reach the model service at {url}: no connection in 0.5 s"), lines
    assert "check model.url (--model-url)," in lines[0], lines  # the command names its flag
    assert not (tmp_path / "runs" / "checkpoints").exists() or not any((tmp_path / "runs" / "checkpoints").iterdir())


@pytest.mark.integration
def test_focus_collect_with_a_dask_scheduler_at_a_closed_port_fails_before_anything_starts(tmp_path):
    """Dask retried the refused port for its 30 s connect timeout, after the model server
    had started, and the line was ``RuntimeError: cannot reach ...`` with exit 1."""
    address = f"tcp://127.0.0.1:{free_port()}"
    done = subprocess.run(
        [FOCUS, "collect", "--dask-address", address, "--collection-id", "d", "--store", str(tmp_path / "runs"),
         "--log-file", str(tmp_path / "c.log")],
        cwd=tmp_path, env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: cannot reach the Dask scheduler at {address!r}: no connection in 5 s"), lines
    assert "check execution.address (--dask-address):" in lines[0], lines  # the command names its flag


@pytest.mark.integration
@pytest.mark.needs("tinker")  # a loop on a served model trains a Tinker model (a dry run without a key)
def test_focus_train_at_a_closed_port_fails_once_a_step_needs_the_model(tmp_path):
    """The loop asks the URL when its first step needs the model (a finished loop never
    does): it waited model.http.outage_wait_s (300 s) in its first collection."""
    url = f"http://127.0.0.1:{free_port()}"
    sets = {"model.url": url, "model.kind": "openai", "model.model": "Qwen/Qwen3-4B", "model.http.first_contact_s": 0.5}
    done = subprocess.run(
        [FOCUS, "train", "--trainer", "tinker", "--iterations", "1", "--tasks", "2", "--transitions", "6",
         "--store", str(tmp_path / "runs"), "--log-file", str(tmp_path / "t.log"),
         *[a for k, v in sets.items() for a in ("--set", f"{k}={v}")]],
        cwd=tmp_path, env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2, lines
    assert lines[-1].startswith(f"error: cannot reach the model service at {url}: no connection in 0.5 s"), lines


@pytest.mark.needs("distributed")
def test_a_dask_address_that_cannot_be_used_is_its_own_line_not_a_bug():
    """Dask's own check of the scheduler (past the command's, or from the library) said
    ``RuntimeError: cannot reach ...`` with a pointer to a traceback, as for a bug."""
    from flows.errors import explained, one_line
    from focus.dask_checks import SchedulerUnreachable, answers

    with pytest.raises(SchedulerUnreachable) as e:
        answers(f"tcp://127.0.0.1:{free_port()}", 0.5, "a test's timeout")
    assert one_line(e.value).startswith("cannot reach the Dask scheduler at 'tcp://127.0.0.1:"), one_line(e.value)
    assert explained(e.value)


@pytest.mark.integration
def test_a_server_whose_certificate_this_check_does_not_trust_is_there(tmp_path):
    """A TLS server on the port (here self-signed; in use, one behind a private CA that the
    system's store holds and certifi's does not) took a connection: whether its
    certificate is trusted is the model client's to say. The check read the failed
    handshake as no connection and refused the URL after 5 s."""
    import datetime
    import ssl
    import threading

    x509 = pytest.importorskip("cryptography.x509")
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
        .serial_number(1).not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp_path / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "key.pem").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    accepted: list[int] = []
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        listening.settimeout(10)

        def serve() -> None:
            with contextlib.suppress(OSError):
                conn, _ = listening.accept()
                accepted.append(1)
                with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True):
                    pass  # the client refuses the certificate during the handshake

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        assert first_contact([f"https://127.0.0.1:{listening.getsockname()[1]}"], grace_s=0.6) is None
        thread.join(10)
    assert accepted == [1]
