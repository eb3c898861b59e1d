"""Fetch the real data (COCO 2017 captions and images, HierarCaps) for users with internet access.

`download` is resumable (HTTP Range on a `.part` file, restarting when a server ignores Range), retries
dropped connections, and verifies the file under its temporary name before it renames it atomically, so a file
under its final name is always complete and checked: its size and checksums where they are pinned, and its
structure (`check`: a zip that opens and holds its members, a gzip that decompresses, a JPEG image). A file that
fails is deleted and the error (BadDownload) says in one line what was wrong: truncated, not a zip, a missing
member, a checksum mismatch. A file already in place is verified the same way and fetched again when it fails.
`download_named(name, dest, urls)` fetches one entry of `NAMED_DOWNLOADS` (what `cglib download NAME --dest DIR`
runs); each of its files comes from a source with a name (`RemoteFile.source`), whose URL a mirror or an offline
copy can replace: `urls` (`--url SOURCE=URL`) or the environment variable `CGLIB_URL_<SOURCE>` (upper case, `-`
as `_`). A URL may be a local path or `file://` URL (an offline copy), verified as a download is.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import time
import zipfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from cglib.data.verify import (
    DownloadError,
    file_problem,
    gzip_problem,
    jpeg_problem,
    zip_problem,
)
from cglib.frontend import tqdm  # tqdm.auto live, a text bar left at its final count headless

if TYPE_CHECKING:
    import httpx

logger = logging.getLogger(__name__)

USER_AGENT = "cglib-download/0.1"


class _Incomplete(Exception):
    """The body ended before Content-Length bytes arrived (retried, resuming from the .part file)."""


def _copy_local(url: str, part: Path) -> None:
    """An offline copy (a path or a file:// URL) copied to the temporary name, to be verified as a download."""
    source = Path(url.removeprefix("file://"))
    if not source.is_file():
        raise DownloadError(f"{source} not found: the offline copy named for this download does not exist")
    shutil.copyfile(source, part)


def _transfer(client: httpx.Client, url: str, part: Path, progress: bool, label: str) -> None:
    """One GET that appends to `part` from its current size (or rewrites it when Range is not honoured)."""
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Accept-Encoding": "identity"}  # offsets must count file bytes, not gzip-stream bytes
    if offset:
        headers["Range"] = f"bytes={offset}-"
    with client.stream("GET", url, headers=headers) as response:
        if response.status_code == 416 and offset:
            # Range beyond the end: the .part may already be complete ("bytes */SIZE"), otherwise restart.
            total = response.headers.get("Content-Range", "").rpartition("/")[2]
            if total.isdigit() and int(total) == offset:
                return
            part.unlink()
            raise _Incomplete(f"server rejected the resume offset {offset}; restarting")
        if response.status_code >= 400:
            retryable = response.status_code >= 500 or response.status_code in (408, 429)
            error = f"{url}: HTTP {response.status_code} {response.reason_phrase}"
            raise _Incomplete(error) if retryable else DownloadError(f"{error}; check the URL or your access")
        if response.status_code == 206:
            start = response.headers.get("Content-Range", "").removeprefix("bytes ").split("-")[0]
            if start != str(offset):
                part.unlink()
                got = response.headers.get("Content-Range")
                raise _Incomplete(f"server answered Range {offset} with Content-Range {got}")
            mode = "ab"
        else:  # 200: the server ignored Range, so the body is the whole file again
            if offset:
                logger.info("%s: server ignored the Range request; restarting from byte 0", label)
            offset, mode = 0, "wb"
        length = response.headers.get("Content-Length")
        expected = offset + int(length) if length and length.isdigit() else None
        with open(part, mode) as f, tqdm(total=expected, initial=offset, unit="B", unit_scale=True,
                                         unit_divisor=1024, desc=label, disable=not progress) as bar:
            # No chunk_size: a chunker would hold back up to a chunk that is lost when the connection drops.
            for block in response.iter_raw():
                f.write(block)
                bar.update(len(block))
        if expected is not None and part.stat().st_size != expected:
            raise _Incomplete(f"got {part.stat().st_size} of {expected} bytes")


def download(url: str, dest: str | Path, sha256: str | None = None, md5: str | None = None,
             progress: bool = True, retries: int = 3, timeout: float = 60.0, backoff_s: float = 1.0,
             size_bytes: int | None = None, check: Callable[[Path], str | None] | None = None) -> Path:
    """Download `url` to `dest` (a file, or a folder to keep the URL's file name); resumable and verified.

    Bytes go to `dest.part` and are renamed to `dest` only when complete and verified (`size_bytes`, the given
    checksums, then `check(path)`: None or what is wrong); a dropped connection is retried `retries` times, each
    resuming where it stopped. A file that fails verification is deleted (BadDownload, ChecksumError for a
    checksum). A file already at `dest` is verified the same way and fetched again when it fails. `url` may be a
    local path or a file:// URL (an offline copy): it is copied, then verified.
    """
    dest = Path(dest)
    if dest.is_dir():
        dest = dest / url.rstrip("/").rsplit("/", 1)[-1].split("?")[0]
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_file():
        found = file_problem(dest, size_bytes, sha256, md5, check)
        if found is None:
            logger.info("%s already present (verified)", dest)
            return dest
        logger.warning("%s exists but fails its check (%s); downloading it again", dest, found[1])
        dest.unlink()
    part = dest.with_name(dest.name + ".part")
    if "://" not in url or url.startswith("file://"):
        _copy_local(url, part)
    else:
        _fetch(url, part, dest.name, progress, retries, timeout, backoff_s)
    found = file_problem(part, size_bytes, sha256, md5, check)
    if found is not None:
        part.unlink()
        error, problem = found
        raise error(f"{url}: {problem}; the download was deleted (a damaged transfer, a changed file on the "
                    "server, or the wrong URL): run again, or check the URL")
    os.replace(part, dest)  # atomic: `dest` never names a partial or unverified file
    return dest


def _fetch(url: str, part: Path, label: str, progress: bool, retries: int, timeout: float, backoff_s: float) -> None:
    """GET `url` into `part`, resuming from its current size, retrying dropped connections."""
    import httpx  # lazy: httpx takes ~0.4 s to import; cglib --help and validate import this module

    with httpx.Client(follow_redirects=True, timeout=timeout, headers={"User-Agent": USER_AGENT}) as client:
        for attempt in range(retries + 1):
            try:
                _transfer(client, url, part, progress, label)
                return
            except (httpx.TransportError, _Incomplete) as exc:
                kept = part.stat().st_size if part.exists() else 0
                if attempt == retries:
                    raise DownloadError(f"{url}: failed after {retries + 1} attempts ({exc}); {kept} bytes "
                                        f"are kept in {part}, run again to resume") from None
                logger.warning("%s: attempt %d failed (%s); resuming from byte %d", url, attempt + 1, exc,
                               kept)
                time.sleep(backoff_s * 2**attempt)


def _extracted_marker(archive_name: str, dest_dir: Path) -> Path:
    return dest_dir / f".{archive_name}.extracted"


def extract_zip(archive: str | Path, dest_dir: str | Path, progress: bool = True) -> Path:
    """Extract a zip into `dest_dir` once (a marker file records it); refuse members outside the folder."""
    archive, dest_dir = Path(archive), Path(dest_dir)
    marker = _extracted_marker(archive.name, dest_dir)
    if marker.is_file():
        logger.info("%s already extracted into %s", archive.name, dest_dir)
        return dest_dir
    dest_dir.mkdir(parents=True, exist_ok=True)
    root = dest_dir.resolve()
    try:
        with zipfile.ZipFile(archive) as zf:
            members = zf.infolist()
            for member in members:
                target = (root / member.filename).resolve()
                if target != root and root not in target.parents:
                    raise ValueError(f"{archive}: member {member.filename!r} would be written outside "
                                     f"{dest_dir}; refusing to extract this archive")
            for member in tqdm(members, desc=f"extract {archive.name}", unit="file", disable=not progress):
                zf.extract(member, root)
    except zipfile.BadZipFile as exc:
        raise ValueError(f"{archive} is not a valid zip ({exc}); delete it and download it again") from None
    marker.write_text(f"{archive.stat().st_size}\n", encoding="utf-8")
    return dest_dir


def download_hierarcaps_images(csv_path: str | Path, dest_dir: str | Path, workers: int = 8,
                               progress: bool = True, retries: int = 3, backoff_s: float = 1.0,
                               base_url: str | None = None) -> Path:
    """Fetch every `image_url` of a HierarCaps CSV into `dest_dir`; each must be a whole JPEG image (files already
    there are kept when they are, fetched again when not). `base_url`: a mirror of the images' folder (each image
    is then fetched from `base_url/<file name>`)."""
    from cglib.data.hierarcaps import read_csv_rows  # lazy: numpy, PIL; cglib --help imports this module

    dest_dir = Path(dest_dir)
    dest_dir.mkdir(parents=True, exist_ok=True)
    urls = sorted({row["image_url"].strip() for row in read_csv_rows(Path(csv_path)) if row["image_url"]})
    if base_url:
        urls = [f"{base_url.rstrip('/')}/{url.rsplit('/', 1)[-1]}" for url in urls]

    def target(url: str) -> Path:
        return dest_dir / url.rsplit("/", 1)[-1]

    todo = [u for u in urls if not target(u).is_file() or jpeg_problem(target(u)) is not None]

    def fetch(url: str) -> str | None:
        try:
            download(url, target(url), progress=False, retries=retries, backoff_s=backoff_s, check=jpeg_problem)
        except DownloadError as exc:
            return str(exc)
        return None

    with ThreadPoolExecutor(max_workers=workers) as pool:
        errors = [e for e in tqdm(pool.map(fetch, todo), total=len(todo), desc="HierarCaps images",
                                  unit="image", disable=not progress) if e]
    if errors:
        raise DownloadError(f"{len(errors)} of {len(urls)} images failed (first: {errors[0]}); run again to "
                            "fetch the rest")
    logger.info("HierarCaps images: %d present in %s (%d downloaded now)", len(urls), dest_dir, len(todo))
    return dest_dir


COCO_VAL2014_CAPTIONS_MEMBER = "annotations/captions_val2014.json"


def hierarcaps_captions(csv_path: str | Path, annotations_zip: str | Path, out_json: str | Path) -> Path:
    """Write the COCO captions of the images a HierarCaps CSV names (COCO captions format: `images` with `id` and
    `file_name`, `annotations` with COCO's `id`, `image_id` and `caption`), read from `captions_val2014.json`
    inside COCO's 2014 annotations zip without extracting the rest. Raises when an image has no caption."""
    from cglib.data.hierarcaps import read_csv_rows  # lazy: numpy, PIL; cglib --help imports this module

    names = sorted({row["image_url"].strip().rsplit("/", 1)[-1] for row in read_csv_rows(Path(csv_path))
                    if row["image_url"].strip()})
    # COCO_val2014_000000301718.jpg -> 301718, the image id of COCO's annotations
    ids = {int(Path(name).stem.rsplit("_", 1)[-1]): name for name in names}
    try:
        with zipfile.ZipFile(annotations_zip) as zf, zf.open(COCO_VAL2014_CAPTIONS_MEMBER) as f:
            coco = json.load(f)
    except (zipfile.BadZipFile, KeyError) as exc:
        raise ValueError(f"{annotations_zip}: cannot read {COCO_VAL2014_CAPTIONS_MEMBER} ({exc}); delete the "
                         "file and download it again") from None
    annotations = sorted((a for a in coco["annotations"] if a["image_id"] in ids),
                         key=lambda a: (a["image_id"], a["id"]))
    uncaptioned = sorted(set(ids) - {a["image_id"] for a in annotations})
    if uncaptioned:
        raise ValueError(f"{annotations_zip}: no caption for {len(uncaptioned)} of the {len(ids)} images of "
                         f"{csv_path} (first: {ids[uncaptioned[0]]}); is it COCO's 2014 annotations zip?")
    out_json = Path(out_json)
    captions = {"info": {"description": f"COCO val2014 captions of the images of {Path(csv_path).name}"},
                "images": [{"id": i, "file_name": ids[i]} for i in sorted(ids)],
                "annotations": [{"id": a["id"], "image_id": a["image_id"], "caption": a["caption"].strip()}
                                for a in annotations]}
    part = out_json.with_name(out_json.name + ".part")
    part.write_text(json.dumps(captions), encoding="utf-8")
    os.replace(part, out_json)  # atomic, as every download: the final name is always a complete file
    logger.info("%s: %d captions of %d images", out_json, len(annotations), len(ids))
    return out_json


COCO_VAL2014_IMAGES = "coco-val2014-images"  # the source of the HierarCaps CSV's image URLs


def _hierarcaps_images(dest: Path, progress: bool, urls: dict[str, str]) -> None:
    """The last step of `cglib download hierarcaps-images`: the CSV's images."""
    download_hierarcaps_images(dest / "hierarcaps_test.csv", dest / "test_imgs", progress=progress,
                               base_url=urls.get(COCO_VAL2014_IMAGES))


def _hierarcaps_1k(dest: Path, progress: bool, urls: dict[str, str]) -> None:
    """The last step of `cglib download hierarcaps-1k`: the CSV's images, then their COCO captions."""
    _hierarcaps_images(dest, progress, urls)
    hierarcaps_captions(dest / "hierarcaps_test.csv", dest / COCO_ANNOTATIONS_2014.file_name,
                        dest / "coco_captions_hc1k.json")


@dataclass(frozen=True)
class RemoteFile:
    """A file to fetch: the name of its source (what `--url SOURCE=URL` and `CGLIB_URL_<SOURCE>` replace), its
    URL, its name in the destination folder, its pinned size and checksums (None: not known here), an estimate of
    its size for the free-space warning, whether to unzip it, and what it must be: `kind` zip (holding
    `members`, a file or a folder each) or gzip, checked before it is moved into place."""

    source: str
    url: str
    file_name: str
    md5: str | None = None
    sha256: str | None = None
    size_bytes: int | None = None
    about_bytes: int | None = None
    extract: bool = False
    kind: str | None = None
    members: tuple[str, ...] = ()

    def check(self) -> Callable[[Path], str | None] | None:
        """The structural check of this file (None: only its size and checksums are verified)."""
        if self.kind == "zip":
            return functools.partial(zip_problem, members=self.members)
        if self.kind == "gzip":
            return gzip_problem
        return None


@dataclass(frozen=True)
class NamedDownload:
    """One `cglib download NAME`: the files, what to return (relative to dest), an optional last step and the
    sources it fetches from (besides the files')."""

    description: str
    files: tuple[RemoteFile, ...]
    outputs: tuple[str, ...]
    then: Callable[[Path, bool, dict[str, str]], object] | None = None  # then(dest, progress, mirror urls)
    then_sources: tuple[str, ...] = ()

    def sources(self) -> list[str]:
        return [f.source for f in self.files] + list(self.then_sources)


COCO_ANNOTATIONS = RemoteFile(
    "coco-annotations-2017", "http://images.cocodataset.org/annotations/annotations_trainval2017.zip",
    "annotations_trainval2017.zip", md5="f4bbac642086de4f52a3fdda2de5fa2c", size_bytes=252_907_541, extract=True,
    kind="zip", members=("annotations/captions_train2017.json", "annotations/captions_val2017.json"))
COCO_TRAIN_IMAGES = RemoteFile(
    "coco-train2017", "http://images.cocodataset.org/zips/train2017.zip", "train2017.zip",
    md5="cced6f7f71b7629ddf16f17bbcfab6b2", size_bytes=19_336_861_798, extract=True, kind="zip",
    members=("train2017",))
COCO_VAL_IMAGES = RemoteFile(
    "coco-val2017", "http://images.cocodataset.org/zips/val2017.zip", "val2017.zip",
    md5="442b8da7639aecaf257c1dceb8ba8c80", size_bytes=815_585_330, extract=True, kind="zip", members=("val2017",))
COCO_VAL2014_CAPTIONS_MEMBER = "annotations/captions_val2014.json"
# HierarCaps' test images are COCO val2014 photos, so their captions are in COCO's 2014 annotations. COCO publishes
# no checksum and none has been recorded here yet: the zip is checked by its structure (it must hold
# captions_val2014.json), and its size is an estimate for the free-space warning only.
COCO_ANNOTATIONS_2014 = RemoteFile(
    "coco-annotations-2014", "http://images.cocodataset.org/annotations/annotations_trainval2014.zip",
    "annotations_trainval2014.zip", about_bytes=252_000_000, kind="zip", members=(COCO_VAL2014_CAPTIONS_MEMBER,))
# Pinned to a commit of the authors' repository (github.com/TAU-VAILab/hierarcaps, formerly
# morrisalp/hierarcaps); the sha256 is that of the 1,000-row test CSV published there.
HIERARCAPS_COMMIT = "8a28b2e5124b68827bb1486c6d307fa22f0015e2"
HIERARCAPS_CSV = RemoteFile(
    "hierarcaps-test-csv",
    f"https://raw.githubusercontent.com/TAU-VAILab/hierarcaps/{HIERARCAPS_COMMIT}/data/hierarcaps_test.csv",
    "hierarcaps_test.csv", sha256="3474564194fd2a85e1d8f4dbe6e040c795e94677b2982cfb161b14908cae33b0",
    size_bytes=196_471)
# The ~70k train hierarchies of the Radial Embedding objective (cglib.radial), from the authors' Hugging Face
# dataset repo. No checksum is published and none has been recorded here yet, so sha256/md5 stay None: the file is
# checked by its structure only (a gzip that decompresses to its end); `main` is not pinned to a revision either.
HIERARCAPS_TRAIN = RemoteFile(
    "hierarcaps-train", "https://huggingface.co/datasets/tau-vailab/HierarCaps/resolve/main/hierarcaps_train.csv.gz",
    "hierarcaps_train.csv.gz", kind="gzip")

NAMED_DOWNLOADS: dict[str, NamedDownload] = {
    "coco-annotations": NamedDownload(
        "COCO 2017 train/val annotations incl. captions (241 MiB zip)", (COCO_ANNOTATIONS,),
        ("annotations/captions_train2017.json", "annotations/captions_val2017.json")),
    "coco-images": NamedDownload(
        "COCO 2017 train and val images (18 GiB + 0.8 GiB zips; about twice that on disk while extracting)",
        (COCO_TRAIN_IMAGES, COCO_VAL_IMAGES), ("train2017", "val2017")),
    "coco-val-images": NamedDownload(
        "COCO 2017 val images only (0.8 GiB zip)", (COCO_VAL_IMAGES,), ("val2017",)),
    "hierarcaps": NamedDownload(
        "HierarCaps 1K test CSV (192 KiB)", (HIERARCAPS_CSV,), ("hierarcaps_test.csv",)),
    "hierarcaps-images": NamedDownload(
        "HierarCaps CSV and its 1,000 COCO val2014 images from images.cocodataset.org (about 160 MiB)",
        (HIERARCAPS_CSV,), ("hierarcaps_test.csv", "test_imgs"), then=_hierarcaps_images,
        then_sources=(COCO_VAL2014_IMAGES,)),
    "hierarcaps-1k": NamedDownload(
        "the hierarcaps profile's data: the HierarCaps 1K test CSV, its 1,000 COCO val2014 images (about 160 "
        "MiB) and their COCO captions (from COCO's 2014 annotations zip, 241 MiB, kept for resuming)",
        (HIERARCAPS_CSV, COCO_ANNOTATIONS_2014), ("hierarcaps_test.csv", "test_imgs", "coco_captions_hc1k.json"),
        then=_hierarcaps_1k, then_sources=(COCO_VAL2014_IMAGES,)),
    "hierarcaps-train": NamedDownload(
        "HierarCaps train hierarchies for the RE baseline (gzip CSV from the authors' Hugging Face dataset, "
        "no checksum)", (HIERARCAPS_TRAIN,), ("hierarcaps_train.csv.gz",)),
}


def url_variable(source: str) -> str:
    """The environment variable that replaces a source's URL: `CGLIB_URL_<SOURCE>`, upper case, `-` as `_`."""
    return "CGLIB_URL_" + source.upper().replace("-", "_")


def mirror_urls(name: str, urls: dict[str, str] | None = None) -> dict[str, str]:
    """The URLs that replace the sources of download `name`: `urls` (`--url SOURCE=URL`) first, then the
    environment's `CGLIB_URL_<SOURCE>`; a source the download does not fetch from is an error naming those it
    does."""
    sources = NAMED_DOWNLOADS[name].sources()
    unknown = sorted(set(urls or {}) - set(sources))
    if unknown:
        raise ValueError(f"--url {unknown[0]}=...: {name} fetches no source {unknown[0]!r}; its sources are "
                         f"{', '.join(sources)}")
    found = {s: os.environ[url_variable(s)] for s in sources if os.environ.get(url_variable(s))}
    return {**found, **(urls or {})}


def download_named(name: str, dest: str | Path, progress: bool = True, remove_archives: bool = False,
                   urls: dict[str, str] | None = None) -> list[Path]:
    """Fetch the named data set into `dest` (zips are extracted there) and return its main paths; `urls` replace
    the URLs of its sources (`mirror_urls`). Each file is verified before it is moved into place (BadDownload,
    the file deleted, when it fails)."""
    if name not in NAMED_DOWNLOADS:
        raise ValueError(f"unknown download {name!r}; choose one of: {', '.join(NAMED_DOWNLOADS)}")
    entry, dest = NAMED_DOWNLOADS[name], Path(dest)
    mirrors = mirror_urls(name, urls)
    dest.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(dest).free
    sizes = [(f.size_bytes or f.about_bytes, f.extract) for f in entry.files]
    needed = sum(2 * size if extract else size for size, extract in sizes if size)
    if needed > free:
        logger.warning("%s needs about %.1f GiB in %s but only %.1f GiB are free", name, needed / 2**30, dest,
                       free / 2**30)
    for remote in entry.files:
        if remote.extract and _extracted_marker(remote.file_name, dest).is_file():
            logger.info("%s already downloaded and extracted into %s", remote.file_name, dest)
            continue
        url = mirrors.get(remote.source, remote.url)
        if url != remote.url:
            logger.info("%s: from %s (instead of %s)", remote.source, url, remote.url)
        path = download(url, dest / remote.file_name, sha256=remote.sha256, md5=remote.md5, progress=progress,
                        size_bytes=remote.size_bytes, check=remote.check())
        if remote.extract:
            extract_zip(path, dest, progress=progress)
            if remove_archives:
                path.unlink()
    if entry.then is not None:
        entry.then(dest, progress, mirrors)
    outputs = [dest / out for out in entry.outputs]
    missing = [str(p) for p in outputs if not p.exists()]
    if missing:
        raise DownloadError(f"{name}: expected {missing[0]} after download and extraction, but it is "
                            "missing; the archive layout may have changed")
    return outputs
