"""A server that answers HTTP but is not a model server stops ``focus collect`` at once.

``focus collect --model-url`` at a plain web server (``python -m http.server``) or at
another JSON API on the port passed the first contact (a connection was made) and the
``/v1/models`` check (a 404 there says nothing), then failed every rollout of the first
wave, one progress line each, before its one line "refused every request (status 501)".
The command now posts ``{}`` to the generation endpoint of ``model.kind`` first
(:func:`focus.backends.reach.no_generation_endpoint`): 404, 405, 501 or a redirect there
is one line naming ``model.url`` and what was answered, before any progress line.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler
from pathlib import Path

import pytest
from fixtures.http_stub import serving
from fixtures.prefect import base_env, free_port

from focus.backends.reach import no_generation_endpoint

FOCUS = str(Path(sys.executable).with_name("focus"))
pytestmark = pytest.mark.integration  # every test but one starts a server on loopback


@contextlib.contextmanager
def answering(status: int, body: dict[str, object], headers: dict[str, str] | None = None) -> Iterator[str]:
    """A JSON server on loopback answering every GET and POST with ``status`` and ``body``."""

    class Handler(BaseHTTPRequestHandler):
        def _answer(self) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            for k, v in {"Content-Type": "application/json", **(headers or {})}.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = _answer

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as url:
        yield url


def test_a_json_api_without_the_endpoint_is_one_line_naming_the_url_and_the_answer():
    with answering(404, {"error": "no route", "path": "elsewhere"}) as url:
        line = no_generation_endpoint(url, "/v1/completions", field="model.url (--model-url)")
    assert line is not None and line.startswith(f"the server at {url} (model.url) answers HTTP but not as a model")
    assert 'POST /v1/completions was answered with status 404 ({"error": "no route"' in line, line
    assert "check model.url (--model-url)," in line and "model.kind 'openai'" in line, line


def test_a_redirect_names_where_it_points():
    with answering(301, {}, {"Location": "https://gpu0/v1/completions"}) as url:
        line = no_generation_endpoint(url, "/v1/completions") or ""
    assert "status 301 (a redirect to 'https://gpu0/v1/completions', which the client does not follow)" in line


@pytest.mark.parametrize("status", [400, 422, 401, 403, 500, 503])
def test_what_a_model_server_answers_a_request_without_a_prompt_goes_on(status):
    """A model server refuses ``{}`` as a request without a prompt (400, 422); a key it
    wants (401, 403) and a server still starting (5xx) are the first call's to say."""
    with answering(status, {"error": {"message": "Either prompt or prompt_embeds must be provided"}}) as url:
        assert no_generation_endpoint(url, "/v1/completions") is None


def test_no_answer_at_all_goes_on():
    assert no_generation_endpoint(f"http://127.0.0.1:{free_port()}", "/v1/completions") is None


def test_the_embedded_model_server_has_its_endpoints():
    from focus.backends import LocalModelServer, OpenAICompatPolicy, SGLangPolicy

    with LocalModelServer() as server:
        assert no_generation_endpoint(server.url, OpenAICompatPolicy.path) is None
        assert no_generation_endpoint(server.url, SGLangPolicy.path, kind="sglang") is None


def test_focus_collect_at_a_plain_web_server_fails_before_any_progress_line(tmp_path):
    """``python -m http.server`` answers 501 to every POST: the command printed a progress
    line per refused rollout of its first wave (ten or more) before its error line."""
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        from focus.backends.reach import first_contact

        assert first_contact([url], grace_s=10.0) is None  # it listens
        done = subprocess.run(
            [FOCUS, "collect", "--model-url", url, "--store", str(tmp_path / "runs"),
             "--log-file", str(tmp_path / "c.log")],
            cwd=tmp_path, env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    finally:
        web.terminate()
        web.wait(10)
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: the server at {url} (model.url) answers HTTP but not as a model server"), lines
    assert "POST /v1/completions was answered with status 501" in lines[0], lines
    assert "Unsupported method ('POST')" in lines[0] and "check model.url (--model-url)," in lines[0], lines


def test_focus_collect_at_a_json_api_names_the_sglang_endpoint(tmp_path):
    with answering(404, {"detail": "Not Found"}) as url:
        done = subprocess.run(
            [FOCUS, "collect", "--model-url", url + "/v1", "--set", "model.kind=sglang",
             "--store", str(tmp_path / "runs"), "--log-file", str(tmp_path / "c.log")],
            cwd=tmp_path, env=base_env(tmp_path / "prefect"), capture_output=True, text=True, timeout=120,
        )  # fmt: skip
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert done.returncode == 2 and len(lines) == 1, lines
    assert f"the server at {url} (model.url)" in lines[0], lines
    assert 'POST /generate was answered with status 404 ({"detail": "Not Found"})' in lines[0], lines
