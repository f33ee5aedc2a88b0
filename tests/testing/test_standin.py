"""The CPython stand-in for the workers SDK: same classes, never over the real SDK."""

import sys

import pytest
import workers

from durability.testing import _workers_standin as standin, install_workers_standin


def test_importing_durability_testing_makes_workers_importable():
    assert getattr(workers, "__durability_standin__", False)
    assert {"DurableObject", "WorkerEntrypoint", "Request", "Response"} <= set(dir(workers))


def test_constructors_keep_ctx_and_env_like_the_sdk():
    class Thing(workers.DurableObject):
        def __init__(self, ctx, env):
            super().__init__(ctx, env)

    thing = Thing("ctx", "env")
    assert (thing.ctx, thing.env) == ("ctx", "env")
    entry = workers.WorkerEntrypoint("c", "e")
    assert (entry.ctx, entry.env) == ("c", "e")


def test_it_never_replaces_the_real_sdk_inside_pyodide(monkeypatch):
    real = object()
    monkeypatch.setattr(sys, "platform", "emscripten")
    monkeypatch.setitem(sys.modules, "workers", real)
    assert install_workers_standin() is real
    assert sys.modules["workers"] is real


def test_request_and_response_read_like_the_sdks():
    import asyncio

    request = workers.Request("https://x.test/a?b=1", method="POST", headers={"Authorization": "Bearer t"},
                              body='{"k": 1}')
    assert request.headers.get("authorization") == "Bearer t"  # case-insensitive
    assert asyncio.run(request.json()) == {"k": 1}
    with pytest.raises(TypeError, match="already been used"):
        asyncio.run(request.text())
    response = workers.Response.json({"ok": True}, status=201)
    assert response.status == 201 and response.headers["content-type"] == "application/json"
    assert asyncio.run(response.json()) == {"ok": True}
    with pytest.raises(TypeError):
        workers.Request("not a url")
    with pytest.raises(TypeError):
        workers.Request("https://x.test/", method="GET", body="x")
    with pytest.raises(TypeError):
        workers.Response(123)


def test_the_standin_module_is_built_fresh_and_complete():
    module = standin._build_module()
    assert module.DurableObject is standin.DurableObject
    with pytest.raises(ImportError):
        module.import_from_javascript("cloudflare:workers")
