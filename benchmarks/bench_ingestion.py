"""Image checking while loading captions: the draft-mode check and its threads against a full decode.

Run: python benchmarks/bench_ingestion.py [DATA_DIR]  (default ../shared/data; needs hierarcaps/ in it).
Prints seconds for the 1,000 HierarCaps/COCO images and ratios against the full-decode baseline.
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from PIL import Image

from cglib.data.coco import image_problems, load_coco_captions
from cglib.data.dataset import check_image, open_image


def seconds(fn) -> float:
    """Best of three wall-clock runs (the first warms the page cache)."""
    times = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    data = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2] / "shared" / "data"
    hc = data / "hierarcaps"
    files = sorted((hc / "test_imgs").glob("*.jpg"))
    if not files:
        sys.exit(f"no images under {hc / 'test_imgs'}; pass the shared data folder as the first argument")
    base = seconds(lambda: [open_image(f) for f in files])
    rows = [
        ("open_image (full decode, baseline)", base),
        ("check_image (JPEG draft 1/8)", seconds(lambda: [check_image(f) for f in files])),
        ("image_problems (draft, threads)", seconds(lambda: image_problems(files))),
        ("load_coco_captions, check_images=True", seconds(lambda: load_coco_captions(
            hc / "coco_captions_hc1k.json", hc / "test_imgs"))),
        ("load_coco_captions, check_images=False", seconds(lambda: load_coco_captions(
            hc / "coco_captions_hc1k.json", hc / "test_imgs", check_images=False))),
    ]
    print(f"{len(files)} HierarCaps images (256x256 JPEG)")
    for name, s in rows:
        print(f"{name:42s} {s:7.3f} s   x{base / s:5.1f} vs baseline")

    with tempfile.TemporaryDirectory() as tmp:  # full COCO size: the draft check gains more
        big = [Path(tmp) / f"{i}.jpg" for i in range(200)]
        for i, path in enumerate(big):
            Image.open(files[i]).resize((640, 480)).save(path, quality=90)
        base = seconds(lambda: [open_image(f) for f in big])
        print(f"{len(big)} COCO-size images (640x480 JPEG, upscaled copies)")
        for name, s in (("open_image (full decode, baseline)", base),
                        ("check_image (JPEG draft 1/8)", seconds(lambda: [check_image(f) for f in big])),
                        ("image_problems (draft, threads)", seconds(lambda: image_problems(big)))):
            print(f"{name:42s} {s:7.3f} s   x{base / s:5.1f} vs baseline")


if __name__ == "__main__":
    main()
