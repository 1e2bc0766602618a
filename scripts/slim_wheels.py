"""Shrink the device machine's wheels (.whl/, from ../shared/tools/device-wheels.sh) so that they and the tree fit
in one call's 64 MiB: gradio's wheel loses the server-side-rendering Node app and the demo media, neither of which
the explorer serves (it runs without SSR; it has no media examples). python scripts/slim_wheels.py [.whl]"""

import sys
import zipfile
from pathlib import Path

UNUSED = ("gradio/templates/node/", "gradio/media_assets/")


def slim(wheel: Path) -> int:
    """Rewrite wheel without UNUSED, and its RECORD without their lines. Returns the bytes saved."""
    before = wheel.stat().st_size
    slimmed = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slimmed, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if item.filename.startswith(UNUSED):
                continue
            data = src.read(item)
            if item.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines(keepends=True)
                data = "".join(line for line in lines if not line.startswith(UNUSED)).encode()
            dst.writestr(item, data)
    slimmed.replace(wheel)
    return before - wheel.stat().st_size


if __name__ == "__main__":
    folder = Path(sys.argv[1] if len(sys.argv) > 1 else ".whl")
    for wheel in sorted(folder.glob("gradio-[0-9]*.whl")):
        print(f"{wheel.name}: {slim(wheel) / 1e6:.1f} MB less")
