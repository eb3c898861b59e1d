"""Rows still readable in a damaged LLM cache file, read page by page without SQLite's b-tree.

A cache file cut short (disk full, a copy interrupted), with a page overwritten (a disk error) or with its
header destroyed cannot be opened or queried by SQLite, yet most of its answers are intact on their pages.
SQLite stores a table's rows in the cells of its leaf pages (page type 13); each cell is a record: a header of
serial types, then the values (https://www.sqlite.org/fileformat.html, sections 1.6 and 2.1). This module reads
every page of the file, and of its write-ahead log, as such a leaf page, decodes the cells whose record has the
shape of a cache row (14 columns, text key and names, ok 0 or 1, token counts, a creation time) and keeps, per key,
the newest row. A damaged page gives nothing (its cells fail to decode or fail the shape check); the others
give all their rows. Rows longer than a page continue on overflow pages, which are followed when intact.
"""

from __future__ import annotations

import struct
from pathlib import Path

N_COLUMNS = 14  # cglib.llm.cache.COLUMNS
TABLE_LEAF = 13
PAGE_SIZES = (4096, 1024, 2048, 8192, 16384, 32768, 65536)  # 4096 is SQLite's default
WAL_HEADER, WAL_FRAME_HEADER = 32, 24


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """SQLite's variable-length integer at `pos`: (value, position after it)."""
    value = 0
    for i in range(9):
        if pos + i >= len(buf):
            raise ValueError("varint runs past the page")
        byte = buf[pos + i]
        if i == 8:
            return (value << 8) | byte, pos + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, pos + i + 1
    raise ValueError("bad varint")


def _values(record: bytes) -> list:
    """The column values of one record (ValueError when it is not a well-formed record)."""
    size, pos = _varint(record, 0)
    if size > len(record):
        raise ValueError("record header runs past the record")
    types = []
    while pos < size:
        kind, pos = _varint(record, pos)
        types.append(kind)
    body, values = size, []
    for kind in types:
        if kind in (0, 8, 9):
            values.append(None if kind == 0 else kind - 8)
            continue
        if kind in (10, 11):
            raise ValueError("reserved serial type")
        width = {1: 1, 2: 2, 3: 3, 4: 4, 5: 6, 6: 8, 7: 8}.get(kind, (kind - 12) // 2)
        chunk = record[body:body + width]
        if len(chunk) < width:
            raise ValueError("value runs past the record")
        body += width
        if kind == 7:
            values.append(struct.unpack(">d", chunk)[0])
        elif kind <= 6:
            values.append(int.from_bytes(chunk, "big", signed=True))
        elif kind % 2:
            values.append(chunk.decode("utf-8"))  # UnicodeDecodeError is a ValueError
        else:
            values.append(bytes(chunk))
    return values


def _looks_like_row(values: list) -> bool:
    """The shape of a row of cglib's `results` table (see cglib.llm.cache.SCHEMA)."""
    if len(values) != N_COLUMNS:
        return False
    key, kind, backend, model, _, ok, *_rest = values
    tin, tout, created = values[10], values[11], values[13]
    return (all(isinstance(v, str) and v for v in (key, kind, backend, model))
            and ok in (0, 1) and isinstance(tin, int) and isinstance(tout, int) and tin >= 0 and tout >= 0
            and isinstance(created, float | int) and created > 0)


def _payload(data: bytes, page: bytes, pos: int, size: int, page_size: int) -> bytes:
    """The whole payload of a cell whose local part starts at `pos`, following overflow pages in `data`."""
    usable = page_size
    max_local = usable - 35
    if size <= max_local:
        return page[pos:pos + size]
    min_local = (usable - 12) * 32 // 255 - 23
    local = min_local + (size - min_local) % (usable - 4)
    local = local if local <= max_local else min_local
    out = bytearray(page[pos:pos + local])
    (next_page,) = struct.unpack(">I", page[pos + local:pos + local + 4])
    seen = set()
    while len(out) < size:
        if next_page == 0 or next_page in seen:
            raise ValueError("overflow chain broken")
        seen.add(next_page)
        start = (next_page - 1) * page_size
        overflow = data[start:start + page_size]
        if len(overflow) < page_size:
            raise ValueError("overflow page missing")
        (next_page,) = struct.unpack(">I", overflow[:4])
        out += overflow[4:4 + min(usable - 4, size - len(out))]
    return bytes(out)


def _page_rows(data: bytes, page: bytes, header_at: int, page_size: int) -> list[list]:
    """Cache rows of one page read as a table leaf page (nothing when it is not one, or is damaged)."""
    if len(page) < header_at + 8 or page[header_at] != TABLE_LEAF:
        return []
    (cells,) = struct.unpack(">H", page[header_at + 3:header_at + 5])
    rows = []
    for i in range(cells):
        at = header_at + 8 + 2 * i
        if at + 2 > len(page):
            break
        (pos,) = struct.unpack(">H", page[at:at + 2])
        try:
            size, pos = _varint(page, pos)
            _, pos = _varint(page, pos)  # rowid
            values = _values(_payload(data, page, pos, size, page_size))
        except (ValueError, struct.error):
            continue  # a damaged cell: its row is lost, the page's other cells may still be sound
        if _looks_like_row(values):
            rows.append(values)
    return rows


def _pages(data: bytes, page_size: int, wal: bytes) -> list[tuple[bytes, int]]:
    """(page, header offset) of every page of the file, then of every frame of its write-ahead log."""
    pages = [(data[start:start + page_size], 100 if start == 0 else 0) for start in range(0, len(data), page_size)]
    frame = WAL_FRAME_HEADER + page_size
    for start in range(WAL_HEADER, len(wal) - frame + 1, frame):
        (number,) = struct.unpack(">I", wal[start:start + 4])
        pages.append((wal[start + WAL_FRAME_HEADER:start + frame], 100 if number == 1 else 0))
    return pages


def salvage_rows(path: Path) -> list[tuple]:
    """Every cache row still readable in the (damaged) file `path` and its `-wal` file, newest row per key,
    as tuples in cglib.llm.cache.COLUMNS order. The page size comes from the header when it is sane, else each
    usual size is tried and the one that reads the most rows wins."""
    data = Path(path).read_bytes()
    wal_path = Path(f"{path}-wal")
    wal = wal_path.read_bytes() if wal_path.is_file() else b""
    sizes = list(PAGE_SIZES)
    if len(data) >= 18:
        declared = struct.unpack(">H", data[16:18])[0]
        declared = 65536 if declared == 1 else declared
        if declared in sizes:
            sizes.remove(declared)
            sizes.insert(0, declared)
    best: dict[str, tuple] = {}
    for size in sizes:
        found: dict[str, tuple] = {}
        for page, header_at in _pages(data, size, wal):
            for values in _page_rows(data, page, header_at, size):
                old = found.get(values[0])
                if old is None or values[13] >= old[13]:  # the newest row of a key (INSERT OR REPLACE)
                    found[values[0]] = tuple(values)
        if len(found) > len(best):
            best = found
        if best and size == sizes[0]:
            break  # the declared (or default) page size read rows: other sizes would only misread pages
    return list(best.values())
