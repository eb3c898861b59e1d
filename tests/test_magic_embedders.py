"""The concept embedders of MAGIC: offline MiniLM, an open_clip text tower, and the OpenAI embeddings API
(against a tiny local server on 127.0.0.1 that implements POST /v1/embeddings)."""

from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

import cglib.magic.embedders as emb
from cglib.config import Params


def _vector(text: str, dim: int = 8) -> list[float]:
    digest = hashlib.sha256(text.encode()).digest()
    return [b / 255.0 - 0.5 for b in digest[:dim]]


class EmbeddingsServer:
    """POST /v1/embeddings: a deterministic vector per input, returned in reverse order with `index` set."""

    def __init__(self) -> None:
        self.requests: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append({"path": self.path, "auth": self.headers.get("Authorization"), **body})
                if self.path != "/v1/embeddings":
                    self.send_response(404)
                    self.end_headers()
                    return
                data = [{"object": "embedding", "index": i, "embedding": _vector(t)} for i, t in enumerate(body["input"])]
                reply = {"object": "list", "data": data[::-1], "model": body["model"],
                         "usage": {"prompt_tokens": 1, "total_tokens": 1}}
                raw = json.dumps(reply).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_openai_embedder_talks_to_an_openai_compatible_server(monkeypatch):
    """The openai embedder sends the configured model and the key from llm.api_key_env, batches the inputs,
    restores the input order from `index`, and returns the server's vectors."""
    monkeypatch.setenv("MAGIC_TEST_KEY", "sk-test")
    monkeypatch.setattr(emb, "OPENAI_BATCH", 2)
    texts = ["birthday party", "wedding", "tennis match", "ski trip", "picnic"]
    with EmbeddingsServer() as server:
        params = Params.model_validate({"llm": {"base_url": server.url, "api_key_env": "MAGIC_TEST_KEY"},
                                        "magic": {"embedder": "openai"}})
        vectors = emb.make_embedder(params)(texts)
    assert vectors.shape == (5, 8) and vectors.dtype == np.float32
    np.testing.assert_allclose(vectors, np.asarray([_vector(t) for t in texts]), rtol=1e-6)
    assert [r["input"] for r in server.requests] == [texts[0:2], texts[2:4], texts[4:5]]
    assert {r["model"] for r in server.requests} == {"text-embedding-3-small"}
    assert {r["auth"] for r in server.requests} == {"Bearer sk-test"}


def test_the_authors_imported_embedder_is_one_key_away(monkeypatch):
    """The paper profiles' stated alternative (a guess at the published embedder): embedder openai with
    embedder_model text-embedding-ada-002 asks the server for that model."""
    monkeypatch.setenv("MAGIC_TEST_KEY", "sk-test")
    with EmbeddingsServer() as server:
        params = Params.model_validate({"llm": {"base_url": server.url, "api_key_env": "MAGIC_TEST_KEY"},
                                        "magic": {"embedder": "openai", "embedder_model": "text-embedding-ada-002"}})
        emb.make_embedder(params)(["birthday party"])
    assert [r["model"] for r in server.requests] == ["text-embedding-ada-002"]


def test_openai_embedder_without_key_names_the_variable(monkeypatch):
    """A missing API key is an error naming the environment variable to set."""
    monkeypatch.delenv("MAGIC_ABSENT_KEY", raising=False)
    params = Params.model_validate({"llm": {"api_key_env": "MAGIC_ABSENT_KEY"}, "magic": {"embedder": "openai"}})
    with pytest.raises(RuntimeError, match="MAGIC_ABSENT_KEY"):
        emb.make_embedder(params)


@pytest.mark.slow
def test_minilm_embedder_gives_unit_vectors_that_rank_related_concepts_first():
    """The default offline embedder returns unit 384-d vectors; 'birthday party' is closer to 'celebration'
    than to 'tennis match' (the property merging and hard negatives rely on)."""
    vectors = emb.normalize_rows(emb.make_embedder(Params())(["birthday party", "celebration", "tennis match"]))
    assert vectors.shape == (3, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2]


def test_open_clip_embedder_uses_the_named_text_tower():
    """magic.embedder open_clip builds the named open_clip model and embeds with its text tower."""
    params = Params.model_validate({"magic": {"embedder": "open_clip", "embedder_model": "cglib-tiny-clip"}})
    vectors = emb.make_embedder(params)(["a wedding", "a tennis match"])
    assert vectors.shape == (2, 128)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_embed_names_rejects_a_wrong_number_of_vectors_and_zero_vectors():
    """A broken embedder (wrong row count, zero vector) is caught with a clear error."""
    with pytest.raises(ValueError, match="returned 1 vectors for 2 texts"):
        emb.embed_names(lambda texts: np.ones((1, 3)), ["a", "b"])
    with pytest.raises(ValueError, match="zero or non-finite"):
        emb.embed_names(lambda texts: np.zeros((len(texts), 3)), ["a", "b"])
    table = emb.embed_names(lambda texts: np.eye(3)[: len(texts)] * 2, ["b", "a", "b"])
    assert set(table) == {"a", "b"} and np.allclose(np.linalg.norm(table["a"]), 1.0)
