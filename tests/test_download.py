"""Downloads from a local HTTP server on 127.0.0.1 only: resume, restart, checksums, zips."""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import json
import random
import socket
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import REPO_ROOT, hierarcaps_data
from PIL import Image

from cglib.config import load_params
from cglib.data import download as dl
from cglib.data.download import (
    NAMED_DOWNLOADS,
    DownloadError,
    NamedDownload,
    RemoteFile,
    download,
    download_hierarcaps_images,
    download_named,
    extract_zip,
)
from cglib.data.hierarcaps_train import load_hierarcaps_train
from cglib.data.verify import ChecksumError
from cglib.run import file_digest

PAYLOAD = random.Random(0).randbytes(300_000)  # not a multiple of the 1 MiB chunk, nor of anything else


@dataclass
class ServerState:
    files: dict[str, bytes] = field(default_factory=dict)
    requests: list[tuple[str, str | None]] = field(default_factory=list)  # (path, Range header)
    drops_left: dict[str, int] = field(default_factory=dict)  # path -> connections still to cut mid-body


class Handler(BaseHTTPRequestHandler):
    """Behaviour by the first path segment: range, norange, drop, alwaysdrop, corrupt, error500; else 404."""

    state: ServerState

    def log_message(self, *args: object) -> None:  # keep pytest output clean
        pass

    def do_GET(self) -> None:
        self.state.requests.append((self.path, self.headers.get("Range")))
        mode, _, name = self.path.lstrip("/").partition("/")
        body = self.state.files.get(name)
        if body is None or mode not in {"range", "norange", "drop", "alwaysdrop", "corrupt", "error500"}:
            self.send_error(404)
            return
        if mode == "error500":
            self.send_error(500)
            return
        if mode == "corrupt":
            body = body[:1000] + bytes([body[1000] ^ 0xFF]) + body[1001:]
        start = 0
        range_header = self.headers.get("Range")
        if range_header and mode != "norange":
            start = int(range_header.removeprefix("bytes=").split("-")[0])
            if start >= len(body):
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{len(body)}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
        else:
            self.send_response(200)
        rest = body[start:]
        self.send_header("Content-Length", str(len(rest)))
        self.end_headers()
        drop = mode == "alwaysdrop" or (mode == "drop" and self.state.drops_left.get(self.path, 1) > 0)
        if drop:  # promise the whole body, send a third, then cut the connection
            self.state.drops_left[self.path] = self.state.drops_left.get(self.path, 1) - 1
            self.wfile.write(rest[: max(1, len(rest) // 3)])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(rest)


@pytest.fixture
def server() -> Iterator[tuple[str, ServerState]]:
    """A threaded HTTP server on a free 127.0.0.1 port, serving PAYLOAD as /<mode>/file.bin."""
    state = ServerState(files={"file.bin": PAYLOAD})
    handler = type("BoundHandler", (Handler,), {"state": state})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", state
    finally:
        httpd.shutdown()
        httpd.server_close()


SHA = hashlib.sha256(PAYLOAD).hexdigest()
MD5 = hashlib.md5(PAYLOAD).hexdigest()


def test_plain_download_with_checksums(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """The file arrives intact, checksums pass, no .part is left; a folder dest keeps the URL name."""
    base, state = server
    out = download(f"{base}/range/file.bin", tmp_path / "a.bin", sha256=SHA, md5=MD5, progress=False)
    assert out.read_bytes() == PAYLOAD and not (tmp_path / "a.bin.part").exists()
    assert download(f"{base}/range/file.bin", tmp_path, progress=False) == tmp_path / "file.bin"
    assert state.requests == [("/range/file.bin", None), ("/range/file.bin", None)]


def test_resume_from_part_file_uses_range(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """An existing .part is continued with `Range: bytes=N-`, not downloaded again."""
    base, state = server
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD[:123_456])
    download(f"{base}/range/file.bin", tmp_path / "a.bin", sha256=SHA, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert state.requests == [("/range/file.bin", "bytes=123456-")]


def test_server_ignoring_range_restarts(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """When the server answers 200 to a Range request, the .part is rewritten from byte 0 (not appended)."""
    base, state = server
    (tmp_path / "a.bin.part").write_bytes(b"stale bytes that must not survive")
    download(f"{base}/norange/file.bin", tmp_path / "a.bin", sha256=SHA, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    assert state.requests == [("/norange/file.bin", "bytes=33-")]


def test_dropped_connection_is_resumed(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """A connection cut mid-body is retried from where it stopped, and the result is exact."""
    base, state = server
    state.drops_left["/drop/file.bin"] = 2
    download(f"{base}/drop/file.bin", tmp_path / "a.bin", sha256=SHA, progress=False, retries=3, backoff_s=0)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD
    first, second, third = [r[1] for r in state.requests]
    assert first is None and second == f"bytes={len(PAYLOAD) // 3}-"
    assert third == f"bytes={len(PAYLOAD) // 3 + (len(PAYLOAD) - len(PAYLOAD) // 3) // 3}-"


def test_retries_exhausted_keeps_part_for_later(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """After the last retry a DownloadError says how much is kept; a later run resumes from there."""
    base, state = server
    with pytest.raises(DownloadError, match=r"failed after 2 attempts .* run again to resume"):
        download(f"{base}/alwaysdrop/file.bin", tmp_path / "a.bin", progress=False, retries=1, backoff_s=0)
    kept = (tmp_path / "a.bin.part").stat().st_size
    assert 0 < kept < len(PAYLOAD) and not (tmp_path / "a.bin").exists()
    assert (tmp_path / "a.bin.part").read_bytes() == PAYLOAD[:kept]
    download(f"{base}/range/file.bin", tmp_path / "a.bin", sha256=SHA, progress=False)
    assert state.requests[-1] == ("/range/file.bin", f"bytes={kept}-")


def test_complete_part_file_answered_416(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """A .part that already holds the whole file gets 416 with the same size, and is accepted as complete."""
    base, _ = server
    (tmp_path / "a.bin.part").write_bytes(PAYLOAD)
    out = download(f"{base}/range/file.bin", tmp_path / "a.bin", md5=MD5, progress=False)
    assert out.read_bytes() == PAYLOAD


@pytest.mark.parametrize("algorithm", ["sha256", "md5"])
def test_corrupted_file_fails_checksum(server: tuple[str, ServerState], tmp_path: Path,
                                       algorithm: str) -> None:
    """A corrupted transfer raises ChecksumError with both digests and leaves neither the file nor a .part."""
    base, _ = server
    bad = PAYLOAD[:1000] + bytes([PAYLOAD[1000] ^ 0xFF]) + PAYLOAD[1001:]
    expected = {"sha256": SHA, "md5": MD5}[algorithm]
    with pytest.raises(ChecksumError) as err:
        download(f"{base}/corrupt/file.bin", tmp_path / "a.bin", progress=False, **{algorithm: expected})
    actual = hashlib.new(algorithm, bad).hexdigest()
    assert expected in str(err.value) and actual in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_http_errors(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """404 fails at once (no retry); 500 is retried, then reported."""
    base, state = server
    with pytest.raises(DownloadError, match="HTTP 404"):
        download(f"{base}/range/missing.bin", tmp_path / "a.bin", progress=False, retries=3, backoff_s=0)
    assert len(state.requests) == 1
    with pytest.raises(DownloadError, match=r"failed after 3 attempts .*HTTP 500"):
        download(f"{base}/error500/file.bin", tmp_path / "b.bin", progress=False, retries=2, backoff_s=0)
    assert len(state.requests) == 4


def test_existing_file_is_verified_not_refetched(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """A present file with the right checksum is kept without a request; a wrong one is fetched again."""
    base, state = server
    (tmp_path / "a.bin").write_bytes(PAYLOAD)
    download(f"{base}/range/file.bin", tmp_path / "a.bin", sha256=SHA, progress=False)
    assert state.requests == []
    (tmp_path / "a.bin").write_bytes(b"old version")
    download(f"{base}/range/file.bin", tmp_path / "a.bin", sha256=SHA, progress=False)
    assert (tmp_path / "a.bin").read_bytes() == PAYLOAD and len(state.requests) == 1


def make_zip(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def test_extract_zip_once_and_safely(tmp_path: Path) -> None:
    """A zip extracts once (a marker skips the second time); '..' members and corrupt zips are refused."""
    good = tmp_path / "good.zip"
    good.write_bytes(make_zip({"annotations/captions_val2017.json": b"{}", "val2017/a.txt": b"a"}))
    out = tmp_path / "out"
    assert extract_zip(good, out, progress=False) == out
    assert (out / "annotations/captions_val2017.json").read_bytes() == b"{}"
    (out / "val2017/a.txt").unlink()
    extract_zip(good, out, progress=False)
    assert not (out / "val2017/a.txt").exists()  # skipped thanks to the marker
    evil = tmp_path / "evil.zip"
    evil.write_bytes(make_zip({"../escaped.txt": b"x"}))
    with pytest.raises(ValueError, match="outside"):
        extract_zip(evil, out, progress=False)
    assert not (tmp_path / "escaped.txt").exists()
    broken = tmp_path / "broken.zip"
    broken.write_bytes(good.read_bytes()[:50])
    with pytest.raises(ValueError, match="not a valid zip .* download it again"):
        extract_zip(broken, tmp_path / "out2", progress=False)


def test_download_named_fetches_and_extracts(server: tuple[str, ServerState], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A registry entry pointed at the local server downloads, checks, extracts and returns its outputs."""
    base, state = server
    archive = make_zip({"annotations/captions_train2017.json": b"{}",
                        "annotations/captions_val2017.json": b"{}"})
    state.files["ann.zip"] = archive
    entry = NamedDownload("test", (RemoteFile("coco-annotations-2017", f"{base}/range/ann.zip", "ann.zip",
                                              md5=hashlib.md5(archive).hexdigest(), extract=True),),
                          NAMED_DOWNLOADS["coco-annotations"].outputs)
    monkeypatch.setitem(NAMED_DOWNLOADS, "coco-annotations", entry)
    outputs = download_named("coco-annotations", tmp_path / "coco", progress=False, remove_archives=True)
    assert outputs == [tmp_path / "coco/annotations/captions_train2017.json",
                       tmp_path / "coco/annotations/captions_val2017.json"]
    assert all(p.is_file() for p in outputs) and not (tmp_path / "coco/ann.zip").exists()
    assert download_named("coco-annotations", tmp_path / "coco", progress=False) == outputs
    assert len(state.requests) == 1  # the second call found the extraction marker
    with pytest.raises(ValueError, match="unknown download 'coco'; choose one of: coco-annotations"):
        download_named("coco", tmp_path)


def test_hierarcaps_images_from_csv(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """Every image_url of a HierarCaps CSV is fetched under its file name; present files are not refetched."""
    base, state = server
    names = [f"COCO_val2014_{i:012d}.jpg" for i in range(1, 4)]
    for i, name in enumerate(names):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (i * 60, 0, 0)).save(buffer, format="JPEG")
        state.files[name] = buffer.getvalue()
    rows = "".join(f'{i},"a => b => c => d",{base}/range/{name}\n' for i, name in enumerate(names))
    csv_path = tmp_path / "hc.csv"
    csv_path.write_text("id,captions,image_url\n" + rows, encoding="utf-8")
    (tmp_path / "imgs").mkdir()
    (tmp_path / "imgs" / names[0]).write_bytes(state.files[names[0]])
    download_hierarcaps_images(csv_path, tmp_path / "imgs", workers=2, progress=False)
    assert sorted(p.name for p in (tmp_path / "imgs").iterdir()) == names
    assert all((tmp_path / "imgs" / n).read_bytes() == state.files[n] for n in names)
    assert sorted(r[0] for r in state.requests) == [f"/range/{n}" for n in names[1:]]
    state.files.pop(names[2])
    (tmp_path / "imgs" / names[2]).unlink()
    with pytest.raises(DownloadError, match="1 of 3 images failed .*HTTP 404"):
        download_hierarcaps_images(csv_path, tmp_path / "imgs", progress=False, retries=0)


# no published checksum (see HIERARCAPS_TRAIN and COCO_ANNOTATIONS_2014 in download.py): their structure is checked
UNCHECKED_FILES = {dl.HIERARCAPS_TRAIN.file_name, dl.COCO_ANNOTATIONS_2014.file_name}


def test_registry_is_well_formed() -> None:
    """Every named download has https/http URLs on the expected hosts, a source name of its own, a checksum and a
    size (but the listed, which have a structural check), an archive's members, and outputs."""
    assert {"coco-annotations", "coco-images", "hierarcaps", "hierarcaps-1k", "hierarcaps-train"} <= set(NAMED_DOWNLOADS)
    sources = {}
    for name, entry in NAMED_DOWNLOADS.items():
        assert entry.files and entry.outputs and entry.description, name
        for remote in entry.files:
            hosts = ("http://images.cocodataset.org/", "https://raw.githubusercontent.com/",
                     "https://huggingface.co/datasets/tau-vailab/HierarCaps/")
            assert remote.url.startswith(hosts)
            assert remote.url.endswith(remote.file_name)
            assert sources.setdefault(remote.source, remote) == remote, remote.source  # one source, one file
            if remote.file_name in UNCHECKED_FILES:
                assert remote.check() is not None and remote.size_bytes is None, name
            else:
                assert len(remote.md5 or "") == 32 or len(remote.sha256 or "") == 64, name
                assert remote.size_bytes, name
            if remote.extract:
                assert remote.kind == "zip" and remote.members, name


def test_hierarcaps_train_download_then_load(server: tuple[str, ServerState], tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """`hierarcaps-train` pointed at the local server fetches the gzip CSV byte for byte (no checksum to check,
    no extraction), and load_hierarcaps_train reads it: good rows kept, bad rows counted."""
    base, state = server
    rows = ['"a => b => c => a dog runs","x => y => z => a cat sits"',
            '"animal => dog => puppy => a puppy sleeps","plant => tree => oak => an oak grows"',
            '"only => three => tiers","x => y => z => w"']
    body = gzip.compress(("positive,negative\n" + "\n".join(rows) + "\n").encode("utf-8"))
    state.files["hierarcaps_train.csv.gz"] = body
    real = NAMED_DOWNLOADS["hierarcaps-train"]
    assert real.files[0].sha256 is None and real.files[0].md5 is None and not real.files[0].extract
    local = dataclasses.replace(real.files[0], url=f"{base}/range/hierarcaps_train.csv.gz")
    monkeypatch.setitem(NAMED_DOWNLOADS, "hierarcaps-train", dataclasses.replace(real, files=(local,)))
    (out,) = download_named("hierarcaps-train", tmp_path / "hc", progress=False)
    assert out == tmp_path / "hc" / "hierarcaps_train.csv.gz" and out.read_bytes() == body
    items, skipped = load_hierarcaps_train(out)
    assert [item.positives for item in items] == [("a", "b", "c", "a dog runs"),
                                                  ("animal", "dog", "puppy", "a puppy sleeps")]
    assert items[1].negatives == ("plant", "tree", "oak", "an oak grows")
    assert skipped == {"wrong number of tiers": 1}


def test_hierarcaps_checksum_matches_the_published_csv(shared_data: Path) -> None:
    """The pinned sha256 and size are those of the HierarCaps test CSV (the copy in shared/data)."""
    csv_path = shared_data / "hierarcaps" / "hierarcaps_test.csv"
    assert file_digest(csv_path, "sha256") == dl.HIERARCAPS_CSV.sha256
    assert csv_path.stat().st_size == dl.HIERARCAPS_CSV.size_bytes


def _hierarcaps_1k_server(base: str, state: ServerState, names: list[str]) -> bytes:
    """Serve a 3-row HierarCaps CSV (its image URLs on the local server), the 3 images and a COCO 2014
    annotations zip whose captions_val2014.json also holds an image outside the CSV; return the zip."""
    for i, name in enumerate(names):
        buffer = io.BytesIO()
        Image.new("RGB", (8, 8), (0, i * 60, 0)).save(buffer, format="JPEG")
        state.files[name] = buffer.getvalue()
    rows = "".join(f'{i},"a => b => c => photo {i}",{base}/range/{name}\n' for i, name in enumerate(names))
    state.files["hierarcaps_test.csv"] = ("id,captions,image_url\n" + rows).encode("utf-8")
    ids = [int(name[-10:-4]) for name in names] + [999]
    annotations = [{"id": 100 + k, "image_id": image_id, "caption": f" caption {k} of {image_id}. "}
                   for k, image_id in enumerate(ids + ids[:2])]  # two captions for the first two images
    captions = {"images": [{"id": i, "file_name": f"COCO_val2014_{i:012d}.jpg"} for i in ids],
                "annotations": annotations}
    state.files["annotations_trainval2014.zip"] = make_zip({
        "annotations/captions_val2014.json": json.dumps(captions).encode("utf-8"),
        "annotations/instances_val2014.json": b"{}"})
    return state.files["annotations_trainval2014.zip"]


def test_hierarcaps_1k_fetches_the_profiles_layout(server: tuple[str, ServerState], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """`hierarcaps-1k` against a local server writes what params/hierarcaps.yaml reads: the CSV, test_imgs/ with
    every image it names, and coco_captions_hc1k.json with COCO's captions of those images only. A second run
    requests nothing (files present and verified); a deleted image is fetched again alone; a half-downloaded
    annotations zip is resumed from its .part file."""
    base, state = server
    names = [f"COCO_val2014_{i:012d}.jpg" for i in (139, 776, 785)]
    _hierarcaps_1k_server(base, state, names)
    real = NAMED_DOWNLOADS["hierarcaps-1k"]
    csv_file = dataclasses.replace(dl.HIERARCAPS_CSV, url=f"{base}/range/hierarcaps_test.csv",
                                   sha256=hashlib.sha256(state.files["hierarcaps_test.csv"]).hexdigest(),
                                   size_bytes=len(state.files["hierarcaps_test.csv"]))
    zip_file = dataclasses.replace(dl.COCO_ANNOTATIONS_2014, url=f"{base}/range/annotations_trainval2014.zip")
    monkeypatch.setitem(NAMED_DOWNLOADS, "hierarcaps-1k", dataclasses.replace(real, files=(csv_file, zip_file)))
    dest = tmp_path / "data" / "hierarcaps"
    zip_bytes = state.files["annotations_trainval2014.zip"]
    dest.mkdir(parents=True)
    half = len(zip_bytes) // 2
    (dest / "annotations_trainval2014.zip.part").write_bytes(zip_bytes[:half])  # an interrupted earlier run

    outputs = download_named("hierarcaps-1k", dest, progress=False)
    assert outputs == [dest / "hierarcaps_test.csv", dest / "test_imgs", dest / "coco_captions_hc1k.json"]
    assert ("/range/annotations_trainval2014.zip", f"bytes={half}-") in state.requests
    assert (dest / "annotations_trainval2014.zip").read_bytes() == zip_bytes
    assert sorted(p.name for p in (dest / "test_imgs").iterdir()) == names
    assert all((dest / "test_imgs" / n).read_bytes() == state.files[n] for n in names)
    captions = json.loads((dest / "coco_captions_hc1k.json").read_text(encoding="utf-8"))
    assert captions["images"] == [{"id": i, "file_name": n} for i, n in zip((139, 776, 785), names)]
    assert [(a["id"], a["image_id"], a["caption"]) for a in captions["annotations"]] == [
        (100, 139, "caption 0 of 139."), (104, 139, "caption 4 of 139."), (101, 776, "caption 1 of 776."),
        (105, 776, "caption 5 of 776."), (102, 785, "caption 2 of 785.")]

    state.requests.clear()
    assert download_named("hierarcaps-1k", dest, progress=False) == outputs
    assert state.requests == []
    (dest / "test_imgs" / names[1]).unlink()
    download_named("hierarcaps-1k", dest, progress=False)
    assert [path for path, _ in state.requests] == [f"/range/{names[1]}"]

    # the profile reads this layout: its data paths, pointed at this folder, all exist
    params = load_params(REPO_ROOT / "params" / "hierarcaps.yaml", overrides=hierarcaps_data(dest))
    assert params.data.coco_images == dest / "test_imgs"


def test_hierarcaps_1k_captions_must_cover_every_image(tmp_path: Path) -> None:
    """An annotations zip without captions for an image of the CSV (the wrong year's zip, say) is an error that
    names the image and the fix; a zip without captions_val2014.json says to download it again."""
    csv_path = tmp_path / "hc.csv"
    csv_path.write_text("id,captions,image_url\n0,a => b => c => d,http://x/val2014/COCO_val2014_000000000139.jpg\n",
                        encoding="utf-8")
    (tmp_path / "other.zip").write_bytes(make_zip({"annotations/captions_val2014.json": json.dumps(
        {"images": [], "annotations": [{"id": 1, "image_id": 5, "caption": "x"}]}).encode("utf-8")}))
    with pytest.raises(ValueError, match="no caption for 1 of the 1 images .*COCO_val2014_000000000139.jpg.*2014"):
        dl.hierarcaps_captions(csv_path, tmp_path / "other.zip", tmp_path / "out.json")
    (tmp_path / "empty.zip").write_bytes(make_zip({"annotations/instances_val2014.json": b"{}"}))
    with pytest.raises(ValueError, match="cannot read annotations/captions_val2014.json .*download it again"):
        dl.hierarcaps_captions(csv_path, tmp_path / "empty.zip", tmp_path / "out.json")
    assert not (tmp_path / "out.json").exists()


# ------------------------------------------------------------------------------ bad archives, mirrors, the CLI
GOOD_ARCHIVE = make_zip({"annotations/captions_train2017.json": b'{"images": []}',
                         "annotations/captions_val2017.json": b'{"images": []}'})
BAD_ARCHIVES = {  # served name -> what the one line must say
    "truncated.zip": "truncated: a zip archive cut before its end",
    "page.zip": "not a zip archive: it is an HTML page",
    "wrong.zip": "a zip without the member annotations/captions_train2017.json",
    "tampered.zip": "sha256 mismatch: expected",
}


@pytest.fixture
def archives(server: tuple[str, ServerState], monkeypatch: pytest.MonkeyPatch) -> tuple[str, ServerState]:
    """`coco-annotations` pinned to the local good archive's size and sha256 (its URL a path the server does not
    serve, so only a mirror reaches it), and the server holding the good archive and four bad ones."""
    base, state = server
    state.files.update({
        "good.zip": GOOD_ARCHIVE,
        "truncated.zip": GOOD_ARCHIVE[: len(GOOD_ARCHIVE) // 2],
        "page.zip": b"<!DOCTYPE html>\n<html><body>Please sign in to continue</body></html>\n",
        "wrong.zip": make_zip({"annotations/instances_train2017.json": b"{}"}),
        # the right members and size, other bytes: only the checksum tells
        "tampered.zip": GOOD_ARCHIVE.replace(b'{"images": []}', b'{"images": {}}'),
    })
    assert len(state.files["tampered.zip"]) == len(GOOD_ARCHIVE) != state.files["tampered.zip"]
    real = NAMED_DOWNLOADS["coco-annotations"]
    pinned = dataclasses.replace(dl.COCO_ANNOTATIONS, url=f"{base}/range/gone/annotations_trainval2017.zip",
                                 md5=None, sha256=hashlib.sha256(GOOD_ARCHIVE).hexdigest(),
                                 size_bytes=len(GOOD_ARCHIVE))
    monkeypatch.setitem(NAMED_DOWNLOADS, "coco-annotations", dataclasses.replace(real, files=(pinned,)))
    monkeypatch.delenv("CGLIB_URL_COCO_ANNOTATIONS_2017", raising=False)
    return base, state


def _download_cli(args: list[str], capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    from cglib.cli import main as cli_main

    code = cli_main(["download", *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_each_bad_archive_is_one_line_exit_1_and_nothing_left(archives, tmp_path: Path, capsys) -> None:
    """`cglib download` from a mirror serving a truncated zip, an HTML page, a zip without the captions and a
    zip whose bytes differ: exit 1, one line saying which, no traceback, no file left behind; then the good
    archive from the same folder succeeds (a rerun fetches again instead of trusting the bad file)."""
    base, state = archives
    dest = tmp_path / "coco"
    for name, what in BAD_ARCHIVES.items():
        code, out, err = _download_cli(["coco-annotations", "--dest", str(dest), "--url",
                                        f"coco-annotations-2017={base}/range/{name}"], capsys)
        assert code == 1 and out == "", name
        last = err.rstrip("\n").rsplit("\n", 1)[-1]  # before it: the progress bar, on stderr
        assert err.count("error:") == 1 and last.startswith(f"error: {base}/range/{name}: {what}"), err
        assert "the download was deleted" in err and "Traceback" not in err
        assert list(dest.iterdir()) == [], name  # neither the file nor a .part
    code, out, err = _download_cli(["coco-annotations", "--dest", str(dest), "--url",
                                    f"coco-annotations-2017={base}/range/good.zip"], capsys)
    assert code == 0, err
    assert out.splitlines() == [str(dest / "annotations/captions_train2017.json"),
                                str(dest / "annotations/captions_val2017.json")]
    assert (dest / "annotations_trainval2017.zip").read_bytes() == GOOD_ARCHIVE
    assert [path for path, _ in state.requests] == [f"/range/{n}" for n in [*BAD_ARCHIVES, "good.zip"]]


def test_a_mirror_from_the_environment_and_an_offline_copy(archives, tmp_path: Path, capsys,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """CGLIB_URL_<SOURCE> replaces a source's URL; --url overrides it; a local path is an offline copy, verified
    as a download; a --url naming a source the download does not fetch is exit 2 naming its sources."""
    base, state = archives
    monkeypatch.setenv("CGLIB_URL_COCO_ANNOTATIONS_2017", f"{base}/range/good.zip")
    code, _, err = _download_cli(["coco-annotations", "--dest", str(tmp_path / "a")], capsys)
    assert code == 0 and state.requests == [("/range/good.zip", None)], err
    offline = tmp_path / "copy" / "annotations_trainval2017.zip"
    offline.parent.mkdir()
    offline.write_bytes(state.files["wrong.zip"])
    code, _, err = _download_cli(["coco-annotations", "--dest", str(tmp_path / "b"), "--url",
                                  f"coco-annotations-2017={offline}"], capsys)
    assert code == 1 and "a zip without the member annotations/captions_train2017.json" in err
    assert offline.is_file() and list((tmp_path / "b").iterdir()) == []  # the copy is the user's: kept
    offline.write_bytes(GOOD_ARCHIVE)
    code, _, err = _download_cli(["coco-annotations", "--dest", str(tmp_path / "b"), "--url",
                                  f"coco-annotations-2017=file://{offline}"], capsys)
    assert code == 0 and len(state.requests) == 1, err
    code, _, err = _download_cli(["coco-annotations", "--dest", str(tmp_path / "c"), "--url",
                                  f"coco-train2017={base}/x.zip"], capsys)
    assert code == 2 and "coco-annotations fetches no source 'coco-train2017'; its sources are " \
        "coco-annotations-2017" in err


def test_a_bad_file_already_in_place_is_fetched_again(archives, tmp_path: Path, capsys) -> None:
    """A file under its final name that fails its check (an HTML page saved by hand, say) is not trusted as
    present: it is deleted and fetched again."""
    base, state = archives
    dest = tmp_path / "coco"
    dest.mkdir()
    (dest / "annotations_trainval2017.zip").write_bytes(state.files["page.zip"])
    code, _, err = _download_cli(["coco-annotations", "--dest", str(dest), "--url",
                                  f"coco-annotations-2017={base}/range/good.zip"], capsys)
    assert code == 0 and (dest / "annotations_trainval2017.zip").read_bytes() == GOOD_ARCHIVE, err


def test_an_html_page_instead_of_an_image_is_refetched(server: tuple[str, ServerState], tmp_path: Path) -> None:
    """A HierarCaps image that is an HTML page (a proxy's) is an error naming it, and is not kept; a mirror of the
    images' folder (base_url) is where they are fetched from."""
    base, state = server
    buffer = io.BytesIO()
    Image.new("RGB", (8, 8), (9, 9, 9)).save(buffer, format="JPEG")
    state.files["COCO_val2014_000000000139.jpg"] = b"<html><body>blocked</body></html>"
    csv_path = tmp_path / "hc.csv"
    csv_path.write_text("id,captions,image_url\n0,a => b => c => d,http://images.example/val2014/"
                        "COCO_val2014_000000000139.jpg\n", encoding="utf-8")
    with pytest.raises(DownloadError, match="1 of 1 images failed .*not a JPEG image: it is an HTML page"):
        download_hierarcaps_images(csv_path, tmp_path / "imgs", progress=False, retries=0,
                                   base_url=f"{base}/range")
    assert list((tmp_path / "imgs").iterdir()) == []
    state.files["COCO_val2014_000000000139.jpg"] = buffer.getvalue()
    download_hierarcaps_images(csv_path, tmp_path / "imgs", progress=False, base_url=f"{base}/range/")
    assert (tmp_path / "imgs" / "COCO_val2014_000000000139.jpg").read_bytes() == buffer.getvalue()
